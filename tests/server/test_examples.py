"""Example questions on the page come from a benchmark's train split, never the dev split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from agentflow.datasets import load_dataset  # noqa: E402
from agentflow.server.examples import ExampleQuestions  # noqa: E402


def test_spider_examples_come_from_train_only(spider_dir: Path) -> None:
    train = [{"db_id": "library", "question": "How many authors are there?",
              "query": "SELECT count(*) FROM author"}]
    (spider_dir / "train.json").write_text(json.dumps(train))
    dev = load_dataset(spider_dir, "dev")
    shown = ExampleQuestions().for_db(dev, "library")
    assert shown == ["How many authors are there?"]
    assert not set(shown) & {e.question for e in dev.examples}


def test_no_train_split_means_no_examples(spider_dir: Path) -> None:
    dev = load_dataset(spider_dir, "dev")
    assert ExampleQuestions().for_db(dev, "library") == []


def test_the_demo_database_shows_its_own_questions() -> None:
    demo = load_dataset("demo")
    shown = ExampleQuestions().for_db(demo, "bookshop")
    assert shown and all(isinstance(q, str) for q in shown)
