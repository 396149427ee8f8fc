"""What an evaluation runs: the dataset spec, the question sample, pipelines and policies."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agentflow.datasets import Dataset, Example

DATASET_KINDS = ("spider", "bird", "demo")


class EvalError(ValueError):
    """A bad argument or an output folder that does not fit the request; the message says
    what to change."""


@dataclass(frozen=True)
class DatasetSpec:
    kind: str  # spider | bird | demo
    root: str  # a folder, or "demo"
    split: str

    @property
    def label(self) -> str:
        return "demo" if self.kind == "demo" else f"{self.kind}:{self.root}:{self.split}"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "root": self.root, "split": self.split}


def parse_dataset_spec(spec: str) -> DatasetSpec:
    """``spider:DIR[:split]``, ``bird:DIR[:split]`` or ``demo[:split]`` (split defaults to dev)."""
    if not isinstance(spec, str) or not spec.strip():
        raise EvalError("--dataset is empty; use spider:DIR[:split], bird:DIR[:split] or demo")
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    if kind not in DATASET_KINDS:
        raise EvalError(f"--dataset {spec!r}: unknown kind {kind!r}; use spider:DIR[:split], "
                        "bird:DIR[:split] or demo")
    if kind == "demo":
        return DatasetSpec("demo", "demo", rest or "dev")
    if not rest:
        raise EvalError(f"--dataset {spec!r}: give the folder, e.g. {kind}:/data/{kind}[:dev]")
    root, split = rest, "dev"
    if not Path(rest).expanduser().is_dir() and ":" in rest:
        head, _, tail = rest.rpartition(":")
        if re.fullmatch(r"[A-Za-z0-9_.-]+", tail):
            root, split = head, tail
    path = Path(root).expanduser()
    if not path.is_dir():
        raise EvalError(f"--dataset {spec!r}: folder not found: {path}")
    return DatasetSpec(kind, str(path.resolve()), split)


def load_spec(spec: DatasetSpec) -> Dataset:
    from agentflow.datasets import load_dataset
    from agentflow.datasets.bird import is_bird_layout
    from agentflow.datasets.spider import is_spider_layout

    if spec.kind == "demo":
        return load_dataset("demo", spec.split)
    root = Path(spec.root)
    if spec.kind == "bird" and not is_bird_layout(root, spec.split):
        raise EvalError(f"{root} is not a BIRD folder with split {spec.split!r} "
                        f"(expected {spec.split}.json and {spec.split}_databases/)")
    if spec.kind == "spider" and not is_spider_layout(root):
        raise EvalError(f"{root} is not a Spider folder (expected tables.json and database/)")
    dataset = load_dataset(root, spec.split)
    if dataset.kind != spec.kind:
        raise EvalError(f"{root} is a {dataset.kind} folder, not {spec.kind}; "
                        f"use --dataset {dataset.kind}:{root}")
    return dataset


def sample_examples(dataset: Dataset, limit: int | None, seed: int) -> list[Example]:
    """A seeded sample of ``limit`` questions, in dataset order. Prefix-stable: a larger
    ``limit`` with the same seed holds every question of a smaller one (so resuming with a
    larger --limit only adds questions)."""
    n = len(dataset.examples)
    if limit is None or limit >= n:
        return list(dataset.examples)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return [dataset.examples[i] for i in sorted(order[:limit])]


def split_names(value: str | Sequence[str] | None, what: str) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [v.strip() for v in items if v and v.strip()]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise EvalError(f"{what} listed twice: {', '.join(dupes)}")
    return names


def check_pipelines(names: list[str]) -> None:
    from pipelines import pipeline_names

    known = pipeline_names()
    bad = [n for n in names if n not in known]
    if bad:
        raise EvalError(f"unknown pipeline {bad[0]!r}; choose from {', '.join(known)}")


def check_policies(names: list[str], *, simulated: bool) -> None:
    from agentflow.scheduler.policies import parse_policy

    for name in names:
        try:
            spec = parse_policy(name)
        except ValueError as err:
            raise EvalError(str(err)) from None
        if spec.simulation_only and not simulated:
            raise EvalError(f"policy {name!r} exists only in the simulator (its length model "
                            f"{spec.length_model!r} knows every call's length in advance); use it "
                            "with --cluster")


def run_key(pipeline: str, policy: str) -> str:
    """The name of one pipeline x policy run in file names (``chess__flowsage``)."""
    return f"{pipeline}__{re.sub(r'[^A-Za-z0-9_.+-]', '_', policy)}"
