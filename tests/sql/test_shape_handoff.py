"""The guard's parse of a candidate is handed on to ``answer_shape``: a query that ran is not
parsed again to ask whether it is ``SELECT *``, and the verdict is the same either way.

Real SQLite and DuckDB files (the library fixture); sqlglot's ``parse_one`` is counted, not
replaced.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot

from agentflow import answer_shape
from agentflow.answer_shape import degenerate, star_projection
from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb
from agentflow.sql import Database
from agentflow.sql.guard import parse_single_query

# texts whose star verdicts differ, and the corners where the guard's tree and
# ``parse_one``'s differ (a trailing comment: parse_one returns a Block, not a star)
TEXTS = [
    "SELECT * FROM book",
    "SELECT b.* FROM book AS b",
    "SELECT title FROM book UNION SELECT name FROM author",
    "SELECT title FROM book UNION SELECT * FROM book",
    "SELECT count(*) FROM book",
    "SELECT title FROM (SELECT * FROM book)",
    "SELECT * FROM book;",
    "SELECT * FROM book; -- the whole table",
    "; SELECT * FROM book",
    "SELECT * FROM book /* note */",
]


@pytest.fixture(autouse=True)
def fresh_memo():
    from agentflow.sql import database

    answer_shape._VERDICTS.clear()
    database._CHECKED.clear()
    yield
    answer_shape._VERDICTS.clear()
    database._CHECKED.clear()


def count_calls(monkeypatch, owner, name: str) -> list[str]:
    """The SQL texts ``owner.name`` is called with from now on (the real function still runs)."""
    calls: list[str] = []
    real = getattr(owner, name)

    def counted(sql, *args, **kwargs):
        calls.append(sql)
        return real(sql, *args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


@pytest.fixture
def parse_calls(monkeypatch) -> list[str]:
    return count_calls(monkeypatch, sqlglot, "parse_one")


@pytest.fixture(params=["sqlite", "duckdb"])
def db(request, library_db: Path):
    path = library_db if request.param == "sqlite" else convert_sqlite_to_duckdb(
        library_db, library_db.with_suffix(".duckdb")).dst
    with Database.open(path) as database:
        yield database


def fresh_verdict(sql: str, dialect: str) -> bool:
    """What ``star_projection`` says with nothing handed on or remembered."""
    answer_shape._VERDICTS.clear()
    try:
        return star_projection(sql, dialect)
    finally:
        answer_shape._VERDICTS.clear()


def test_a_query_that_ran_is_not_parsed_again(db, parse_calls: list[str]) -> None:
    result = db.execute("SELECT * FROM book")
    assert result.rows
    before = len(parse_calls)
    question = "Which books were written by Ada?"
    # the pipelines ask several times per candidate (retry, votes, confidence)
    for _ in range(5):
        assert degenerate(question, "SELECT * FROM book", db.dialect) is not None
        assert degenerate(question, "SELECT title FROM book", db.dialect) is None
    # the star candidate was judged from the guard's tree; the other one (never run) is
    # parsed once and then remembered
    assert parse_calls[before:] == ["SELECT title FROM book"]


@pytest.mark.parametrize("sql", TEXTS)
def test_the_guards_verdict_is_the_parsers(sql: str, db) -> None:
    expected = fresh_verdict(sql, db.dialect)
    parse_single_query(sql, db.dialect)
    assert star_projection(sql, db.dialect) is expected


def test_the_memo_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(answer_shape._VERDICTS, "keep", 8)
    for i in range(20):
        star_projection(f"SELECT {i} FROM book")
    assert len(answer_shape._VERDICTS) == 8
    long = "SELECT * FROM book WHERE title = '" + "x" * answer_shape._KEEP_CHARS + "'"
    assert star_projection(long) is True
    assert (long, "sqlite") not in answer_shape._VERDICTS


# ------------------------------------------------------------------ accepted statements
@pytest.fixture
def guard_calls(monkeypatch) -> list[str]:
    from agentflow.sql import database

    return count_calls(monkeypatch, database, "parse_single_query")  # memos: fresh_memo


def test_an_accepted_statement_is_checked_once(db, guard_calls: list[str],
                                              parse_calls: list[str]) -> None:
    first = db.execute("SELECT title FROM book ORDER BY book_id")
    again = db.execute("SELECT title FROM book ORDER BY book_id")
    assert guard_calls == ["SELECT title FROM book ORDER BY book_id"]
    assert first.rows == again.rows and first.columns == again.columns
    # the shape memo forgot the verdict; running the statement again hands it on again
    db.execute("SELECT * FROM book")
    answer_shape._VERDICTS.clear()
    db.execute("SELECT * FROM book")
    assert star_projection("SELECT * FROM book", db.dialect) is True
    assert parse_calls == []


def test_a_refusal_is_checked_every_time(db, guard_calls: list[str]) -> None:
    from agentflow.sql import RejectedStatementError

    catalog = ("SELECT file FROM pragma_database_list" if db.dialect == "sqlite"
               else "SELECT name FROM duckdb_settings()")
    for _ in range(2):
        with pytest.raises(RejectedStatementError):
            db.execute("DELETE FROM book")
        with pytest.raises(RejectedStatementError):
            db.execute(catalog)
    assert guard_calls.count("DELETE FROM book") == 2
    # accepted with the catalog allowed (admins) does not make it accepted without
    db.execute(catalog, allow_catalog=True)
    with pytest.raises(RejectedStatementError):
        db.execute(catalog)
    assert guard_calls.count(catalog) == 4
