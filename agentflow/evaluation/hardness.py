"""Spider's hardness levels (easy / medium / hard / extra), computed from the gold SQL with sqlglot.

The rules are those of the official Spider evaluator (``evaluation.py``: ``eval_hardness`` with
``count_component1``, ``count_component2`` and ``count_others``), applied to a sqlglot parse
instead of Spider's own parse tree:

* component 1 — one each for WHERE, GROUP BY, ORDER BY and LIMIT; one per joined table beyond
  the first; one per OR and per LIKE among the JOIN ... ON, WHERE and HAVING conditions;
* component 2 — nested queries: a subquery used as a value in an ON/WHERE/HAVING condition,
  and one for a top-level INTERSECT / UNION / EXCEPT;
* others — one each when there is more than one aggregation, more than one SELECT column,
  more than one WHERE condition, more than one GROUP BY column.

Only the outermost SELECT counts (the left one of a set operation), as in the official script.
Its aggregation count has two quirks that this module keeps so labels match published ones:
a negated WHERE condition (``NOT IN``, ``NOT LIKE``, ``NOT BETWEEN``) counts as an aggregation
(it reads the condition's NOT flag where it meant an aggregation id), and in HAVING every
AND/OR connector and negated condition counts while ``count(*) > 1`` itself does not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

import sqlglot
from sqlglot import exp

HARDNESS_LEVELS = ("easy", "medium", "hard", "extra")

_AGGS = (exp.Count, exp.Sum, exp.Avg, exp.Max, exp.Min)  # Spider's AGG_OPS
_SUBQUERY = (exp.Subquery, exp.Select, exp.SetOperation, exp.Exists)


@dataclass(frozen=True)
class HardnessCounts:
    """The three counts the official rule reads, and the level they give."""

    component1: int
    component2: int
    others: int
    level: str

    def to_dict(self) -> dict:
        return asdict(self)


class HardnessError(ValueError):
    """The SQL cannot be parsed, so its hardness is unknown."""


def spider_hardness(sql: str, dialect: str = "sqlite") -> str:
    """``easy`` | ``medium`` | ``hard`` | ``extra`` for one (gold) query."""
    return hardness_counts(sql, dialect).level


@lru_cache(maxsize=4096)
def hardness_counts(sql: str, dialect: str = "sqlite") -> HardnessCounts:
    try:
        tree = sqlglot.parse_one(sql.strip().rstrip(";"), read=dialect)
    except sqlglot.errors.ParseError as err:
        raise HardnessError(f"cannot parse SQL for hardness: {err}") from None
    if tree is None:
        raise HardnessError("cannot parse SQL for hardness: empty statement")
    tree = _unwrap(tree)
    nested_iue = 0
    if isinstance(tree, exp.SetOperation):
        nested_iue = 1  # the official parser hangs the rest of the chain off the first SELECT
        while isinstance(tree, exp.SetOperation):
            tree = _unwrap(tree.this)
    if not isinstance(tree, exp.Select):
        raise HardnessError(f"not a SELECT query: {type(tree).__name__}")
    c1 = _component1(tree)
    c2 = _component2(tree) + nested_iue
    others = _others(tree)
    return HardnessCounts(c1, c2, others, _level(c1, c2, others))


def _level(c1: int, c2: int, others: int) -> str:
    # eval_hardness, verbatim in logic.
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if ((others > 2 and c1 <= 2 and c2 == 0)
            or (2 < c1 <= 3 and others <= 2 and c2 == 0)
            or (c1 <= 1 and others == 0 and c2 <= 1)):
        return "hard"
    return "extra"


# ------------------------------------------------------------------------------ the parts
def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, (exp.Paren, exp.Subquery)) and isinstance(node.this, exp.Expression):
        node = node.this
    return node


def _from(select: exp.Select) -> exp.Expr | None:
    return select.args.get("from_") or select.args.get("from")


def _conditions(node: exp.Expr | None) -> tuple[list[exp.Expr], int]:
    """The leaf conditions of an AND/OR tree (Spider's cond_units) and its number of ORs."""
    if node is None:
        return [], 0
    if isinstance(node, (exp.Where, exp.Having)):
        node = node.this
    if isinstance(node, exp.Paren) and isinstance(node.this, exp.Connector):
        return _conditions(node.this)
    if isinstance(node, exp.Connector):
        left, ors_l = _conditions(node.this)
        right, ors_r = _conditions(node.expression)
        return left + right, ors_l + ors_r + isinstance(node, exp.Or)
    return [node], 0


def _on_conditions(select: exp.Select) -> tuple[list[exp.Expr], int]:
    leaves: list[exp.Expr] = []
    ors = 0
    for join in select.args.get("joins") or []:
        lv, o = _conditions(join.args.get("on"))
        leaves += lv
        ors += o
    return leaves, ors


def _negated(cond: exp.Expr) -> bool:
    if isinstance(cond, exp.Not):
        return not isinstance(_unwrap_not(cond), exp.Is)  # IS NOT NULL is the 'is' operator
    return bool(cond.args.get("negate"))


def _unwrap_not(cond: exp.Expr) -> exp.Expr:
    while isinstance(cond, exp.Not):
        cond = cond.this
    return cond


def _is_like(cond: exp.Expr) -> bool:
    return isinstance(_unwrap_not(cond), (exp.Like, exp.ILike))


def _walk_outer(node: exp.Expr):
    """Every node under ``node`` without entering nested queries (which are yielded)."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is not node and isinstance(current, _SUBQUERY):
            continue
        stack.extend(current.iter_expressions())


def _subqueries(cond: exp.Expr) -> int:
    if isinstance(_unwrap_not(cond), exp.Exists):
        return 1
    return sum(1 for n in _walk_outer(cond) if n is not cond and isinstance(n, _SUBQUERY)
               and not isinstance(n.parent, (exp.Subquery, exp.Exists)))


def _aggs(node: exp.Expr) -> int:
    return sum(1 for n in _walk_outer(node) if isinstance(n, _AGGS))


def _component1(select: exp.Select) -> int:
    count = 0
    where = select.args.get("where")
    group = select.args.get("group")
    count += where is not None
    count += group is not None and bool(group.expressions)
    count += select.args.get("order") is not None
    count += select.args.get("limit") is not None
    count += len(select.args.get("joins") or [])  # tables beyond the first
    on, on_ors = _on_conditions(select)
    where_c, where_ors = _conditions(where)
    having_c, having_ors = _conditions(select.args.get("having"))
    count += on_ors + where_ors + having_ors
    count += sum(_is_like(c) for c in on + where_c + having_c)
    return count


def _component2(select: exp.Select) -> int:
    on, _ = _on_conditions(select)
    where_c, _ = _conditions(select.args.get("where"))
    having_c, _ = _conditions(select.args.get("having"))
    return sum(_subqueries(c) for c in on + where_c + having_c)


def _others(select: exp.Select) -> int:
    count = 0
    items = select.expressions
    where_c, _ = _conditions(select.args.get("where"))
    having_c, _ = _conditions(select.args.get("having"))
    group = select.args.get("group")
    group_items = list(group.expressions) if group is not None else []
    order = select.args.get("order")
    agg = sum(_aggs(item) > 0 for item in items)
    agg += sum(_negated(c) for c in where_c)  # official quirk: the NOT flag read as an agg
    agg += sum(_aggs(g) > 0 for g in group_items)
    if order is not None:
        # each ORDER BY value has up to two column units, each with its own aggregation
        agg += sum(min(2, _aggs(o)) for o in order.expressions)
    # official quirk: count_agg over the raw HAVING list counts 'and'/'or' and NOT conditions
    agg += max(0, len(having_c) - 1) + sum(_negated(c) for c in having_c)
    count += agg > 1
    count += len(items) > 1
    count += len(where_c) > 1
    count += len(group_items) > 1
    return count
