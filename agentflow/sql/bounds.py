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
