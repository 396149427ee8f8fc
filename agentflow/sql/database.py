"""Read-only access to one database: SQLite and DuckDB files, or any SQLAlchemy URL.

Safety comes from two independent layers: the connection itself is opened read-only (SQLite
``mode=ro``, DuckDB ``read_only`` with external file access disabled, PostgreSQL read-only
transactions), and every statement passes the sqlglot allow-list in ``guard`` first.
Timeouts interrupt the query inside the engine (SQLite progress handler, DuckDB ``interrupt``),
so a runaway query stops consuming CPU instead of being merely abandoned.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal
from urllib.parse import quote

import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from agentflow.sql import errors as E
from agentflow.sql.dialect import sqlglot_dialect, transpile
from agentflow.sql.guard import check_query

EngineKind = Literal["sqlite", "duckdb"]

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_ROWS = 10_000

# Pooled connections: opening a DuckDB file costs tens of milliseconds, far more than a
# typical benchmark query, so connections are kept and reused across queries.
_POOL_SIZE = 4
_POOL_OVERFLOW = 8

_SQLITE_SUFFIXES = {".sqlite", ".sqlite3", ".db"}
_DUCKDB_SUFFIXES = {".duckdb", ".ddb"}


@dataclass(frozen=True)
class QueryResult:
    """Rows of one query. ``truncated`` is true when the row cap cut the result short."""

    columns: list[str]
    rows: list[tuple]
    truncated: bool = False
    elapsed_s: float = 0.0
    sql: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"columns": self.columns, "rows": [list(r) for r in self.rows],
                "truncated": self.truncated, "elapsed_s": self.elapsed_s, "sql": self.sql}


@dataclass
class Database:
    """One read-only database. Create with ``Database.open``; safe to share across threads."""

    id: str
    engine: Engine
    kind: str  # "sqlite", "duckdb", or the SQLAlchemy dialect name for other URLs
    path: Path | None = None
    _schema_cache: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # ----------------------------------------------------------------------------- opening
    @classmethod
    def open(cls, target: str | Path, *, db_id: str | None = None,
             kind: EngineKind | None = None, duckdb_threads: int | None = None) -> "Database":
        """Open a SQLite/DuckDB file (kind from the suffix unless given) or a SQLAlchemy URL.

        ``duckdb_threads=1`` makes DuckDB results reproducible where SQL leaves them open
        (ties under ORDER BY ... LIMIT, GROUP BY output order): with several threads the hash
        aggregate's output order varies from run to run."""
        text = str(target)
        if "://" in text:
            return cls._open_url(text, db_id=db_id)
        path = Path(text).expanduser().resolve()
        if not path.is_file():
            raise E.DatabaseNotFoundError(f"database file not found: {path}")
        kind = kind or _kind_from_suffix(path)
        name = db_id or path.stem
        if kind == "sqlite":
            url = f"sqlite+pysqlite:///file:{quote(str(path))}?mode=ro&uri=true"
            engine = sa.create_engine(url, pool_size=_POOL_SIZE, max_overflow=_POOL_OVERFLOW,
                                      connect_args={"check_same_thread": False})
            # Some benchmark databases hold invalid UTF-8; decode leniently rather than fail.
            sa.event.listen(engine, "connect", _lenient_text)
        elif kind == "duckdb":
            engine = sa.create_engine(
                f"duckdb:///{path}", pool_size=_POOL_SIZE, max_overflow=_POOL_OVERFLOW,
                connect_args={"read_only": True,
                              "config": {"enable_external_access": False,
                                         **({"threads": duckdb_threads}
                                            if duckdb_threads else {})}})
        else:
            raise ValueError(f"unknown engine kind {kind!r}; expected 'sqlite' or 'duckdb'")
        return cls(id=name, engine=engine, kind=kind, path=path)

    @classmethod
    def _open_url(cls, url_text: str, *, db_id: str | None) -> "Database":
        url = make_url(url_text)
        backend = url.get_backend_name()
        if backend == "sqlite" and url.database and not url.database.startswith("file:"):
            return cls.open(url.database, db_id=db_id, kind="sqlite")
        if backend == "duckdb" and url.database and url.database != ":memory:":
            return cls.open(url.database, db_id=db_id, kind="duckdb")
        connect_args: dict[str, Any] = {}
        if backend == "postgresql":
            connect_args["options"] = "-c default_transaction_read_only=on"
        engine = sa.create_engine(url, connect_args=connect_args)
        return cls(id=db_id or (url.database or backend), engine=engine, kind=backend)

    @property
    def dialect(self) -> str:
        """The sqlglot dialect name of this database."""
        return sqlglot_dialect(self.kind)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- queries
    def execute(self, sql: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                max_rows: int | None = DEFAULT_MAX_ROWS, dialect: str | None = None) -> QueryResult:
        """Run one read-only query and return at most ``max_rows`` rows.

        ``dialect`` is the dialect ``sql`` is written in; it is transpiled to this database's
        dialect when they differ. Raises a subclass of ``SqlError`` on any failure.
        """
        if dialect and dialect != self.dialect:
            sql = transpile(sql, read=dialect, write=self.dialect)
        check_query(sql, self.dialect)
        start = time.monotonic()
        with self.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            interrupter = _Interrupter.for_kind(self.kind, raw, timeout_s)
            try:
                with interrupter:
                    cursor = conn.exec_driver_sql(sql)
                    columns = list(cursor.keys())
                    if max_rows is None:
                        rows = [tuple(r) for r in cursor.fetchall()]
                        truncated = False
                    else:
                        rows = [tuple(r) for r in cursor.fetchmany(max_rows + 1)]
                        truncated = len(rows) > max_rows
                        rows = rows[:max_rows]
                    cursor.close()
            except sa.exc.DBAPIError as err:
                if interrupter.fired:
                    raise E.QueryTimeoutError(
                        f"query exceeded the {timeout_s:g}s time limit and was interrupted",
                        sql=sql, limit_s=timeout_s) from err
                raise _translate(err.orig, sql) from err
            except Exception as err:  # drivers that raise outside the DBAPI hierarchy
                if interrupter.fired:
                    raise E.QueryTimeoutError(
                        f"query exceeded the {timeout_s:g}s time limit and was interrupted",
                        sql=sql, limit_s=timeout_s) from err
                if isinstance(err, E.SqlError):
                    raise
                raise _translate(err, sql) from err
            finally:
                conn.rollback()
        return QueryResult(columns=columns, rows=rows, truncated=truncated,
                           elapsed_s=time.monotonic() - start, sql=sql)

    def try_execute(self, sql: str, **kwargs: Any) -> QueryResult | E.SqlError:
        """Like ``execute`` but returns the error instead of raising it."""
        try:
            return self.execute(sql, **kwargs)
        except E.SqlError as err:
            return err

    # ----------------------------------------------------------------------------- schema
    def schema(self):
        """The introspected schema (cached; the database is read-only so it cannot change)."""
        from agentflow.sql.schema import introspect

        with self._lock:
            if self._schema_cache is None:
                self._schema_cache = introspect(self)
            return self._schema_cache

    def schema_prompt(self, **kwargs: Any) -> str:
        """Compact schema text for prompts; see ``agentflow.sql.schema.schema_prompt``."""
        from agentflow.sql.schema import schema_prompt

        return schema_prompt(self, **kwargs)


def _lenient_text(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.text_factory = lambda b: b.decode("utf-8", errors="replace")


def _kind_from_suffix(path: Path) -> EngineKind:
    suffix = path.suffix.lower()
    if suffix in _DUCKDB_SUFFIXES:
        return "duckdb"
    if suffix in _SQLITE_SUFFIXES:
        return "sqlite"
    with path.open("rb") as fh:
        head = fh.read(16)
    if head.startswith(b"SQLite format 3"):
        return "sqlite"
    raise ValueError(f"cannot tell the engine of {path}; pass kind='sqlite' or kind='duckdb'")


class _Interrupter:
    """Stops a running query after ``timeout_s`` inside the engine; a context manager."""

    def __init__(self, timeout_s: float | None):
        self.timeout_s = timeout_s
        self.fired = False

    @staticmethod
    def for_kind(kind: str, raw: Any, timeout_s: float | None) -> "_Interrupter":
        if timeout_s is None:
            return _Interrupter(None)
        if kind == "sqlite":
            return _SqliteProgressInterrupter(raw, timeout_s)
        if kind == "postgresql":
            return _PostgresStatementTimeout(raw, timeout_s)
        method = getattr(raw, "interrupt", None) or getattr(raw, "cancel", None)
        if method is None:
            raise E.ExecutionError(
                f"engine {kind!r} offers no way to interrupt a query; pass timeout_s=None "
                "to run without a time limit")
        return _TimerInterrupter(method, timeout_s)

    def __enter__(self) -> "_Interrupter":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _SqliteProgressInterrupter(_Interrupter):
    """SQLite calls the progress handler every N VM steps; a non-zero return aborts the query."""

    _STEPS = 1000

    def __init__(self, raw: Any, timeout_s: float):
        super().__init__(timeout_s)
        self._raw = raw
        self._deadline = 0.0

    def _check(self) -> int:
        if time.monotonic() > self._deadline:
            self.fired = True
            return 1
        return 0

    def __enter__(self) -> "_Interrupter":
        self._deadline = time.monotonic() + self.timeout_s
        self._raw.set_progress_handler(self._check, self._STEPS)
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.set_progress_handler(None, 0)


class _TimerInterrupter(_Interrupter):
    """Calls the driver's interrupt/cancel from a timer thread (DuckDB and the like)."""

    def __init__(self, interrupt: Callable[[], Any], timeout_s: float):
        super().__init__(timeout_s)
        self._interrupt = interrupt
        self._timer: threading.Timer | None = None

    def _fire(self) -> None:
        self.fired = True
        self._interrupt()

    def __enter__(self) -> "_Interrupter":
        self._timer = threading.Timer(self.timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _PostgresStatementTimeout(_Interrupter):
    """PostgreSQL cancels the statement itself once ``statement_timeout`` passes."""

    def __init__(self, raw: Any, timeout_s: float):
        super().__init__(timeout_s)
        self._raw = raw

    def __enter__(self) -> "_Interrupter":
        cur = self._raw.cursor()
        cur.execute(f"SET statement_timeout = {int(self.timeout_s * 1000)}")
        cur.close()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None and "statement timeout" in str(exc):
            self.fired = True


_PATTERNS: list[tuple[re.Pattern[str], Callable[[re.Match[str], str, str], E.SqlError]]] = [
    (re.compile(r"no such table: ([\w.]+)"),
     lambda m, msg, sql: E.UnknownTableError(f"unknown table {m.group(1)!r}", sql=sql,
                                             name=m.group(1))),
    (re.compile(r"Table with name (\S+) does not exist"),
     lambda m, msg, sql: E.UnknownTableError(f"unknown table {m.group(1)!r}", sql=sql,
                                             name=m.group(1))),
    (re.compile(r"no such column: ([\w.\"]+)"),
     lambda m, msg, sql: E.UnknownColumnError(f"unknown column {m.group(1)!r}", sql=sql,
                                              name=m.group(1))),
    (re.compile(r'Referenced column "?([^"\s]+)"? not found'),
     lambda m, msg, sql: E.UnknownColumnError(f"unknown column {m.group(1)!r}", sql=sql,
                                              name=m.group(1))),
    (re.compile(r'Referenced table "?([^"\s]+)"? not found'),
     lambda m, msg, sql: E.UnknownTableError(f"unknown table {m.group(1)!r}", sql=sql,
                                             name=m.group(1))),
    (re.compile(r"syntax error|incomplete input|Parser Error", re.I),
     lambda m, msg, sql: E.SqlSyntaxError(f"syntax error: {msg}", sql=sql)),
    (re.compile(r"readonly database|read-only mode|read only", re.I),
     lambda m, msg, sql: E.RejectedStatementError(f"the database is read-only: {msg}", sql=sql)),
]


def _translate(err: BaseException, sql: str) -> E.SqlError:
    """Map a driver exception to the typed error a caller can act on."""
    msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    for pattern, make in _PATTERNS:
        match = pattern.search(msg)
        if match:
            return make(match, msg, sql)
    return E.ExecutionError(msg, sql=sql)
