"""BIRD in its official layout.

``<split>.json`` (question_id, db_id, question, evidence, SQL, difficulty),
``<split>_tables.json``, ``<split>_databases/<db>/<db>.sqlite`` and
``<split>_databases/<db>/database_description/<table>.csv``.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from agentflow.datasets.types import (
    ColumnDescription,
    DatabaseEntry,
    Dataset,
    Example,
    require_databases,
)

_DESCRIPTION_FIELDS = ("original_column_name", "column_name", "column_description",
                       "data_format", "value_description")


def is_bird_layout(root: Path, split: str = "dev") -> bool:
    return (root / f"{split}.json").is_file() and (root / f"{split}_databases").is_dir()


def load_bird(root: str | Path, split: str = "dev", *, name: str | None = None) -> Dataset:
    root = Path(root).expanduser().resolve()
    questions = root / f"{split}.json"
    db_dir = root / f"{split}_databases"
    if not questions.is_file() or not db_dir.is_dir():
        raise FileNotFoundError(f"BIRD split {split!r} not found: need {questions} and {db_dir}")
    tables_file = root / f"{split}_tables.json"
    tables = ({t["db_id"]: t for t in json.loads(tables_file.read_text())}
              if tables_file.is_file() else {})
    databases: dict[str, DatabaseEntry] = {}
    for sqlite_path in sorted(db_dir.glob("*/*.sqlite")):
        if sqlite_path.stem != sqlite_path.parent.name:
            continue
        db_id = sqlite_path.stem
        databases[db_id] = DatabaseEntry(
            db_id, sqlite_path, tables_json=tables.get(db_id),
            descriptions=load_descriptions(sqlite_path.parent / "database_description"))
    examples = [
        Example(id=str(item.get("question_id", i)), db_id=item["db_id"],
                question=item["question"], gold_sql=item.get("SQL") or item.get("query") or "",
                evidence=item.get("evidence") or "", difficulty=item.get("difficulty"))
        for i, item in enumerate(json.loads(questions.read_text()))
    ]
    require_databases(examples, databases, db_dir, split)
    return Dataset(name=name or root.name, kind="bird", root=root, split=split,
                   examples=examples, databases=databases)


def load_descriptions(folder: Path) -> dict[str, dict[str, ColumnDescription]]:
    """Read every ``<table>.csv``; BIRD ships them in mixed encodings, some with a BOM."""
    out: dict[str, dict[str, ColumnDescription]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.csv")):
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = raw.decode("cp1252", errors="replace")
        columns: dict[str, ColumnDescription] = {}
        for row in csv.DictReader(io.StringIO(text)):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in row.items()}
            original = row.get("original_column_name", "")
            if original:
                columns[original.lower()] = ColumnDescription(
                    **{f: row.get(f, "") for f in _DESCRIPTION_FIELDS})
        out[path.stem] = columns
    return out
