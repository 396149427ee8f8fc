import hashlib
import time
from pathlib import Path

import pytest

from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb
from agentflow.sql import (
    Database,
    DatabaseNotFoundError,
    QueryTimeoutError,
    RejectedStatementError,
    SqlSyntaxError,
    UnknownColumnError,
    UnknownTableError,
)
from tests.sql.utils import record_watchdog_fires

FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


@pytest.fixture(params=["sqlite", "duckdb"])
def db_path(request, library_db: Path) -> Path:
    if request.param == "sqlite":
        return library_db
    return convert_sqlite_to_duckdb(library_db, library_db.with_suffix(".duckdb")).dst


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_select_returns_columns_and_rows(db_path: Path) -> None:
    with Database.open(db_path) as db:
        result = db.execute("SELECT title, year FROM book WHERE year > 1970 ORDER BY year")
    assert result.columns == ["title", "year"]
    assert result.rows == [("Invisible Cities", 1972), ("The Dispossessed", 1974),
                           ("The Hour of the Star", 1977)]
    assert not result.truncated


def test_row_cap_truncates_and_says_so(db_path: Path) -> None:
    with Database.open(db_path) as db:
        result = db.execute("SELECT * FROM book", max_rows=2)
    assert len(result.rows) == 2 and result.truncated


@pytest.mark.parametrize("sql", [
    "DROP TABLE book",
    "DELETE FROM book",
    "ATTACH DATABASE 'other.db' AS other",
    "SELECT 1; DELETE FROM book",
    "PRAGMA writable_schema = 1",
    "UPDATE book SET price = 0",
])
def test_writes_are_rejected_and_the_file_is_unchanged(db_path: Path, sql: str) -> None:
    before = sha256(db_path)
    with Database.open(db_path) as db:
        with pytest.raises(RejectedStatementError):
            db.execute(sql)
        assert db.execute("SELECT count(*) FROM book").rows == [(4,)]
    assert sha256(db_path) == before
    assert not (db_path.parent / "other.db").exists()


def test_the_connection_itself_is_read_only(db_path: Path) -> None:
    """Even a statement that bypasses the allow-list cannot write: the connection refuses."""
    before = sha256(db_path)
    db = Database.open(db_path)
    with db.engine.connect() as conn:
        with pytest.raises(Exception, match="(?i)read.?only"):
            conn.exec_driver_sql("DELETE FROM loan")
    db.close()
    assert sha256(db_path) == before


def test_runaway_query_is_interrupted_at_the_limit(db_path: Path, monkeypatch) -> None:
    """Observed, not timed: the query never ends by itself, the interrupt is what stopped it,
    and it did not come early (the wall-clock 2x bound is tests/sql/test_limits.py's slow
    check)."""
    limit = 1.0
    fired = record_watchdog_fires(monkeypatch)
    with Database.open(db_path) as db:
        start = time.monotonic()
        with pytest.raises(QueryTimeoutError) as info:
            db.execute(FOREVER, timeout_s=limit)
        elapsed = time.monotonic() - start
        assert info.value.limit_s == limit
        # The engine is free again: the next query runs normally.
        assert db.execute("SELECT count(*) FROM author").rows == [(3,)]
    assert len(fired) == 1 and elapsed >= limit


def test_typed_errors(db_path: Path) -> None:
    with Database.open(db_path) as db:
        with pytest.raises(UnknownTableError) as t:
            db.execute("SELECT * FROM books")
        assert t.value.name == "books"
        with pytest.raises(UnknownColumnError) as c:
            db.execute("SELECT titel FROM book")
        assert c.value.name == "titel"
        with pytest.raises(SqlSyntaxError) as s:
            db.execute("SELECT title FROM book WHERE")
        assert s.value.line == 1
        err = db.try_execute("SELECT titel FROM book")
        assert isinstance(err, UnknownColumnError) and err.to_dict()["kind"] == "unknown_column"


def test_sqlite_dialect_is_transpiled_for_duckdb(library_db: Path) -> None:
    duck = convert_sqlite_to_duckdb(library_db, library_db.with_suffix(".duckdb")).dst
    sql = "SELECT substr(title, 1, 3) || '!' FROM book WHERE book_id = 2"
    with Database.open(duck) as db:
        assert db.dialect == "duckdb"
        assert db.execute(sql, dialect="sqlite").rows == [("Inv!",)]


def test_unknown_files_and_urls(tmp_path: Path, library_db: Path) -> None:
    with pytest.raises(DatabaseNotFoundError):
        Database.open(tmp_path / "missing.sqlite")
    with Database.open(f"sqlite:///{library_db}") as db:
        assert db.kind == "sqlite" and db.execute("SELECT count(*) FROM loan").rows == [(4,)]
        with pytest.raises(RejectedStatementError):
            db.execute("DELETE FROM loan")


def test_schema_introspection_and_prompt(db_path: Path) -> None:
    with Database.open(db_path) as db:
        schema = db.schema()
        assert schema.table_names == ["author", "book", "loan"] or sorted(
            schema.table_names) == ["author", "book", "loan"]
        book = schema.table("book")
        assert book.column("book_id").primary_key
        assert [(fk.columns, fk.ref_table) for fk in book.foreign_keys] == [
            (("author_id",), "author")]
        prompt = db.schema_prompt()
        assert "CREATE TABLE book" in prompt
        assert "FOREIGN KEY (author_id) REFERENCES author(author_id)" in prompt
        assert "'Italo Calvino'" in prompt  # sample values help value mentions
        pruned = db.schema_prompt(tables={"book": ["title"], "author": None}, samples=0)
        assert "price" not in pruned and "loan" not in pruned
        assert "book_id" in pruned and "author_id" in pruned  # keys survive pruning


@pytest.mark.timeout(60)
def test_sqlite_stops_itself_at_its_deadline_without_the_watchdog(library_db: Path,
                                                                  monkeypatch) -> None:
    """Issue 35 §2: the engine enforces the limit (the progress handler), so a query stops
    even when the watchdog's interrupt never lands."""
    from agentflow.sql.database import _Interrupter

    monkeypatch.setattr(_Interrupter, "_fire", lambda self: None)
    with Database.open(library_db) as db:
        with pytest.raises(QueryTimeoutError):
            db.execute(FOREVER, timeout_s=0.5)
        assert db.execute("SELECT count(*) FROM author").rows == [(3,)]
