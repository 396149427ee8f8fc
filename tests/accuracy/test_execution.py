"""Execution accuracy on real SQLite and DuckDB files: one test per verdict reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.accuracy import MatchRule, Verdict, evaluate_pair
from agentflow.sql import Database
from tests.sql.utils import duckdb_file, record_watchdog_fires, sqlite_file

ROWS = [(1, "Joe", 52, "France"), (2, "Ann", 41, "Spain"), (3, "Tom", 41, "France"),
        (4, "Eve", 29, "Italy")]

FOREVER = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
           "SELECT count(*) FROM c")


def _sqlite_file(path: Path) -> Path:
    return sqlite_file(path, "CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, "
                       "age INTEGER, country TEXT)", rows={"singer": ROWS})


def _duckdb_file(path: Path) -> Path:
    return duckdb_file(path, "CREATE TABLE singer (id INTEGER PRIMARY KEY, name VARCHAR, "
                       "age INTEGER, country VARCHAR)", rows={"singer": ROWS})


@pytest.fixture(params=["sqlite", "duckdb"])
def db(request, tmp_path):
    if request.param == "sqlite":
        path = _sqlite_file(tmp_path / "concert.sqlite")
    else:
        path = _duckdb_file(tmp_path / "concert.duckdb")
    database = Database.open(path)
    yield database
    database.close()


@pytest.fixture
def sqlite_db(tmp_path):
    database = Database.open(_sqlite_file(tmp_path / "concert.sqlite"))
    yield database
    database.close()


# ----------------------------------------------------------------------------- match
def test_match_with_reordered_rows_and_columns(db):
    v = evaluate_pair(db, "SELECT age, name FROM singer WHERE country = 'France' ORDER BY id DESC",
                      "SELECT name, age FROM singer WHERE country = 'France'")
    assert v == Verdict(True, "match", "", 2, 2, v.pred_s, v.gold_s)
    assert v.pred_s is not None and v.pred_s >= 0 and v.gold_s is not None


def test_match_under_bird_needs_column_order(db):
    gold = "SELECT name, age FROM singer"
    assert evaluate_pair(db, "SELECT name, age FROM singer", gold, rule="bird").correct
    v = evaluate_pair(db, "SELECT age, name FROM singer", gold, rule=MatchRule.BIRD)
    assert (v.correct, v.reason) == (False, "mismatch")


# ----------------------------------------------------------------------------- mismatch
def test_mismatch_row_count(db):
    v = evaluate_pair(db, "SELECT name FROM singer WHERE age > 30",
                      "SELECT name FROM singer")
    assert (v.correct, v.reason, v.pred_rows, v.gold_rows) == (False, "mismatch", 3, 4)
    assert v.detail == "3 rows vs 4 expected"


def test_mismatch_order_when_gold_orders(db):
    v = evaluate_pair(db, "SELECT name FROM singer ORDER BY age ASC, id",
                      "SELECT name FROM singer ORDER BY age DESC, id")
    assert v.reason == "mismatch" and "different order" in v.detail


def test_order_only_in_gold_subquery_is_ignored(db):
    # Gold: the singers of the second-highest age (41): Ann, Tom. The ORDER BY sits in the
    # subquery, so the outer rows have no order and Tom, Ann is just as right. (The official
    # substring rule would demand Ann, Tom here.)
    v = evaluate_pair(
        db, "SELECT name FROM singer WHERE age = 41 ORDER BY name DESC",
        "SELECT name FROM singer WHERE age = "
        "(SELECT age FROM singer ORDER BY age DESC LIMIT 1 OFFSET 1)")
    assert v.reason == "match"


# ----------------------------------------------------------------------------- pred failures
@pytest.mark.parametrize("pred, kind", [
    ("SELEC name FROM singer", "syntax_error"),
    ("SELECT nme FROM singer", "unknown_column"),
    ("SELECT name FROM singers", "unknown_table"),
])
def test_pred_error(db, pred, kind):
    v = evaluate_pair(db, pred, "SELECT name FROM singer")
    assert (v.correct, v.reason, v.error_kind) == (False, "pred_error", kind)
    assert v.detail and v.pred_rows is None and v.gold_rows == 4


def test_pred_rejected(db):
    v = evaluate_pair(db, "DELETE FROM singer", "SELECT name FROM singer")
    assert (v.correct, v.reason, v.error_kind) == (False, "pred_rejected", "rejected")
    # And the data is untouched.
    assert evaluate_pair(db, "SELECT count(*) FROM singer", "SELECT 4").correct


def test_pred_timeout_is_reported_with_its_time(db, monkeypatch):
    fired = record_watchdog_fires(monkeypatch)
    v = evaluate_pair(db, FOREVER, "SELECT name FROM singer", timeout_s=0.5)
    assert (v.correct, v.reason, v.error_kind) == (False, "pred_timeout", "timeout")
    assert fired  # the watchdog stopped the prediction; it never ends by itself
    assert v.pred_s is not None and v.pred_s > 0.4


# ----------------------------------------------------------------------------- gold failures
def test_gold_error_is_not_blamed_on_the_prediction(db):
    v = evaluate_pair(db, "SELECT name FROM singer", "SELECT name FROM no_such_table")
    assert (v.correct, v.reason, v.error_kind) == (False, "gold_error", "unknown_table")
    assert v.detail.startswith("gold query failed") and v.pred_rows is None


def test_gold_timeout(sqlite_db):
    v = evaluate_pair(sqlite_db, "SELECT 1", FOREVER, timeout_s=0.3)
    assert (v.correct, v.reason) == (False, "gold_timeout")


# ----------------------------------------------------------------------------- caching, dialects
def test_cached_gold_result_is_reused(sqlite_db):
    gold_sql = "SELECT name FROM singer WHERE country = 'France'"
    gold = sqlite_db.execute(gold_sql)
    v = evaluate_pair(sqlite_db, "SELECT name FROM singer WHERE id IN (1, 3)", gold_sql,
                      gold_result=gold)
    assert v.reason == "match" and v.gold_s == gold.elapsed_s
    # The cached result is trusted: the gold SQL text is not executed again.
    v = evaluate_pair(sqlite_db, "SELECT name FROM singer WHERE id IN (1, 3)",
                      "SELECT name FROM no_such_table", gold_result=gold)
    assert v.reason == "match"


def test_sqlite_gold_on_duckdb(tmp_path):
    with Database.open(_duckdb_file(tmp_path / "c.duckdb")) as duck:
        v = evaluate_pair(duck, "SELECT name FROM singer WHERE name LIKE 'A%'",
                          "SELECT name FROM singer WHERE substr(name, 1, 1) = 'A'",
                          gold_dialect="sqlite")
    assert v.reason == "match"


# ----------------------------------------------------------------------------- truncation
def test_truncated_prediction_never_matches(sqlite_db):
    v = evaluate_pair(sqlite_db, "SELECT name FROM singer", "SELECT name FROM singer LIMIT 2",
                      max_rows=3)
    assert v.reason == "mismatch" and "cap" in v.detail and v.error_kind == "truncated"


def test_truncated_gold_is_a_gold_problem(sqlite_db):
    v = evaluate_pair(sqlite_db, "SELECT name FROM singer", "SELECT name FROM singer",
                      max_rows=3)
    assert v.reason == "gold_error" and "cap" in v.detail and v.error_kind == "truncated"


def test_verdict_to_dict_round_trip():
    v = Verdict(False, "pred_error", "unknown column 'x'", None, 4, 0.01, 0.02, "unknown_column")
    assert Verdict(**v.to_dict()) == v
