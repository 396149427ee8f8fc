"""The demo database: built from a seed, realistic, and its gold SQL right on both engines."""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import closing
from decimal import Decimal
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from agentflow.datasets.demo import (
    DEMO_DB_ID,
    DemoPaths,
    build_demo,
    content_hash,
    demo_questions,
)
from agentflow.datasets.spider import load_spider
from agentflow.sql import Database

QUESTIONS = demo_questions()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> DemoPaths:
    return build_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def engines(built: DemoPaths):
    sqlite_db = Database.open(built.sqlite)
    duck_db = Database.open(built.duckdb)
    yield sqlite_db, duck_db
    sqlite_db.close()
    duck_db.close()


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _scalar(path: Path, sql: str):
    with closing(_connect(path)) as conn:
        return conn.execute(sql).fetchone()[0]


def _file_id(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns


def _top_level_order(sql: str) -> exp.Order | None:
    return sqlglot.parse_one(sql, read="sqlite").args.get("order")


def _normalise(rows: list[tuple]) -> list[tuple]:
    def value(v):
        if isinstance(v, (float, Decimal)):
            return round(float(v), 6)
        if hasattr(v, "isoformat"):
            return v.isoformat()
        return v
    return [tuple(value(v) for v in row) for row in rows]


# ------------------------------------------------------------------------------- the data
def test_layout_is_spider_and_loads_as_a_dataset(built: DemoPaths) -> None:
    assert built.sqlite == built.root / "database" / DEMO_DB_ID / f"{DEMO_DB_ID}.sqlite"
    assert built.duckdb == built.root / "duckdb" / DEMO_DB_ID / f"{DEMO_DB_ID}.duckdb"
    [entry] = json.loads(built.tables.read_text())
    assert entry["db_id"] == DEMO_DB_ID
    columns = entry["column_names_original"]
    assert columns[0] == [-1, "*"]
    assert len(columns) == len(entry["column_names"]) == len(entry["column_types"])
    assert set(entry["column_types"]) <= {"text", "number", "time", "others"}
    assert len(entry["primary_keys"]) == len(entry["table_names_original"])
    assert entry["table_names"][entry["table_names_original"].index("order_items")] == "order items"
    for child, parent in entry["foreign_keys"]:
        assert parent in entry["primary_keys"]
        assert columns[child][1].endswith("_id") and columns[parent][1].endswith("_id")

    dataset = load_spider(built.root)
    assert list(dataset.databases) == [DEMO_DB_ID]
    assert len(dataset) == len(QUESTIONS)
    assert {e.db_id for e in dataset.examples} == {DEMO_DB_ID}
    assert dataset.duckdb_path(DEMO_DB_ID) == built.duckdb.resolve()


def test_schema_is_multi_table_with_enforced_foreign_keys(built: DemoPaths) -> None:
    with closing(_connect(built.sqlite)) as conn:
        tables = [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        with_fks = [t for t in tables if conn.execute(f"PRAGMA foreign_key_list({t})").fetchall()]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert len(tables) >= 5
    assert len(with_fks) >= 5


def test_big_tables_have_thousands_of_rows(built: DemoPaths) -> None:
    counts = {t: _scalar(built.sqlite, f"SELECT count(*) FROM {t}")
              for t in ("customers", "orders", "order_items", "reviews", "books")}
    assert counts["customers"] >= 500
    assert counts["orders"] >= 2000
    assert counts["order_items"] >= 8000
    assert counts["reviews"] >= 1000
    assert counts["books"] >= 500


@pytest.mark.parametrize("table, column", [
    ("customers", "phone"), ("customers", "loyalty_tier"), ("orders", "discount"),
    ("orders", "shipped_date"), ("orders", "store_id"), ("books", "pages"),
    ("authors", "birth_year"), ("reviews", "comment"), ("employees", "manager_id"),
])
def test_optional_columns_hold_both_nulls_and_values(built: DemoPaths, table: str,
                                                     column: str) -> None:
    nulls = _scalar(built.sqlite, f"SELECT count(*) FROM {table} WHERE {column} IS NULL")
    values = _scalar(built.sqlite, f"SELECT count(*) FROM {table} WHERE {column} IS NOT NULL")
    assert nulls > 0 and values > 0


@pytest.mark.parametrize("sql", [
    # Dates are ISO text, so string order is time order.
    "SELECT count(*) FROM orders "
    "WHERE order_date NOT GLOB '[12][0-9][0-9][0-9]-[01][0-9]-[0-3][0-9]'",
    "SELECT count(*) FROM orders WHERE shipped_date < order_date OR order_date > '2024-12-31'",
    "SELECT count(*) FROM orders o JOIN customers c ON o.customer_id = c.customer_id "
    "WHERE o.order_date < c.signup_date",
    "SELECT count(*) FROM orders WHERE (channel = 'online') <> (store_id IS NULL) "
    "OR (store_id IS NULL) <> (employee_id IS NULL)",
    "SELECT count(*) FROM orders o JOIN employees e ON o.employee_id = e.employee_id "
    "WHERE e.store_id <> o.store_id OR e.hire_date > o.order_date",
    "SELECT count(*) FROM order_items oi JOIN orders o ON oi.order_id = o.order_id "
    "JOIN books b ON oi.book_id = b.book_id "
    "WHERE b.published_year > CAST(substr(o.order_date, 1, 4) AS INTEGER)",
    "SELECT count(*) FROM reviews WHERE rating NOT BETWEEN 1 AND 5",
    "SELECT count(*) FROM (SELECT book_id, customer_id FROM reviews "
    "GROUP BY book_id, customer_id HAVING count(*) > 1)",
])
def test_data_is_coherent(built: DemoPaths, sql: str) -> None:
    assert _scalar(built.sqlite, sql) == 0


@pytest.mark.parametrize("table", ["stores", "employees", "authors", "books", "customers",
                                   "orders", "order_items", "reviews"])
def test_duckdb_copy_holds_the_same_rows(engines, table: str) -> None:
    sqlite_db, duck_db = engines
    sql = f"SELECT * FROM {table} ORDER BY 1"
    assert (_normalise(sqlite_db.execute(sql, max_rows=None).rows)
            == _normalise(duck_db.execute(sql, max_rows=None).rows))


# ------------------------------------------------------------------------------- the build
def test_build_is_deterministic_and_rebuilt_only_when_needed(built: DemoPaths,
                                                             tmp_path: Path) -> None:
    reference = content_hash(built.sqlite)
    other = build_demo(tmp_path, seed=8)
    assert content_hash(other.sqlite) != reference

    before = _file_id(other.sqlite)
    assert build_demo(tmp_path, seed=8) == other
    assert _file_id(other.sqlite) == before, "an up-to-date build must not be redone"

    build_demo(tmp_path, seed=8, force=True)
    assert _file_id(other.sqlite) != before
    assert content_hash(other.sqlite) != reference

    build_demo(tmp_path, seed=7)  # the manifest records seed 8: stale, so rebuilt
    assert content_hash(other.sqlite) == reference
    manifest = json.loads((tmp_path / "build.json").read_text())
    assert manifest["seed"] == 7 and manifest["content_hash"] == reference
    assert not list(tmp_path.glob(".build-*")), "temporary build folders must be removed"


def test_concurrent_builds_into_one_folder(built: DemoPaths, tmp_path: Path) -> None:
    results: list[DemoPaths] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(build_demo(tmp_path))
        except BaseException as err:  # surfaced below; a thread cannot fail the test itself
            errors.append(err)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 2 and results[0] == results[1]
    assert content_hash(results[0].sqlite) == content_hash(built.sqlite)
    assert not list(tmp_path.glob(".build-*"))


# ------------------------------------------------------------------------------- gold SQL
def test_questions_are_well_formed() -> None:
    assert 32 <= len(QUESTIONS) <= 40
    assert len({q["question"] for q in QUESTIONS}) == len(QUESTIONS)
    assert {q["difficulty"] for q in QUESTIONS} == {"easy", "medium", "hard", "extra"}
    for q in QUESTIONS:
        assert set(q) == {"question", "query", "difficulty"}


@pytest.mark.parametrize("item", QUESTIONS, ids=[f"q{i:02d}" for i in range(len(QUESTIONS))])
def test_gold_query_agrees_on_sqlite_and_duckdb(engines, item: dict) -> None:
    sqlite_db, duck_db = engines
    on_sqlite = _normalise(sqlite_db.execute(item["query"], max_rows=None).rows)
    on_duckdb = _normalise(duck_db.execute(item["query"], max_rows=None, dialect="sqlite").rows)
    assert on_sqlite, "a gold query must return rows"
    assert on_sqlite != [(None,) * len(on_sqlite[0])], "an all-NULL answer is no answer"
    if _top_level_order(item["query"]) is None:
        on_sqlite, on_duckdb = sorted(on_sqlite, key=repr), sorted(on_duckdb, key=repr)
    assert on_sqlite == on_duckdb


@pytest.mark.parametrize("item", [q for q in QUESTIONS if _top_level_order(q["query"])],
                         ids=lambda q: q["question"][:40])
def test_ordered_gold_query_has_no_ties(engines, item: dict) -> None:
    """Break ties on every output column, ascending then descending: the answer (and what a
    LIMIT keeps) must not change, or the gold depends on the engine's arbitrary order."""
    sqlite_db, _ = engines
    tree = sqlglot.parse_one(item["query"], read="sqlite")
    variants = []
    for desc in (False, True):
        copy = tree.copy()
        order = copy.args["order"]
        order.set("expressions", [*order.expressions, *(
            exp.Ordered(this=exp.Literal.number(i), desc=desc)
            for i in range(1, len(copy.selects) + 1))])
        variants.append(sqlite_db.execute(copy.sql(dialect="sqlite"), max_rows=None).rows)
    assert variants[0] == variants[1]
