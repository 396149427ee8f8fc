"""What a benchmark looks like once loaded, whatever its on-disk layout."""

from __future__ import annotations

import difflib
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from agentflow.sql import Database
from agentflow.sql.errors import DatabaseNotFoundError

EngineKind = Literal["sqlite", "duckdb", "postgres"]

# Where `agentflow datasets to-postgres` loaded benchmarks, when no URL is passed.
PG_URL_ENV = "AGENTFLOW_PG_URL"


@dataclass(frozen=True)
class Example:
    """One question with its gold SQL (SQLite dialect, as the benchmarks ship it)."""

    id: str
    db_id: str
    question: str
    gold_sql: str
    evidence: str = ""  # BIRD's external-knowledge hint; empty for Spider
    difficulty: str | None = None  # BIRD's label; Spider's hardness is derived later

    def to_dict(self) -> dict:
        return {"id": self.id, "db_id": self.db_id, "question": self.question,
                "gold_sql": self.gold_sql, "evidence": self.evidence,
                "difficulty": self.difficulty}


@dataclass(frozen=True)
class ColumnDescription:
    """A row of a BIRD ``database_description/<table>.csv``."""

    original_column_name: str
    column_name: str = ""
    column_description: str = ""
    data_format: str = ""
    value_description: str = ""


@dataclass
class DatabaseEntry:
    """One database of a benchmark: where its SQLite file is and what the benchmark says of it."""

    db_id: str
    sqlite_path: Path
    # tables.json entry (Spider format, also BIRD's dev_tables.json) when the benchmark has one.
    tables_json: dict | None = None
    # BIRD column descriptions: table name -> column name (lower-case) -> description.
    descriptions: dict[str, dict[str, ColumnDescription]] = field(default_factory=dict)


@dataclass
class Dataset:
    """A benchmark split: its questions and the databases they run against."""

    name: str
    kind: Literal["spider", "bird", "demo"]
    root: Path
    split: str
    examples: list[Example]
    databases: dict[str, DatabaseEntry]

    def __len__(self) -> int:
        return len(self.examples)

    def database(self, db_id: str) -> DatabaseEntry:
        try:
            return self.databases[db_id]
        except KeyError:
            close = difflib.get_close_matches(db_id, list(self.databases), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise DatabaseNotFoundError(
                f"unknown database {db_id!r} in {self.root} ({len(self.databases)} databases)"
                f"{hint}") from None

    def duckdb_path(self, db_id: str, duckdb_dir: Path | None = None) -> Path:
        """Where the DuckDB copy of ``db_id`` lives (made by ``to-duckdb``)."""
        self.database(db_id)
        base = Path(duckdb_dir) if duckdb_dir else default_duckdb_dir(self.root)
        return base / db_id / f"{db_id}.duckdb"

    def open(self, db_id: str, *, engine: EngineKind = "sqlite",
             duckdb_dir: Path | None = None, convert: bool = True,
             pg_url: str | None = None) -> Database:
        """Open one database read-only, on SQLite or on its DuckDB copy.

        With ``convert`` the DuckDB copy is made on first use when it is missing. DuckDB runs
        single-threaded here: benchmark databases are small, and evaluation needs the same
        answer every time (several gold queries leave ties to the engine).
        """
        entry = self.database(db_id)
        if engine == "sqlite":
            return Database.open(entry.sqlite_path, db_id=db_id, kind="sqlite")
        if engine == "postgres":
            from agentflow.datasets.to_postgres import schema_name

            url = pg_url or os.environ.get(PG_URL_ENV)
            if not url:
                raise ValueError(f"engine 'postgres' needs the URL of the database the "
                                 f"benchmark was loaded into (--pg-url or ${PG_URL_ENV}); see "
                                 "`agentflow datasets to-postgres`")
            return Database.open(url, db_id=db_id, search_path=[schema_name(db_id)],
                                 pool_size=2, max_overflow=2)
        if engine != "duckdb":
            raise ValueError(f"unknown engine {engine!r}; expected sqlite, duckdb or postgres")
        path = self.duckdb_path(db_id, duckdb_dir)
        if not path.exists():
            if not convert:
                raise DatabaseNotFoundError(
                    f"no DuckDB copy of {db_id!r} at {path}; run `agentflow datasets to-duckdb "
                    f"{self.root}` first")
            from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb

            convert_sqlite_to_duckdb(entry.sqlite_path, path)
        return Database.open(path, db_id=db_id, kind="duckdb", duckdb_threads=1)


def require_databases(examples: list[Example], databases: dict[str, DatabaseEntry],
                      db_dir: Path, split: str) -> None:
    """Fail at load time, naming them, if questions refer to databases the folder lacks."""
    unknown = sorted({e.db_id for e in examples} - set(databases))
    if unknown:
        raise FileNotFoundError(
            f"{len(unknown)} databases used by {split} questions are missing under {db_dir}: "
            f"{', '.join(unknown[:5])}")


def cache_dir() -> Path:
    """agentflow's cache root (``AGENTFLOW_CACHE`` or ``~/.cache/agentflow``)."""
    return Path(os.environ.get("AGENTFLOW_CACHE", Path.home() / ".cache" / "agentflow"))


def default_duckdb_dir(root: Path) -> Path:
    """A dataset folder may carry its DuckDB copies in ``duckdb/``; otherwise they are cached.

    The cache key includes the resolved path so two different folders never share copies.
    """
    root = Path(root).resolve()
    if (root / "duckdb").is_dir():
        return root / "duckdb"
    digest = hashlib.sha1(str(root).encode()).hexdigest()[:10]
    return cache_dir() / "duckdb" / f"{root.name}-{digest}"
