"""Result comparison under the BIRD and Spider rules; every expectation worked out by hand."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from decimal import Decimal

import pytest

from agentflow.accuracy import compare
from agentflow.accuracy.compare import (
    MatchRule,
    describe_mismatch,
    gold_has_order_by,
    results_match,
)

SPIDER, BIRD = MatchRule.SPIDER, MatchRule.BIRD


def spider(pred, gold, order_matters=False) -> bool:
    return results_match(pred, gold, rule=SPIDER, order_matters=order_matters)


def bird(pred, gold) -> bool:
    return results_match(pred, gold, rule=BIRD)


# ----------------------------------------------------------------------------- row order
def test_row_order_ignored_without_order_by():
    gold = [(1, "a"), (2, "b"), (3, "c")]
    pred = [(3, "c"), (1, "a"), (2, "b")]
    assert spider(pred, gold)
    assert bird(pred, gold)


def test_row_order_honoured_with_order_by():
    gold = [(1, "a"), (2, "b"), (3, "c")]
    assert not spider([(3, "c"), (1, "a"), (2, "b")], gold, order_matters=True)
    assert spider([(1, "a"), (2, "b"), (3, "c")], gold, order_matters=True)
    # BIRD never looks at order, whatever the caller says.
    assert results_match([(3, "c"), (1, "a"), (2, "b")], gold, rule=BIRD, order_matters=True)


def test_order_matters_still_allows_a_column_permutation():
    gold = [(1, "a"), (2, "b")]
    assert spider([("a", 1), ("b", 2)], gold, order_matters=True)
    assert not spider([("b", 2), ("a", 1)], gold, order_matters=True)


# ----------------------------------------------------------------------------- columns
def test_column_permutation_accepted_by_spider_not_bird():
    gold = [(1, "x", 10.5), (2, "y", 20.5)]
    pred = [(10.5, 1, "x"), (20.5, 2, "y")]  # gold columns in order 2, 0, 1
    assert spider(pred, gold)
    assert not bird(pred, gold)


def test_one_permutation_must_fit_every_row():
    # Each pred row, sorted, equals a gold row, but row 1 would need a swap and row 2 not.
    gold = [(1, 2), (3, 4)]
    pred = [(2, 1), (3, 4)]
    assert not spider(pred, gold)


def test_equal_column_multisets_but_different_row_pairing():
    # Both columns of both results hold {1, 2, 3}; no column order pairs the values as gold does.
    gold = [(1, 2), (2, 1), (3, 3)]
    pred = [(1, 1), (2, 2), (3, 3)]
    assert not spider(pred, gold)
    # Same multisets under the identity, different pairing; swapped columns break the multisets.
    assert not spider([(1, 3), (2, 2)], [(1, 2), (2, 3)])


def test_all_columns_same_multiset_with_a_valid_permutation():
    gold = [(1, 2, 3), (2, 3, 1), (3, 1, 2)]
    pred = [(1, 3, 2), (2, 1, 3), (3, 2, 1)]  # gold with columns 1 and 2 swapped
    assert spider(pred, gold)


def test_latin_squares_that_no_column_order_can_align():
    # Every column of both holds {1, 2, 3, 4} once. The cyclic square (Z4) and the Klein square
    # are not isotopic, so no row and column reordering turns one into the other.
    cyclic = [(1, 2, 3, 4), (2, 3, 4, 1), (3, 4, 1, 2), (4, 1, 2, 3)]
    klein = [(1, 2, 3, 4), (2, 1, 4, 3), (3, 4, 1, 2), (4, 3, 2, 1)]
    assert not spider(klein, cyclic)
    # Reordering rows and columns of the cyclic square is accepted.
    shuffled = [(r[3], r[1], r[0], r[2]) for r in reversed(cyclic)]
    assert spider(shuffled, cyclic)


def test_agrees_with_brute_force_on_random_small_tables():
    rng = random.Random(7)
    for _ in range(400):
        width, height = rng.randint(1, 4), rng.randint(1, 5)
        gold = [tuple(rng.randint(0, 2) for _ in range(width)) for _ in range(height)]
        perm = list(range(width))
        rng.shuffle(perm)
        pred = [tuple(row[i] for i in perm) for row in gold]
        rng.shuffle(pred)
        if rng.random() < 0.5:  # perturb one cell
            r, c = rng.randrange(height), rng.randrange(width)
            pred[r] = pred[r][:c] + (rng.randint(0, 2),) + pred[r][c + 1:]
        for order in (False, True):
            expected = any(
                (([tuple(row[i] for i in p) for row in pred] == gold) if order else
                 Counter(tuple(row[i] for i in p) for row in pred) == Counter(gold))
                for p in itertools.permutations(range(width)))
            assert spider(pred, gold, order_matters=order) is expected, (pred, gold, order)


def test_identical_columns_do_not_blow_up_the_search():
    # 12 all-NULL columns and a permuted key column: 12! naive permutations, one real choice.
    gold = [(i,) + (None,) * 12 for i in range(50)]
    pred = [(None,) * 6 + (i,) + (None,) * 6 for i in range(50)]
    assert spider(pred, gold)
    assert not spider([(None,) * 6 + (i + 1,) + (None,) * 6 for i in range(50)], gold)


def test_search_bound_gives_up_as_mismatch(monkeypatch):
    gold = [(1, 2, 3), (2, 3, 1), (3, 1, 2)]
    pred = [(1, 3, 2), (2, 1, 3), (3, 2, 1)]
    monkeypatch.setattr(compare, "MAX_SEARCH_STEPS", 1)
    assert not spider(pred, gold)


def test_different_column_counts():
    assert not spider([(1, 2)], [(1,)])
    assert not bird([(1, 2)], [(1,)])


def test_different_row_counts():
    assert not spider([(1,), (2,)], [(1,), (2,), (3,)])
    assert not bird([(1,), (2,)], [(1,), (2,), (3,)])


# ----------------------------------------------------------------------------- duplicates
def test_duplicates_matter_for_spider_not_bird():
    gold = [(1,), (1,), (2,)]
    pred = [(1,), (2,), (2,)]
    assert not spider(pred, gold)  # same size, different multiset
    assert bird(pred, gold)        # same set {1, 2}
    assert bird([(1,), (2,)], gold)  # even a different row count
    assert not spider([(1,), (2,)], gold)


# ----------------------------------------------------------------------------- empties
def test_both_empty_match_under_both_rules():
    assert spider([], [])
    assert bird([], [])


def test_empty_vs_nonempty():
    assert not spider([], [(1,)])
    assert not bird([(1,)], [])


# ----------------------------------------------------------------------------- values
def test_int_and_float_compare_equal():
    assert spider([(1, 2.0)], [(1.0, 2)])
    assert bird([(1, 2.0)], [(1.0, 2)])
    assert spider([(Decimal("2.5"),)], [(2.5,)])
    assert not spider([(1.0000001,)], [(1,)])


def test_none_equals_none_and_nothing_else():
    assert spider([(None, 1)], [(None, 1)])
    assert not spider([(None,)], [(0,)])
    assert not spider([(None,)], [("",)])


def test_nan_equals_nan():
    assert spider([(float("nan"), 1)], [(float("nan"), 1)])
    assert bird([(float("nan"),)], [(math.nan,)])
    assert not spider([(float("nan"),)], [(1.0,)])


def test_unhashable_cells_are_compared_by_value():
    gold = [([1, 2], {"a": 1}), ([3], {"a": 2})]
    assert spider([([3], {"a": 2}), ([1, 2], {"a": 1})], gold)
    assert bird([([1, 2], {"a": 1}), ([3], {"a": 2})], gold)
    assert not spider([([1, 2], {"a": 1}), ([3], {"a": 3})], gold)


def test_rows_as_lists_are_accepted():
    assert spider([[1, "a"]], [(1, "a")])


def test_rule_given_as_string():
    assert results_match([(1,)], [(1,)], rule="bird")
    with pytest.raises(ValueError):
        results_match([(1,)], [(1,)], rule="nope")


# ----------------------------------------------------------------------------- explanations
def test_describe_mismatch_sentences():
    assert describe_mismatch([(1,)] * 3, [(1,)] * 4, rule=SPIDER) == "3 rows vs 4 expected"
    assert describe_mismatch([(1, 2)], [(1,)], rule=SPIDER) == "2 columns vs 1 expected"
    assert "different order" in describe_mismatch([(2,), (1,)], [(1,), (2,)], rule=SPIDER,
                                                  order_matters=True)
    assert "different values" in describe_mismatch([(3,)], [(1,)], rule=SPIDER)
    assert describe_mismatch([(1,), (3,)], [(1,), (2,)], rule=BIRD) == (
        "2 distinct rows vs 2 expected (1 expected missing, 1 unexpected)")


# ----------------------------------------------------------------------------- ORDER BY
@pytest.mark.parametrize("sql, expected", [
    ("SELECT name FROM singer ORDER BY age DESC", True),
    ("select name from singer order by age limit 3", True),
    ("SELECT name FROM singer", False),
    ("SELECT name FROM singer LIMIT 3", False),
    # ORDER BY only inside a subquery: the outer rows have no defined order.
    ("SELECT name FROM singer WHERE age = (SELECT age FROM singer ORDER BY age DESC LIMIT 1)",
     False),
    ("SELECT name FROM (SELECT name FROM singer ORDER BY age) AS t", False),
    ("WITH c AS (SELECT name FROM singer ORDER BY age) SELECT name FROM c", False),
    # The ORDER BY of a set operation sorts the whole result.
    ("SELECT name FROM singer UNION SELECT name FROM actor ORDER BY name", True),
    ("SELECT name FROM singer EXCEPT SELECT name FROM actor ORDER BY 1 LIMIT 2", True),
    ("SELECT name FROM singer UNION SELECT name FROM (SELECT name FROM actor ORDER BY name)",
     False),
    ("WITH c AS (SELECT name FROM singer) SELECT name FROM c ORDER BY name", True),
    ("(SELECT name FROM singer ORDER BY name)", True),
])
def test_gold_has_order_by(sql, expected):
    assert gold_has_order_by(sql) is expected


def test_gold_has_order_by_falls_back_to_the_substring_rule():
    # Unparseable SQL: the official rule ("order by" anywhere, case-insensitive) decides.
    assert gold_has_order_by("SELECT FROM WHERE ))) ORDER\n BY x") is True
    assert gold_has_order_by("SELECT FROM WHERE )))") is False


def test_gold_has_order_by_other_dialect():
    assert gold_has_order_by("SELECT a FROM t QUALIFY ROW_NUMBER() OVER (ORDER BY a) = 1",
                             "duckdb") is False
    assert gold_has_order_by("SELECT a FROM t ORDER BY a NULLS LAST", "duckdb") is True
