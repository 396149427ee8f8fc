"""Helpers for the SQL tests: real database files built from a few statements, and the
watchdog's interrupts and the parser's calls observed instead of timed."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path


def _insert(table: str, row: Sequence[object]) -> str:
    return f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})"


def sqlite_file(path: Path, *statements: str,
                rows: Mapping[str, Sequence[Sequence[object]]] | None = None) -> Path:
    """A real SQLite file at ``path``: ``statements`` run in order, then ``rows`` (table ->
    its rows) inserted with bound parameters. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    try:
        for statement in statements:
            con.execute(statement)
        for table, values in (rows or {}).items():
            if values:
                con.executemany(_insert(table, values[0]), values)
        con.commit()
    finally:
        con.close()
    return path


def duckdb_file(path: Path, *statements: str,
                rows: Mapping[str, Sequence[Sequence[object]]] | None = None) -> Path:
    """The same as :func:`sqlite_file`, as a DuckDB file."""
    import duckdb

    path.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(path))
    try:
        for statement in statements:
            con.execute(statement)
        for table, values in (rows or {}).items():
            if values:
                con.executemany(_insert(table, values[0]), values)
    finally:
        con.close()
    return path


def record_watchdog_fires(monkeypatch) -> list[str]:
    """Record each time the SQL watchdog interrupts a query (the engine kind it interrupted),
    so a timeout test can observe the interrupt instead of timing it on a loaded machine."""
    from agentflow.sql.database import _Interrupter

    fired: list[str] = []
    original = _Interrupter._fire

    def fire(self: _Interrupter) -> None:
        fired.append(self.kind)
        original(self)

    monkeypatch.setattr(_Interrupter, "_fire", fire)
    return fired


def record_parsing(monkeypatch) -> list[str]:
    """Record every sqlglot tokenize/parse/transpile call, so a test can show a statement was
    rejected before any parser ran (a counted step, not a stopwatch)."""
    import sqlglot
    from sqlglot.dialects.dialect import Dialect

    calls: list[str] = []
    for owner, name in ((Dialect, "tokenize"), (Dialect, "parse"), (sqlglot, "transpile"),
                        (sqlglot, "parse"), (sqlglot, "parse_one")):
        original = getattr(owner, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return calls
