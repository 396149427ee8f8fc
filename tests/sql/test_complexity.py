"""Issue 35 §2 and §9: statements that are cheap to write but ruinous to prepare or to check.

The SQLite nested-CTE doubling chain spent 9.5 s and 1.3 GB inside ``sqlite3_prepare`` (the
flattener copies ``s || s`` at every level; no progress handler or interrupt reaches there)
on a 2 s limit; a 7,000-term ``||`` chain cost 6.5 s in DuckDB's bounds and then a
RecursionError (not a typed error). Real SQLite and DuckDB files; the steps are observed
(which check refused, how often the text is tokenized), not timed.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import sqlglot

from agentflow.sql import Database
from agentflow.sql.complexity import (
    MAX_EXPANDED_NODES,
    MAX_TREE_DEPTH,
    expanded_size,
    tree_depth,
)
from agentflow.sql.database import SQLITE_MAX_VDBE_OPS
from agentflow.sql.errors import QueryTooComplexError
from agentflow.sql.guard import check_query
from tests.sql.utils import duckdb_file, record_parsing, sqlite_file


@pytest.fixture(params=["sqlite", "duckdb"])
def db(request, tmp_path: Path) -> Database:
    if request.param == "sqlite":
        path = sqlite_file(tmp_path / "t.sqlite", "CREATE TABLE t (n INTEGER, s TEXT)",
                           rows={"t": [(1, "a")]})
    else:
        path = duckdb_file(tmp_path / "t.duckdb", "CREATE TABLE t (n INTEGER, s VARCHAR)",
                           rows={"t": [(1, "a")]})
    database = Database.open(path)
    yield database
    database.close()


def chain(levels: int, uses: int = 2) -> str:
    """The issue's bomb: each CTE uses the previous one's column ``uses`` times."""
    body = " || ".join(["s"] * uses)
    return ("WITH a0 AS (SELECT 'xxxxxxxx' AS s), "
            + ", ".join(f"a{i} AS (SELECT {body} AS s FROM a{i - 1})"
                        for i in range(1, levels + 1))
            + f" SELECT length(s) FROM a{levels}")


# The same growth written other ways: derived tables, scalar subqueries, a renamed CTE column,
# a star that carries the column through, a join, a set operation.
VARIANTS = [
    "SELECT length(s) FROM " + "(SELECT s || s AS s FROM " * 20 + "(SELECT 'x' AS s)"
    + ") AS q" * 20,
    "WITH a0 AS (SELECT 'x' AS s), " + ", ".join(
        f"a{i} AS (SELECT (SELECT s FROM a{i - 1}) || (SELECT s FROM a{i - 1}) AS s)"
        for i in range(1, 25)) + " SELECT length(s) FROM a24",
    "WITH a0(v) AS (SELECT 'x'), " + ", ".join(
        f"a{i}(v) AS (SELECT v || v FROM a{i - 1})" for i in range(1, 25))
    + " SELECT length(v) FROM a24",
    "WITH a0 AS (SELECT 'x' AS s), " + ", ".join(
        f"a{i} AS (SELECT * FROM (SELECT x.s || x.s AS s FROM a{i - 1} AS x))"
        for i in range(1, 25)) + " SELECT length(s) FROM a24",
    "WITH a0 AS (SELECT 'x' AS s), " + ", ".join(
        f"a{i} AS (SELECT l.s || r.s AS s FROM a{i - 1} AS l JOIN a{i - 1} AS r ON 1 = 1)"
        for i in range(1, 25)) + " SELECT length(s) FROM a24",
    "WITH a0 AS (SELECT 'x' AS s), " + ", ".join(
        f"a{i} AS (SELECT s || s AS s FROM a{i - 1} UNION ALL SELECT 'y')"
        for i in range(1, 25)) + " SELECT length(s) FROM a24",
]


def test_the_cte_doubling_chain_is_refused_before_the_engine_prepares_it(db: Database,
                                                                         monkeypatch) -> None:
    """Before: SQLite prepared it for 9.5 s (1.3 GB) on a 2 s limit. Now the guard refuses it
    and no statement reaches the engine."""
    reached: list[str] = []
    original = Database._run
    monkeypatch.setattr(Database, "_run", lambda self, *a, **k: reached.append(a[0])
                        or original(self, *a, **k))
    result = db.try_execute(chain(30), timeout_s=2)
    assert isinstance(result, QueryTooComplexError), result
    assert "inlined" in str(result) and reached == []


def test_a_short_chain_still_runs(db: Database) -> None:
    assert db.execute(chain(10), timeout_s=10).rows == [(8 * 2 ** 10,)]


@pytest.mark.parametrize("sql", VARIANTS)
def test_the_growth_is_measured_however_it_is_written(sql: str) -> None:
    assert expanded_size(sqlglot.parse_one(sql, read="sqlite")) > MAX_EXPANDED_NODES
    with pytest.raises(QueryTooComplexError, match="inlined"):
        check_query(sql, "sqlite")


def test_the_estimate_is_linear_to_compute_and_grows_with_each_use() -> None:
    sizes = [expanded_size(sqlglot.parse_one(chain(n), read="sqlite")) for n in (4, 5, 6)]
    assert sizes[1] > 1.9 * sizes[0] and sizes[2] > 1.9 * sizes[1]
    once = [expanded_size(sqlglot.parse_one(chain(n, uses=1), read="sqlite")) for n in (4, 40)]
    assert once[1] < 12 * once[0]  # a column used once per level grows linearly
    # 1,000 levels: sizes saturate instead of becoming 2^1000-digit integers
    assert expanded_size(sqlglot.parse_one(chain(1000), read="sqlite")) > MAX_EXPANDED_NODES


def test_spider_gold_queries_are_far_below_both_caps(shared_spider: Path) -> None:
    depth = size = 0
    for q in json.loads((shared_spider / "dev.json").read_text()):
        tree = sqlglot.parse_one(q["query"], read="sqlite")
        depth, size = max(depth, tree_depth(tree)), max(size, expanded_size(tree))
    assert depth * 5 < MAX_TREE_DEPTH and size * 100 < MAX_EXPANDED_NODES, (depth, size)


def test_long_operator_chains_are_a_typed_error_before_any_recursive_step(db: Database,
                                                                           monkeypatch
                                                                           ) -> None:
    """Before: DuckDB's bounds spent 6.5 s wrapping 7,000 ``||`` and then raised a
    RecursionError out of ``execute`` (an untyped 500 for a caller)."""
    from agentflow.sql import bounds

    wrapped: list[int] = []
    original = bounds.bound_growth
    monkeypatch.setattr("agentflow.sql.database.bound_growth",
                        lambda tree, **k: wrapped.append(1) or original(tree, **k))
    sql = "SELECT " + " || ".join(["s"] * 7000) + " FROM t"
    with pytest.raises(QueryTooComplexError, match="levels of expressions"):
        db.execute(sql, timeout_s=30)
    assert wrapped == []
    ors = "SELECT n FROM t WHERE " + " OR ".join(f"n = {i}" for i in range(140))
    assert db.execute(ors, timeout_s=30).rows == [(1,)]


def test_duckdb_concatenation_chains_stop_with_a_typed_error_once_checked(tmp_path: Path
                                                                          ) -> None:
    """Each DuckDB ``||`` gets a size check three levels deep; a 60-term chain was a
    RecursionError when written out, now a typed refusal that names concat(...)."""
    path = duckdb_file(tmp_path / "c.duckdb", "CREATE TABLE t (s VARCHAR)", rows={"t": [("a",)]})
    with Database.open(path) as db:
        with pytest.raises(QueryTooComplexError, match="concat"):
            db.execute("SELECT " + " || ".join(["s"] * 60) + " FROM t", timeout_s=30)
        assert db.execute("SELECT " + " || ".join(["s"] * 30) + " FROM t").rows == [("a" * 30,)]
        assert db.execute("SELECT concat(" + ", ".join(["s"] * 60) + ") FROM t").rows == \
            [("a" * 60,)]


def test_the_guard_tokenizes_the_text_once(monkeypatch) -> None:
    """Tokenizing is half the guard's cost on a long text; the size check's tokens are the
    parser's (before: tokenized twice per check, three times per SQLite execute)."""
    calls = record_parsing(monkeypatch)
    check_query("SELECT n FROM t WHERE " + " OR ".join(f"n = {i}" for i in range(100)),
                "sqlite")
    assert calls.count("tokenize") == 1


def test_sqlite_connections_cap_the_program_size(db: Database) -> None:
    if db.kind != "sqlite":
        pytest.skip("SQLite only")
    with db.engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert raw.getlimit(sqlite3.SQLITE_LIMIT_VDBE_OP) == SQLITE_MAX_VDBE_OPS
