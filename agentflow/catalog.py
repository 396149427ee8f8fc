"""Which databases a running agentflow can answer questions about, by id.

The demo database is always there; ``data`` folders (Spider/BIRD layout) add theirs; a path to
a SQLite/DuckDB file works as an id too. Opened databases are kept (they are read-only and
thread-safe) so schema text and value indexes are built once.
"""

from __future__ import annotations

import difflib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow.datasets import Dataset, load_dataset
from agentflow.datasets.types import DatabaseEntry, EngineKind
from agentflow.sql import Database, DatabaseNotFoundError


@dataclass
class CatalogEntry:
    db_id: str
    dataset: Dataset | None
    entry: DatabaseEntry | None
    path: Path | None = None
    url: str | None = field(default=None, repr=False)  # never shown: may name a host and user
    options: dict[str, Any] = field(default_factory=dict, repr=False)


class DatabaseCatalog:
    def __init__(self, data: list[str] | None = None, *, include_demo: bool = True,
                 engine: EngineKind = "sqlite", databases: dict[str, Any] | None = None,
                 min_connections: int = 0):
        """``min_connections``: the least a PostgreSQL pool may hold at once (its overflow
        is raised to it): the database threads (``db_workers``) and two more, for
        introspection and prompt preparation outside them. Each thread holds one connection
        at a time, so a tenant at its share of the threads cannot take the whole pool: with
        16 threads and the default 4 + 4, one tenant's 8 ``pg_sleep`` did, and the others'
        statements waited for them."""
        self.engine = engine
        self.datasets: list[Dataset] = []
        self._entries: dict[str, CatalogEntry] = {}
        self._open: dict[str, Database] = {}
        self._roles: dict[tuple[str, str], Database] = {}
        self._lock = threading.Lock()
        if include_demo:
            self.add_dataset(load_dataset("demo"))
        for folder in data or []:
            self.add_dataset(load_dataset(folder))
        for name, cfg in (databases or {}).items():
            options = cfg.model_dump() if hasattr(cfg, "model_dump") else dict(cfg)
            url = options.pop("url")
            if url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres"):
                options["max_overflow"] = max(options.get("max_overflow", 4), min_connections
                                              - options.get("pool_size", 4))
            self._entries[name] = CatalogEntry(name, None, None, url=url, options=options)

    @classmethod
    def from_config(cls, config: Any) -> DatabaseCatalog:
        """The catalog an ``AgentFlowConfig`` describes: its benchmark folders (``data``),
        their engine, and its named databases."""
        return cls(config.data, engine=config.engine, databases=config.databases,
                   min_connections=config.db_workers + 2)

    def engine_of(self, db_id: str) -> str:
        """The engine a database id runs on ("postgresql" for a PostgreSQL entry)."""
        entry = self.entry(db_id)
        if entry.url:
            from sqlalchemy.engine import make_url

            return make_url(entry.url).get_backend_name()
        return self.engine

    def add_dataset(self, dataset: Dataset) -> None:
        self.datasets.append(dataset)
        for db_id, entry in dataset.databases.items():
            self._entries.setdefault(db_id, CatalogEntry(db_id, dataset, entry))

    @property
    def ids(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, db: str) -> CatalogEntry:
        if db in self._entries:
            return self._entries[db]
        if "://" in db:  # a database URL given directly (agentflow ask --db postgresql://...)
            from sqlalchemy.engine import make_url

            try:
                url = make_url(db)
            except Exception as err:  # noqa: BLE001 - never echo the URL: it may hold secrets
                raise DatabaseNotFoundError("not a valid database URL") from err
            return CatalogEntry(db_id=url.database or url.get_backend_name(), dataset=None,
                                entry=None, url=db)
        path = Path(db).expanduser()
        is_file_name = path.suffix.lower() in {".sqlite", ".sqlite3", ".db", ".duckdb"}
        if is_file_name and path.is_file():
            return CatalogEntry(db_id=path.stem, dataset=None, entry=None, path=path.resolve())
        if is_file_name or "/" in db:
            raise DatabaseNotFoundError(f"database file not found: {path}")
        raise DatabaseNotFoundError(self.unknown_message(db))

    def unknown_message(self, db: str, paths: bool = True) -> str:
        """Name the known databases (the first few) and say how to add more (``paths``:
        whether this caller may name a file instead, as local callers may)."""
        close = difflib.get_close_matches(db, self.ids, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        shown = ", ".join(self.ids[:8]) + (f" and {len(self.ids) - 8} more"
                                          if len(self.ids) > 8 else "")
        benchmarks = [d for d in self.datasets if d.kind != "demo"]
        how = ("if it is a Spider/BIRD database, add the benchmark's folder with --data DIR"
               if not benchmarks else "add another Spider/BIRD folder with --data DIR")
        tail = ", or pass a path to a .sqlite/.duckdb file" if paths else ""
        return f"unknown database {db!r}{hint} (known: {shown}); {how}{tail}"

    def table_names(self, db_id: str) -> list[str]:
        """From the benchmark's tables.json when there is one (no need to open hundreds of
        Spider files for a listing), else from the opened database's schema."""
        entry = self.entry(db_id)
        tables_json = entry.entry.tables_json if entry.entry else None
        names = (tables_json or {}).get("table_names_original")
        return list(names) if names else self.open(db_id).schema().table_names

    def open(self, db: str, role: str | Any = None) -> Database:
        """The opened database; with ``role`` (PostgreSQL only), a view of it whose SQL runs
        as that database role (``SET LOCAL ROLE`` per transaction on the shared pool), or,
        for a ``tenants.DatabaseLogin``, the database opened with that login (its own
        pool), so the server's row-level security decides which rows a tenant sees. Each
        role gets its own object, so nothing cached from one role's rows (schema samples,
        value indexes) reaches another."""
        entry = self.entry(db)
        key = entry.url or (str(entry.path) if entry.path else entry.db_id)
        with self._lock:
            if key not in self._open:
                if entry.url is not None:
                    self._open[key] = Database.open(entry.url, db_id=entry.db_id,
                                                    **entry.options)
                elif entry.path is not None:
                    self._open[key] = Database.open(entry.path, db_id=entry.db_id)
                else:
                    assert entry.dataset is not None  # an entry holds a path, options or both
                    self._open[key] = entry.dataset.open(entry.db_id, engine=self.engine)
            if role is None:
                return self._open[key]
            if isinstance(role, str):
                if (key, role) not in self._roles:
                    self._roles[(key, role)] = self._open[key].with_role(role)
                return self._roles[(key, role)]
            if self._open[key].kind != "postgresql":
                raise ValueError(f"database {entry.db_id!r}: a tenant's own login needs "
                                 "PostgreSQL")
            login_key = (key, "login:" + role.url)
            if login_key not in self._roles:
                options = {**entry.options, "password_env": role.password_env,
                           "passfile": role.passfile}
                self._roles[login_key] = Database.open(role.url, db_id=entry.db_id, **options)
            return self._roles[login_key]

    def close(self) -> None:
        with self._lock:
            for db in [*self._open.values(), *self._roles.values()]:
                db.close()  # a role view shares its pool: closing it again is harmless
            self._open.clear()
            self._roles.clear()
