"""Size bounds on the functions that build one huge value from a small input (DuckDB; PostgreSQL
per value, see ``bound_postgres_sizes``).

DuckDB's ``memory_limit`` governs its buffer manager — hash tables, sorts, intermediate
chunks — but the result of one scalar call such as ``repeat('x', 2000000000)`` or
``lpad('x', 2000000000)`` is allocated outside it, filled in one uninterruptible step (measured:
~10-40 s and ~3.9 GB before an interrupt could land). SQLite has a per-connection cap for this
(``SQLITE_LIMIT_LENGTH``); DuckDB has none, so the guard adds one: a literal size above the cap
is rejected before the query runs, and a computed size is wrapped so that DuckDB raises
``error(...)`` instead of allocating. Queries without these functions are left untouched.

The cap is per *value*, but DuckDB evaluates a scalar function a whole vector (2,048 rows) at a
time, and an interrupt lands only between vectors: ``lpad(CAST(range AS VARCHAR), 30000000)``
over ``range(3000)`` built 2,048 values of 30 MB in one step and ran past 90 s on a 1 s limit.
So DuckDB's cap is sized for one vector, ``DUCKDB_VALUE_BYTES`` x 2,048 = 16 MiB per step,
still far above any value a question about a database needs (zero-padded ids, text bars). At
64 KiB (128 MiB a step) a per-row build under the cap overran a 1 s limit by 0.6 s whenever
two other processes held the cores; at 8 KiB it stopped at 1.0 s under the same load.
"""

from __future__ import annotations

import functools

from sqlglot import exp, parse_one

from agentflow.sql.errors import RejectedStatementError

# Largest value (bytes, or list elements) one scalar call may build; SQLite gets the same cap
# through SQLITE_LIMIT_LENGTH.
MAX_VALUE_BYTES = 32 * 1024 * 1024

# DuckDB builds a scalar function's results for a vector of rows (2,048) in one
# uninterruptible step.
DUCKDB_VALUE_BYTES = 8 * 1024  # x 2,048 rows = 16 MiB per step at most

_LIST_RESIZE = {"list_resize", "array_resize"}


def bound_value_sizes(tree: exp.Expr, sql: str, *, dialect: str = "duckdb",
                      cap: int = DUCKDB_VALUE_BYTES) -> str | None:
    """Return the SQL to run with computed sizes bounded, or None when nothing needed it.

    Raises RejectedStatementError when a literal size alone exceeds ``cap``."""
    changed = False
    for node in list(tree.find_all(exp.Repeat, exp.Pad, exp.GenerateSeries, exp.Anonymous)):
        if isinstance(node, exp.Repeat):
            changed |= _bound(node, node.args.get("times"), cap, sql, dialect, unit=node.this)
        elif isinstance(node, exp.Pad):
            changed |= _bound(node, node.args.get("expression"), cap, sql, dialect)
        elif isinstance(node, exp.GenerateSeries):
            if isinstance(node.parent, exp.Table):
                continue  # range() in FROM streams rows and is interruptible
            changed |= _bound(node, node.args.get("end"), cap // 8, sql, dialect,
                              start=node.args.get("start"))
        elif str(node.this).lower() in _LIST_RESIZE and len(node.expressions) >= 2:
            changed |= _bound(node, node.expressions[1], cap // 8, sql, dialect,
                              builds="a list of {size} elements")
    return tree.sql(dialect=dialect) if changed else None


def bound_postgres_sizes(tree: exp.Expr, sql: str, *,
                         cap: int = MAX_VALUE_BYTES) -> str | None:
    """``bound_value_sizes`` for PostgreSQL: ``repeat``/``lpad``/``rpad`` only, per value.

    PostgreSQL builds one value per row and checks for cancels while it does, but the value
    then crosses the network and is decoded by the client in one step no cancel reaches: a
    100 MB ``repeat`` took 5.1 s on a 2 s limit and 350 MB of the client's memory, literal or
    computed (``repeat(t, (SELECT 1000000))``). ``generate_series`` is left alone: in
    PostgreSQL it returns rows, which stream and are capped, not one list value."""
    changed = False
    for node in list(tree.find_all(exp.Repeat, exp.Pad)):
        if isinstance(node, exp.Repeat):
            changed |= _bound(node, node.args.get("times"), cap, sql, "postgres",
                              unit=node.this)
        else:
            changed |= _bound(node, node.args.get("expression"), cap, sql, "postgres")
    return tree.sql(dialect="postgres") if changed else None


def _name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Pad):  # one node for both: name the one the user wrote
        return "lpad" if node.args.get("is_left") else "rpad"
    return node.sql_name().lower()


def _size_expr(arg: exp.Expression, unit: exp.Expression | None,
               start: exp.Expression | None, dialect: str) -> str:
    size = f"({arg.sql(dialect=dialect)})"
    if start is not None:
        size = f"({size} - ({start.sql(dialect=dialect)}))"
    if unit is not None:
        size = f"(length({unit.sql(dialect=dialect)}) * {size})"
    return size


def _literal_size(arg: exp.Expression, unit: exp.Expression | None,
                  start: exp.Expression | None) -> int | None:
    """The size when every part is a literal (so the decision is made before running)."""
    try:
        n = int(float(arg.this)) if isinstance(arg, exp.Literal) and not arg.is_string else None
        if n is None:
            return None
        if start is not None:
            if not (isinstance(start, exp.Literal) and not start.is_string):
                return None
            n -= int(float(start.this))
        if unit is not None:
            if not (isinstance(unit, exp.Literal) and unit.is_string):
                return None
            n *= len(unit.this)
        return n
    except (TypeError, ValueError):
        return None


def _guarded(arg: exp.Expression, size: str, cap: int, dialect: str) -> exp.Expr:
    message = f"value too large: a single value may hold at most {cap} bytes or elements"
    if dialect == "postgres":
        # No error() in PostgreSQL: casting the message to an integer (the size's own type)
        # raises with the message in it. The text holds the size, so the planner cannot fold
        # the cast (and raise) unless the size is a constant, and then it folds the condition
        # first and keeps this branch only when it is taken.
        fail = f"CAST('{message}; asked for ' || CAST({size} AS TEXT) AS INTEGER)"
        return parse_one(f"CASE WHEN {size} > {cap} THEN {fail} "
                         f"ELSE {arg.sql(dialect=dialect)} END", read=dialect)
    return parse_one(f"CASE WHEN {size} > {cap} THEN error('{message}') "
                     f"ELSE {arg.sql(dialect=dialect)} END", read=dialect)


def _bound(node: exp.Func, arg: exp.Expression | None, cap: int, sql: str,
           dialect: str, *, unit: exp.Expression | None = None,
           start: exp.Expression | None = None,
           builds: str = "a value of {size} bytes or elements") -> bool:
    """Reject ``node`` when its size argument ``arg`` is a literal over ``cap``; wrap a
    computed one in a check (in place). True when the tree changed."""
    if arg is None:
        return False
    literal = _literal_size(arg, unit, start)
    if literal is not None:
        if literal > cap:
            raise RejectedStatementError(
                f"{_name(node)}() would build {builds.format(size=f'{literal:,}')}; at most "
                f"{cap:,} are allowed", sql=sql)
        return False
    arg.replace(_guarded(arg, _size_expr(arg, unit, start, dialect), cap, dialect))
    return True


# ------------------------------------------------------------------------ growth without a size
# Concatenation and replacement build values from values: nested CTEs doubling a string with
# ``s || s`` built a 268 MB value (32,768x the cap) in 2.3 s, and ``list_reduce(l, (a, b) ->
# a || b)`` took a server from 212 MB to 1,740 MB, with no size argument anywhere for the
# bounds above to read. Each such result is checked where it is built (a lambda over a
# one-element list evaluates the operands once), so a value can exceed the cap by at most one
# doubling, within one vector step of 2,048 rows: 64 KiB x 2,048 = 128 MiB at most.
DUCKDB_GROWTH_CHARS = 32 * 1024

_GROWTH = tuple(getattr(exp, name) for name in ("DPipe", "Concat", "ConcatWs", "ArrayConcat")
                if hasattr(exp, name))
_LIST_CONCAT = {"list_concat", "list_cat", "array_concat", "array_cat", "concat"}
_VAR = "af_bounded_value"


def bound_growth(tree: exp.Expr, *, cap: int = DUCKDB_GROWTH_CHARS) -> bool:
    """Wrap every concatenation (``||``, ``concat``, ``list_concat``) and replacement
    (``replace``, ``regexp_replace``) of a DuckDB tree in a size check, in place: ``error()``
    past ``cap`` characters (or list elements) instead of building more. True when changed."""
    message = (f"value too large: a concatenated or replaced value may hold at most {cap:,} "
               "characters or elements")
    changed = False
    for node in list(tree.find_all(exp.Func, exp.DPipe)):
        if isinstance(node, (exp.Replace, exp.RegexpReplace)):
            _wrap_replace(node, cap, message)
            changed = True
        elif isinstance(node, _GROWTH) or (isinstance(node, exp.Anonymous) and
                                           str(node.this).lower() in _LIST_CONCAT):
            check = _growth_check(cap, message).copy()
            holder = check.find(exp.Null)
            assert holder is not None
            node.replace(check)
            holder.replace(node)
            changed = True
    return changed


@functools.lru_cache(maxsize=8)
def _growth_check(cap: int, message: str) -> exp.Expr:
    """The size check around one concatenation, parsed once (parsing it per node cost 6.5 s
    for a 7,000-term chain); callers copy it."""
    return parse_one(f"list_transform([NULL], lambda {_VAR}: CASE WHEN length({_VAR}) > {cap} "
                     f"THEN error('{message}') ELSE {_VAR} END)[1]", read="duckdb")


def _wrap_replace(node: exp.Expr, cap: int, message: str) -> None:
    """``replace(s, a, b)`` can build ``length(s) x length(b)`` in one step, so the size is
    checked before, from the operands (evaluated once: the lambda receives them as a list)."""
    if isinstance(node, exp.Replace):
        args = [node.this, node.expression, node.args.get("replacement")]
    else:
        args = [node.this, node.expression, node.args.get("replacement")]
    if any(a is None for a in args):
        return
    v = _VAR
    if isinstance(node, exp.Replace):
        size = f"length({v}[1]) * greatest(1, length({v}[3]))"
        call = f"replace({v}[1], {v}[2], {v}[3])"
    else:
        # a back-reference (\0, \1) copies the match: up to the whole input per replacement
        size = (f"length({v}[1]) * greatest(1, length({v}[3])) * CASE WHEN "
                f"contains({v}[3], '\\') THEN greatest(1, length({v}[1])) ELSE 1 END")
        modifiers = node.args.get("modifiers")
        extra = f", {modifiers.sql(dialect='duckdb')}" if modifiers is not None else ""
        call = f"regexp_replace({v}[1], {v}[2], {v}[3]{extra})"
    check = parse_one(f"list_transform([[NULL, NULL, NULL]], lambda {v}: CASE WHEN {size} > "
                      f"{cap} THEN error('{message}') ELSE {call} END)[1]", read="duckdb")
    holders = list(check.find_all(exp.Null))
    cast_args = [exp.cast(a.copy(), "VARCHAR") for a in args]
    for holder, arg in zip(holders[:3], cast_args):
        holder.replace(arg)
    node.replace(check)
