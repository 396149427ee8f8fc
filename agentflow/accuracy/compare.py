"""Judging whether two query results are "the same answer" — pure, no database.

Two official rules exist and published numbers are only comparable under the rule they used:

* ``MatchRule.BIRD`` — the BIRD evaluator: ``set(pred) == set(gold)`` over row tuples. Row
  order, duplicates and (for empty results) column counts are ignored; column order is not.
* ``MatchRule.SPIDER`` — the Spider test-suite evaluator (``result_eq`` in exec_eval.py): rows
  compared as multisets (as lists when the gold query has ORDER BY), and the prediction may
  list its columns in any order, as long as one column permutation fits every row.

Cell values compare with Python equality (``1 == 1.0 == True``), as both official evaluators do.
Two deliberate, documented refinements: NaN equals NaN (SQLite never yields NaN, DuckDB can,
and a "NaN != NaN" verdict would punish a correct query for an IEEE quirk), and unhashable
cells (DuckDB LIST/STRUCT/MAP values) are frozen into hashable equivalents instead of crashing.
NULL (``None``) equals NULL, as in the official evaluators.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from functools import lru_cache
from itertools import chain
from typing import Any

import sqlglot
from sqlglot import exp

Row = tuple[Any, ...]

# The Spider column-permutation search is exponential in the worst case (many columns with the
# same value multiset). After this many search steps (one step = one tentative column
# assignment checked against every row) the search gives up and the results count as different.
# Real results never get near it: equal-multiset columns are rare and pruned row-wise at once.
MAX_SEARCH_STEPS = 10_000

_ORDER_BY_TEXT = re.compile(r"\border\s+by\b", re.IGNORECASE)

# Cell types that are hashable and compare sanely as they come from the drivers.
_PLAIN_TYPES: frozenset[type] = frozenset(
    {int, str, bool, bytes, type(None), date, datetime, time, timedelta})


class MatchRule(str, Enum):
    """Which official evaluator's notion of "same result" to apply."""

    SPIDER = "spider"
    BIRD = "bird"


# ----------------------------------------------------------------------------- public API
def results_match(pred_rows: Iterable[Sequence[Any]], gold_rows: Iterable[Sequence[Any]], *,
                  rule: MatchRule | str, order_matters: bool = False) -> bool:
    """Whether the predicted rows answer the question the way the gold rows do.

    ``order_matters`` is only used by the Spider rule (BIRD ignores order by definition); pass
    ``gold_has_order_by(gold_sql)`` for it, as the Spider evaluator does.
    """
    rule = MatchRule(rule)
    pred = _as_tuples(pred_rows)
    gold = _as_tuples(gold_rows)
    if rule is MatchRule.SPIDER and len(pred) != len(gold):
        return False  # decided by shape alone; skip the NaN scan below
    # Fast path on the raw values; normalising costs a pass over every cell, so it is only
    # paid when the raw comparison cannot be trusted (an unhashable cell or a NaN).
    try:
        if _match(pred, gold, rule, order_matters):
            return True
    except TypeError:  # an unhashable cell
        pass
    else:
        # NaN only matters when both sides hold one (the NaN marker equals nothing else).
        if not (_has_nan(gold) and _has_nan(pred)):
            return False
    return _match(_normalize(pred), _normalize(gold), rule, order_matters)


def describe_mismatch(pred_rows: Iterable[Sequence[Any]], gold_rows: Iterable[Sequence[Any]], *,
                      rule: MatchRule | str, order_matters: bool = False) -> str:
    """One human sentence saying how two results differ (call it only after a mismatch)."""
    rule = MatchRule(rule)
    pred = _normalize(_as_tuples(pred_rows))
    gold = _normalize(_as_tuples(gold_rows))
    p_width = len(pred[0]) if pred else 0
    g_width = len(gold[0]) if gold else 0
    if _match(_rounded(pred), _rounded(gold), rule, order_matters):
        return FLOAT_ROUNDING
    if rule is MatchRule.BIRD:
        p_set, g_set = set(pred), set(gold)
        if pred and gold and p_width != g_width:
            return f"{_n(p_width, 'column')} vs {g_width} expected"
        missing, extra = len(g_set - p_set), len(p_set - g_set)
        return (f"{_n(len(p_set), 'distinct row')} vs {len(g_set)} expected "
                f"({missing} expected missing, {extra} unexpected)")
    if len(pred) != len(gold):
        return f"{_n(len(pred), 'row')} vs {len(gold)} expected"
    if p_width != g_width:
        return f"{_n(p_width, 'column')} vs {g_width} expected"
    if order_matters and _spider_eq(pred, gold, order_matters=False):
        return "same rows in a different order (the gold query has ORDER BY)"
    return f"same shape ({_n(len(gold), 'row')} x {_n(g_width, 'column')}), different values"


# How a mismatch reads when the rows agree once floats are rounded to ROUNDING_DIGITS
# significant digits: the same sum or average added up in another order (DuckDB's parallel
# aggregation, PostgreSQL's exact NUMERIC), not another answer. The verdict stays a mismatch,
# as in the official evaluators, which compare floats exactly.
ROUNDING_DIGITS = 9
FLOAT_ROUNDING = (f"same rows up to floating-point rounding (equal to {ROUNDING_DIGITS} "
                  "significant digits: a sum or average added up in another order)")


def _rounded(rows: list[Row]) -> list[Row]:
    return [tuple(_round(v) for v in row) for row in rows]


def _round(v: Any) -> Any:
    if type(v) is float or isinstance(v, Decimal):
        if v != v or v in (float("inf"), float("-inf")):
            return v
        return float(f"{float(v):.{ROUNDING_DIGITS}g}")
    return v


@lru_cache(maxsize=8192)
def gold_has_order_by(gold_sql: str, dialect: str = "sqlite") -> bool:
    """Whether the outermost query orders its rows, i.e. whether row order is part of the answer.

    The official Spider evaluator uses ``"order by" in sql.lower()``, which also fires for an
    ORDER BY inside a subquery (``WHERE x = (SELECT ... ORDER BY ... LIMIT 1)``) and so demands
    an order the question never asked for; parsing avoids that. The ORDER BY of a set operation
    (``... UNION ... ORDER BY``) belongs to the whole union and counts. When sqlglot cannot
    parse the SQL the official substring rule decides (whitespace-tolerant: ``ORDER\\nBY``).
    Cached: a harness asks this for the same gold query once per prediction.
    """
    try:
        node: exp.Expr | None = sqlglot.parse_one(gold_sql, read=dialect)
    except Exception:  # sqlglot raises several error types, and RecursionError on deep nesting
        node = None
    if not isinstance(node, exp.Query):
        return bool(_ORDER_BY_TEXT.search(gold_sql))
    while True:
        if node.args.get("order") is not None:
            return True
        if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Query):
            node = node.this  # a parenthesised top-level query: look inside
            continue
        return False


# ----------------------------------------------------------------------------- rules
def _match(pred: list[Row], gold: list[Row], rule: MatchRule, order_matters: bool) -> bool:
    if rule is MatchRule.BIRD:
        return pred == gold or set(pred) == set(gold)
    return _spider_eq(pred, gold, order_matters)


def _same_multiset(a: Iterable[Any], b: Iterable[Any]) -> bool:
    # dict.__eq__ runs in C; Counter.__eq__ loops in Python (both sides hold positive counts
    # only, so plain dict equality is multiset equality).
    return dict.__eq__(Counter(a), Counter(b))


def _spider_eq(pred: list[Row], gold: list[Row], order_matters: bool) -> bool:
    """Spider test-suite equality: some column permutation of pred equals gold row-wise."""
    if not pred and not gold:
        return True
    n_rows = len(gold)
    if len(pred) != n_rows:
        return False
    width = len(gold[0])
    if len(pred[0]) != width:
        return False
    if pred == gold:  # the identity permutation in the same order: the usual correct case
        return True
    if not order_matters and _same_multiset(pred, gold):
        return True
    if width == 1:  # the identity was the only permutation
        return False
    # Any column permutation keeps the multiset of all cells; a cheap test that rejects most
    # wrong answers before the columns are transposed.
    if not _same_multiset(chain.from_iterable(pred), chain.from_iterable(gold)):
        return False
    gold_cols = list(zip(*gold))
    pred_cols = list(zip(*pred))
    if order_matters:
        # Rows equal as lists under some permutation <=> every gold column equals, value by
        # value, a distinct pred column <=> the columns are equal as a multiset of sequences.
        return _same_multiset(pred_cols, gold_cols)
    return _permutation_exists(pred_cols, gold_cols, n_rows)


def _permutation_exists(pred_cols: list[Row], gold_cols: list[Row], n_rows: int) -> bool:
    """Backtracking search for a column bijection under which the row multisets agree.

    Identical columns are merged first (a group of k identical gold columns can only map to k
    identical pred columns, and which one goes where does not matter), which removes the
    blow-up of, e.g., several all-NULL columns. A pred column is a candidate for a gold column
    only when both have the same value multiset and multiplicity. Each tentative assignment
    refines a per-row class id shared by both sides; the assignment survives only while the
    multisets of row ids agree, which prunes wrong pairings after one pass over the rows.
    """
    gold_groups = Counter(gold_cols)
    pred_groups = Counter(pred_cols)
    if len(gold_groups) != len(pred_groups):
        return False
    pred_distinct = list(pred_groups)

    # Classes of pred columns with equal (multiplicity, value multiset): [mult, counts, members]
    classes: list[tuple[int, dict[Any, int], list[int]]] = []

    def find_class(mult: int, counts: dict[Any, int]) -> int:
        for index, (c_mult, c_counts, _) in enumerate(classes):
            if c_mult == mult and len(c_counts) == len(counts) and c_counts == counts:
                return index
        return -1

    for index, col in enumerate(pred_distinct):
        mult, counts = pred_groups[col], dict(Counter(col))
        found = find_class(mult, counts)
        if found < 0:
            classes.append((mult, counts, [index]))
        else:
            classes[found][2].append(index)
    gold_items: list[tuple[Row, list[int]]] = []
    demand = [0] * len(classes)
    for col, mult in gold_groups.items():
        found = find_class(mult, dict(Counter(col)))
        if found < 0:
            return False
        demand[found] += 1
        gold_items.append((col, classes[found][2]))
    if any(demand[i] != len(members) for i, (_, _, members) in enumerate(classes)):
        return False
    # Columns with a single candidate are forced: check them all in one pass over the rows
    # (for the usual case, a plain reordering of distinct columns, this is the whole job).
    forced = [(col, cands[0]) for col, cands in gold_items if len(cands) == 1]
    open_items = sorted((item for item in gold_items if len(item[1]) > 1),
                        key=lambda item: len(item[1]))
    used = [False] * len(pred_distinct)
    if forced:
        gold_keys = list(zip(*(col for col, _ in forced)))
        pred_keys = list(zip(*(pred_distinct[cand] for _, cand in forced)))
        if not open_items:
            return _same_multiset(gold_keys, pred_keys)
        ids: dict[Any, int] = {}
        start_gold = [ids.setdefault(key, len(ids)) for key in gold_keys]
        start_pred = [ids.get(key, -1) for key in pred_keys]
        if not _same_multiset(start_gold, start_pred):
            return False
        for _, cand in forced:
            used[cand] = True
    else:
        start_gold = start_pred = [0] * n_rows

    steps = 0

    def search(depth: int, gold_ids: list[int], pred_ids: list[int]) -> bool:
        nonlocal steps
        if depth == len(open_items):
            return True
        gold_col, cands = open_items[depth]
        for cand in cands:
            if used[cand]:
                continue
            steps += 1
            if steps > MAX_SEARCH_STEPS:
                raise _SearchExhausted
            # Row class ids after this assignment, in one id space shared by both sides;
            # a pred (class, value) pair that no gold row has gets -1 and cannot balance.
            ids: dict[tuple[int, Any], int] = {}
            new_gold = [ids.setdefault(pair, len(ids)) for pair in zip(gold_ids, gold_col)]
            new_pred = [ids.get(pair, -1) for pair in zip(pred_ids, pred_distinct[cand])]
            if not _same_multiset(new_gold, new_pred):
                continue
            used[cand] = True
            if search(depth + 1, new_gold, new_pred):
                return True
            used[cand] = False
        return False

    try:
        return search(0, start_gold, start_pred)
    except _SearchExhausted:
        return False


class _SearchExhausted(Exception):
    """Raised inside the permutation search when it passes MAX_SEARCH_STEPS."""


# ----------------------------------------------------------------------------- values
class _NaN:
    """The one value every NaN becomes, so that NaN == NaN (and hashes alike)."""

    _instance: _NaN | None = None

    def __new__(cls) -> _NaN:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "nan"


_NAN = _NaN()


def _as_tuples(rows: Iterable[Sequence[Any]]) -> list[Row]:
    # tuple() of a tuple returns the same object, so driver rows cost nothing here.
    return [row if type(row) is tuple else tuple(row) for row in rows]


def _has_nan(rows: list[Row]) -> bool:
    for row in rows:
        for v in row:
            t = type(v)
            if (t is float and v != v) or (t is Decimal and v.is_nan()):
                return True
    return False


def _normalize(rows: list[Row]) -> list[Row]:
    return [tuple(_freeze(v) for v in row) for row in rows]


def _freeze(v: Any) -> Any:
    """A hashable value equal to exactly the values ``v`` should match."""
    t = type(v)
    if t in _PLAIN_TYPES:
        return v
    if t is float:
        return _NAN if v != v else v
    if isinstance(v, Decimal):
        return _NAN if v.is_nan() else v
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return ("<map>", frozenset((_freeze(k), _freeze(x)) for k, x in v.items()))
    if isinstance(v, (set, frozenset)):
        return frozenset(_freeze(x) for x in v)
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    try:
        hash(v)
    except TypeError:
        return ("<repr>", repr(v))
    return v


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
