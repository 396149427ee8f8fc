"""Where agentflow's judge and the official Spider evaluator could part ways (issue 39): each
case either behaves as the official evaluator does (it was a bug) or is a documented choice
(docs/accuracy.md, "Deliberate differences"), and this file holds both. Real SQLite files;
the official behaviour is what plain ``sqlite3`` does with the text the evaluator runs."""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from agentflow.accuracy import MatchRule, Verdict, evaluate_pair
from agentflow.accuracy.compare import FLOAT_ROUNDING, describe_mismatch, gold_has_order_by
from agentflow.accuracy.official import official_text
from agentflow.datasets.check import dialect_difference
from agentflow.sql import Database
from tests.sql.utils import sqlite_file

ROWS = [(1, "Joe", 1990, 9.99), (2, "Ann", 1979, 0.99), (3, "Tom", 2001, 1.99)]


@pytest.fixture
def db(tmp_path: Path):
    path = sqlite_file(tmp_path / "music.sqlite", "CREATE TABLE artist (id INTEGER PRIMARY KEY, "
                       "name TEXT, born INTEGER, UnitPrice REAL)", rows={"artist": ROWS})
    database = Database.open(path)
    yield database
    database.close()


# ------------------------------------------------------------------ fixed: as the official
def test_year_of_curdate_is_the_evaluators_2020_in_prediction_and_gold(db) -> None:
    gold = "SELECT name FROM artist WHERE 2020 - born > 30"
    pred = "SELECT name FROM artist WHERE YEAR(CURDATE()) - born > 30"
    assert evaluate_pair(db, pred, gold).correct
    assert evaluate_pair(db, gold, pred).correct  # a gold with it runs too
    assert evaluate_pair(db, pred, gold, keep_distinct=True).correct
    # BIRD's evaluator rewrites nothing: SQLite has no CURDATE()
    bird = evaluate_pair(db, pred, gold, rule=MatchRule.BIRD)
    assert bird.reason in ("pred_error", "pred_rejected"), bird


def test_a_leading_semicolon_runs_with_keep_distinct_as_sqlite3_runs_it(db) -> None:
    pred = "; SELECT name FROM artist"
    assert sqlite3.connect(":memory:").execute("; SELECT 1").fetchall() == [(1,)]
    assert official_text(pred, keep_distinct=True) == pred
    assert evaluate_pair(db, pred, "SELECT name FROM artist", keep_distinct=True).correct
    # two statements are still refused, as sqlite3 refuses them
    twice = evaluate_pair(db, "; SELECT name FROM artist;;", "SELECT name FROM artist",
                          keep_distinct=True)
    assert twice.reason == "pred_error" and "one statement at a time" in twice.detail


# ------------------------------------------------------------------ documented choices
def test_a_leading_semicolon_without_keep_distinct_is_an_empty_statement(db) -> None:
    # The evaluator keeps only the first statement, here the empty one before the ';'
    # (sqlite3 would return no rows for it); agentflow refuses an empty statement, so the
    # prediction is wrong even where the gold's answer is empty.
    assert official_text("; SELECT name FROM artist") == ";"
    verdict = evaluate_pair(db, "; SELECT name FROM artist", "SELECT name FROM artist")
    assert not verdict.correct and verdict.reason in ("pred_error", "pred_rejected")


def test_order_by_inside_a_comment_of_the_gold_does_not_make_order_matter(db) -> None:
    gold = "SELECT name FROM artist -- order by born would also do\n"
    assert "order by" in gold.lower()  # the official test would demand this order
    assert not gold_has_order_by(gold)
    assert evaluate_pair(db, "SELECT name FROM artist ORDER BY name DESC", gold).correct
    assert gold_has_order_by("SELECT name FROM artist /* x */ ORDER BY born")


def test_a_function_the_guard_refuses_is_wrong_even_where_sqlite3_runs_it(db) -> None:
    # zeroblob(n) allocates n bytes; sqlite_version() and changes() read the server and the
    # session: the allow-list (agentflow.sql.allowlist) judges as it serves
    con = sqlite3.connect(":memory:")
    for name, call in (("zeroblob", "length(zeroblob(4)) = 4"),
                       ("sqlite_version", "sqlite_version() IS NOT NULL"),
                       ("changes", "changes() = 0")):
        assert con.execute(f"SELECT {call}").fetchall() == [(1,)]
        verdict = evaluate_pair(db, f"SELECT name FROM artist WHERE {call}",
                                "SELECT name FROM artist")
        assert verdict.reason == "pred_rejected" and f"{name}()" in verdict.detail, verdict


# ------------------------------------------------------------------ float rounding
def test_floats_added_in_another_order_are_named_as_rounding() -> None:
    gold = [("Rock", 1.0012018270054257), ("Jazz", 0.1 + 0.2)]
    pred = [("Jazz", 0.3), ("Rock", 1.0012018270054253)]
    assert describe_mismatch(pred, gold, rule="spider") == FLOAT_ROUNDING
    assert describe_mismatch(pred, gold, rule="bird") == FLOAT_ROUNDING
    # PostgreSQL's exact NUMERIC average against SQLite's float
    assert describe_mismatch([(Decimal("0.33333333333333333333"),)], [(1 / 3,)],
                             rule="spider") == FLOAT_ROUNDING
    # another value is not rounding
    assert describe_mismatch([("Jazz", 0.31)], [("Jazz", 0.3)], rule="spider") != FLOAT_ROUNDING


def test_datasets_check_files_rounding_apart_from_ties() -> None:
    rounding = Verdict(False, "mismatch", f"answer differs from SQLite's: {FLOAT_ROUNDING}")
    ties = Verdict(False, "mismatch", "answer differs from SQLite's: same shape (3 rows x "
                   "1 column), different values")
    assert dialect_difference(rounding).startswith("floating-point rounding")
    assert dialect_difference(ties).startswith("result differs from SQLite's: ties")
