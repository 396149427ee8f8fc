"""Spider in its official layout.

``dev.json`` / ``train_spider.json`` + ``train_others.json`` (or a single ``train.json``) /
``test.json``; ``tables.json`` (``test_tables.json`` for test); ``database/<db>/<db>.sqlite``
(``test_database/`` for test).
"""

from __future__ import annotations

import json
from pathlib import Path

from agentflow.datasets.types import DatabaseEntry, Dataset, Example, require_databases


def is_spider_layout(root: Path) -> bool:
    return (root / "tables.json").is_file() and (root / "database").is_dir()


def _question_files(root: Path, split: str) -> list[Path]:
    if split == "train":
        official = [root / "train_spider.json", root / "train_others.json"]
        if all(p.is_file() for p in official):
            return official
        return [root / "train.json"]
    return [root / f"{split}.json"]


def load_spider(root: str | Path, split: str = "dev", *, name: str | None = None) -> Dataset:
    root = Path(root).expanduser().resolve()
    files = _question_files(root, split)
    missing = [p for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"Spider split {split!r} not found: {missing[0]} is missing")
    test = split == "test"
    tables_file = root / ("test_tables.json" if test and (root / "test_tables.json").is_file()
                          else "tables.json")
    db_dir = root / ("test_database" if test and (root / "test_database").is_dir() else "database")
    tables = {t["db_id"]: t for t in json.loads(tables_file.read_text())}
    databases: dict[str, DatabaseEntry] = {}
    for sqlite_path in sorted(db_dir.glob("*/*.sqlite")):
        if sqlite_path.stem == sqlite_path.parent.name:
            db_id = sqlite_path.stem
            databases[db_id] = DatabaseEntry(db_id, sqlite_path, tables_json=tables.get(db_id))
    examples: list[Example] = []
    for path in files:
        for item in json.loads(path.read_text()):
            examples.append(Example(
                id=f"{split}_{len(examples)}", db_id=item["db_id"], question=item["question"],
                gold_sql=item.get("query") or item.get("SQL") or "",
                evidence=item.get("evidence", ""), difficulty=item.get("difficulty")))
    require_databases(examples, databases, db_dir, split)
    return Dataset(name=name or root.name, kind="spider", root=root, split=split,
                   examples=examples, databases=databases)
