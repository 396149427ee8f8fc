"""Issue 35 §1: one text is checked and run, and a parser difference fails closed.

The reproductions run on real SQLite/DuckDB files (PostgreSQL's parser through pglast needs no
server; tests/sql/test_postgres_guard.py has the server-side ones). Before this change the
DuckDB backtick texts below ran ``version()`` and an unbounded ``repeat``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agentflow.sql import Database, RejectedStatementError
from agentflow.sql.engine_check import (
    SqliteAuthorizer,
    approved_tables,
    duckdb_view,
    engine_names,
    regenerate,
    verify,
)
from agentflow.sql.guard import parse_single_query
from tests.sql.utils import duckdb_file, sqlite_file


@pytest.fixture
def duck(tmp_path: Path) -> Database:
    path = duckdb_file(tmp_path / "t.duckdb", "CREATE TABLE t (a INTEGER, s VARCHAR)",
                       rows={"t": [(1, "x"), (2, "y")]})
    db = Database.open(path)
    yield db
    db.close()


@pytest.fixture
def lite(tmp_path: Path) -> Database:
    path = sqlite_file(tmp_path / "t.sqlite", "CREATE TABLE t (a INTEGER, s TEXT)",
                       "CREATE TABLE u (a INTEGER)", "CREATE VIEW v AS SELECT a FROM u",
                       rows={"t": [(1, "x")]})
    db = Database.open(path)
    yield db
    db.close()


# The class: sqlglot's DuckDB tokenizer has no backtick identifiers, so `--` hides the
# rest of the line from the guard while DuckDB reads a name and then the call.
BACKTICK = [
    "SELECT `--`, version() AS v\nFROM t",
    "SELECT a AS `--` , current_setting('memory_limit') \n FROM t",
    "SELECT `--`, length(repeat('x', 1500000000)) AS n\nFROM t",
    "SELECT a FROM `--`, duckdb_settings()\n t",
]


@pytest.mark.parametrize("sql", BACKTICK)
def test_duckdb_backtick_texts_are_approved_by_sqlglot_but_do_not_run(duck: Database,
                                                                      sql: str) -> None:
    parse_single_query(sql, "duckdb")  # the guard alone approves it: the bypass
    view = duckdb_view(sql)  # DuckDB itself reads a call the guard never saw
    assert view.functions - {("", "length")} or view.tables - {("", "", "t")}
    with pytest.raises(RejectedStatementError, match="did not run"):
        duck.execute(sql, timeout_s=5)


def test_the_text_that_runs_is_the_guards_tree_written_out(duck: Database) -> None:
    sql = "SELECT upper(s) /* a comment */ AS u FROM t -- trailing\nORDER BY a;"
    result = duck.execute(sql)
    assert result.rows == [("X",), ("Y",)]
    tree = parse_single_query(sql, "duckdb")
    assert "comment" not in regenerate(tree, "duckdb") and ";" not in regenerate(tree, "duckdb")


@pytest.mark.parametrize("sql", [
    "SELECT * FROM pragma_database_list",
    "SELECT file FROM pragma_database_list()",
    "SELECT * FROM pragma_table_info('t')",
])
def test_sqlite_catalog_tables_are_refused_unless_allowed(lite: Database, sql: str) -> None:
    with pytest.raises(RejectedStatementError):
        lite.execute(sql)
    assert lite.execute(sql, allow_catalog=True).rows


@pytest.mark.parametrize("sql", [
    "SELECT * FROM duckdb_databases()",
    "SELECT * FROM duckdb_settings()",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM pragma_database_list",
    "SELECT version()",
    "SELECT current_setting('memory_limit')",
    "SELECT * FROM pg_catalog.pg_namespace",
])
def test_duckdb_catalog_and_path_functions_are_refused(duck: Database, sql: str) -> None:
    with pytest.raises(RejectedStatementError):
        duck.execute(sql)


def test_sqlite_authorizer_denies_what_the_guard_did_not_approve() -> None:
    con = sqlite3.connect(":memory:")
    con.executescript("CREATE TABLE t (a); CREATE TABLE u (a); CREATE VIEW v AS SELECT a FROM u")
    con.execute("SELECT a FROM u").fetchall()  # prepared and cached without an authorizer
    approved = {("", "", "t")}
    for sql, why in [("SELECT a FROM u", "table 'u'"),
                     ("SELECT sqlite_version()", "sqlite_version"),
                     ("SELECT * FROM pragma_database_list", "catalog")]:
        auth = SqliteAuthorizer(approved)
        con.set_authorizer(auth)
        with pytest.raises(sqlite3.DatabaseError, match="not authorized|prohibited"):
            con.execute(sql).fetchall()
        con.set_authorizer(None)
        assert why in str(auth.error(sql))
    auth = SqliteAuthorizer({("", "", "v")})  # a view the guard saw may read its own tables
    con.set_authorizer(auth)
    assert con.execute("SELECT a FROM v").fetchall() == []
    assert auth.refused is None


def test_duckdb_verifier_fails_closed() -> None:
    tables = {("", "", "t")}
    verify("SELECT upper(s), a + 1, [a][1], count(*) FROM t", dialect="duckdb", tables=tables)
    for sql in ["SELECT version()", "SELECT a FROM u", "SELECT 1; SELECT 2",
                "SELECT a FROM system.main.t", "SELECT a FROM t WHERE", "SHOW TABLES",
                "SELECT main.upper_evil(a) FROM t"]:
        with pytest.raises(RejectedStatementError, match="did not run|catalog"):
            verify(sql, dialect="duckdb", tables=tables)


def test_postgres_verifier_reads_with_postgres_parser() -> None:
    pytest.importorskip("pglast")
    tables = {("", "", "t")}
    verify("SELECT upper(s), count(*) FROM t GROUP BY 1", dialect="postgres", tables=tables)
    for sql in ["SELECT current_user", "SELECT 'pg_roles'::regclass", "SELECT a FROM pg_roles",
                "SELECT a FROM u", "SELECT version()", "SELECT 1; SELECT 2"]:
        with pytest.raises(RejectedStatementError):
            verify(sql, dialect="postgres", tables=tables)


def test_every_allowed_function_is_one_the_engine_check_allows() -> None:
    """The derived names cover the allow-list, and a few of sqlglot's respellings."""
    names = engine_names("duckdb")
    assert {"upper", "count_star", "list_value", "error"} <= names
    assert "version" not in names and "current_setting" not in names
    assert "version" not in engine_names("sqlite") and "sqlite_version" not in \
        engine_names("sqlite")


def _gold(shared_spider: Path, limit: int) -> list[tuple[str, str]]:
    items = json.loads((shared_spider / "dev.json").read_text())
    return [(it["db_id"], it["query"]) for it in items[:limit]]


def test_spider_gold_runs_through_the_sqlite_authorizer(shared_spider: Path) -> None:
    """No dev gold query is refused by the engine check, and each gives the same rows as the
    text as written (the regenerated text is the same query)."""
    refused, differ = [], []
    dbs: dict[str, Database] = {}
    for db_id, sql in _gold(shared_spider, 400):
        path = shared_spider / "database" / db_id / f"{db_id}.sqlite"
        db = dbs.get(db_id) or dbs.setdefault(db_id, Database.open(path))
        result = db.try_execute(sql, timeout_s=30, max_rows=None)
        if isinstance(result, RejectedStatementError):
            refused.append((sql, str(result)))
            continue
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        con.text_factory = lambda b: b.decode("utf-8", errors="replace")
        try:
            if getattr(result, "rows", None) != con.execute(sql).fetchall():
                differ.append(sql)
        finally:
            con.close()
    for db in dbs.values():
        db.close()
    assert not refused, refused[:5]
    assert not differ, differ[:5]


@pytest.mark.parametrize("dialect", ["duckdb", "postgres"])
def test_transpiled_spider_gold_passes_the_engine_check(shared_spider: Path,
                                                        dialect: str) -> None:
    if dialect == "postgres":
        pytest.importorskip("pglast")
    from agentflow.sql.dialect import transpile

    refused = []
    for _, sql in _gold(shared_spider, 1000):
        text = transpile(sql, read="sqlite", write=dialect)
        tree = parse_single_query(text, dialect)
        try:
            verify(regenerate(tree, dialect), dialect=dialect, tables=approved_tables(tree))
        except RejectedStatementError as err:
            refused.append((text, str(err)))
    assert not refused, refused[:5]


def test_differential_fuzz_small_form() -> None:
    """The bench's fuzz, small: texts the guard approved that the engine reads as naming
    something unapproved never pass the engine check (the bench runs 100k per engine)."""
    from agentflow.bench.security.guard_fuzz import fuzz

    engines = ["sqlite", "duckdb"]
    try:
        import pglast  # noqa: F401
        engines.append("postgres")
    except ImportError:
        pass
    for engine in engines:
        tally = fuzz(engine, 600, seed=7)
        assert tally.approved > 20
        assert tally.run == 0, tally.examples
