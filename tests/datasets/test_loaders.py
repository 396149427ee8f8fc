from pathlib import Path

import pytest

from agentflow.datasets import load_bird, load_dataset, load_spider
from agentflow.sql import DatabaseNotFoundError


def test_bird_layout_is_loaded_with_evidence_difficulty_and_descriptions(bird_dir: Path) -> None:
    dataset = load_dataset(bird_dir)
    assert dataset.kind == "bird" and len(dataset) == 4
    ex = dataset.examples[1]
    assert ex.id == "1" and ex.db_id == "library"
    assert ex.evidence == "Italo Calvino refers to author.name"
    assert [e.difficulty for e in dataset.examples] == [
        "simple", "simple", "moderate", "challenging"]
    desc = dataset.database("library").descriptions
    assert desc["author"]["author_id"].column_description == "unique id of the author"
    assert desc["author"]["country"].value_description == "NULL if unknown"
    # cp1252-encoded file decoded, not mangled
    assert desc["book"]["price"].value_description == "café prices excluded"
    with dataset.open("library") as db:
        assert db.execute(ex.gold_sql).rows == [("Invisible Cities",)]


def test_spider_layout_is_loaded(spider_dir: Path) -> None:
    dataset = load_dataset(spider_dir)
    assert dataset.kind == "spider" and len(dataset) == 4
    assert dataset.examples[0].id == "dev_0" and dataset.examples[0].evidence == ""
    assert dataset.database("library").tables_json == {"db_id": "library"}


def test_unknown_database_names_close_matches(spider_dir: Path) -> None:
    dataset = load_spider(spider_dir)
    with pytest.raises(DatabaseNotFoundError, match="did you mean library"):
        dataset.open("librar")


def test_missing_split_and_unknown_layout_are_clear(tmp_path: Path, bird_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train"):
        load_bird(bird_dir, "train")
    with pytest.raises(FileNotFoundError, match="neither a Spider folder"):
        load_dataset(tmp_path)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_dataset(tmp_path / "nope")


def test_duckdb_copy_is_made_on_demand(spider_dir: Path, tmp_path: Path) -> None:
    dataset = load_spider(spider_dir)
    target = tmp_path / "duck"
    with pytest.raises(DatabaseNotFoundError, match="to-duckdb"):
        dataset.open("library", engine="duckdb", duckdb_dir=target, convert=False)
    with dataset.open("library", engine="duckdb", duckdb_dir=target) as db:
        assert db.kind == "duckdb"
        assert db.execute(dataset.examples[0].gold_sql).rows == [(4,)]
    assert (target / "library" / "library.duckdb").is_file()


def test_shared_spider_dev_and_train(shared_spider: Path) -> None:
    dev = load_spider(shared_spider, "dev")
    assert len(dev) == 972
    assert len({e.db_id for e in dev.examples}) >= 19
    train = load_spider(shared_spider, "train")
    assert len(train) == 5869
    assert not {e.db_id for e in train.examples} & {e.db_id for e in dev.examples}
