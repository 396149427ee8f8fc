"""Open a benchmark folder whatever its layout (Spider or BIRD), or the built-in demo."""

from __future__ import annotations

from pathlib import Path

from agentflow.datasets.bird import is_bird_layout, load_bird
from agentflow.datasets.spider import is_spider_layout, load_spider
from agentflow.datasets.types import Dataset


def load_dataset(root: str | Path, split: str = "dev") -> Dataset:
    """Load ``root`` as Spider or BIRD, telling them apart by their files.

    ``root`` may also be ``demo``: the project's own database, built on first use.
    """
    if str(root) == "demo":
        from agentflow.datasets.demo import build_demo

        paths = build_demo()
        dataset = load_spider(paths.sqlite.parents[2], split, name="demo")
        dataset.kind = "demo"
        return dataset
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {path}")
    if is_bird_layout(path, split):
        return load_bird(path, split)
    if is_spider_layout(path):
        return load_spider(path, split)
    raise FileNotFoundError(
        f"{path} is neither a Spider folder (tables.json + database/) nor a BIRD folder "
        f"({split}.json + {split}_databases/)")
