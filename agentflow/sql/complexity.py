"""Cost bounds on the guard's parse tree: how deep it is, and how large it grows once the engine
inlines its CTEs and derived tables.

Why: some statements are cheap to write and ruinous to *prepare*. Thirty nested CTEs, each
``SELECT s || s AS s FROM`` the previous one, are 1.5 KB of text, but SQLite's query flattener
substitutes every reference to ``s`` by a copy of the expression behind it, so the statement's
expression tree doubles at every level (2^30 nodes). All of that happens inside
``sqlite3_prepare``: the progress handler is first called when the statement starts stepping,
and ``interrupt()`` is not looked at while flattening, so a 2 s limit ran 9.5 s and 1.3 GB
before the process-wide heap limit failed an allocation. PostgreSQL pulls subqueries up the
same way. No engine limit applies before that work is done, so the guard measures it first:

* ``MAX_TREE_DEPTH``: a 7,000-term ``a || a || ...`` chain parses (sqlglot builds binary
  operators in a loop) into a tree 7,000 deep, which every later step walks recursively
  (writing it out, the bounds, the engine's parser): 6.5 s of CPU and then a RecursionError.
* ``MAX_EXPANDED_NODES``: the number of expression nodes once every column of a CTE or derived
  table is replaced by the expression that defines it, computed in one pass over the tree
  (each CTE is sized once, so the check is linear in the text, however large the expansion).

The estimate errs on the large side (an unqualified name that matches several sources counts
the largest); the caps are far above any benchmark query (see tests/sql/test_complexity.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from agentflow.sql.errors import QueryTooComplexError

# The deepest parse tree a query may have. Spider's gold queries are at most ~20 deep; a
# chain of 140 ORs or ||s is still allowed (sqlglot writes a tree out
# recursively, and failed at ~240 levels).
MAX_TREE_DEPTH = 150
# Expression nodes after inlining. 2^17 leaves of the doubling chain (~260k nodes) took SQLite
# 0.3 s and ~90 MB to prepare; 50k nodes is under 0.1 s and 20 MB, and over 100x the largest
# expansion among Spider's gold queries.
MAX_EXPANDED_NODES = 50_000

# The deepest tree that is written out to run. DuckDB's size checks nest three levels per
# ``||`` (``bounds.bound_growth``), and sqlglot's generator recursed past Python's stack at
# ~240 levels.
MAX_RUN_DEPTH = 200

_HUGE = 1 << 62  # sizes stop growing here, so a 1,000-level chain stays cheap arithmetic


def check_complexity(tree: exp.Expr, sql: str) -> None:
    """Raise ``QueryTooComplexError`` when ``tree`` is deeper than ``MAX_TREE_DEPTH`` or
    expands past ``MAX_EXPANDED_NODES`` expression nodes once CTEs and subqueries are inlined."""
    depth = tree_depth(tree)
    if depth > MAX_TREE_DEPTH:
        raise QueryTooComplexError(
            f"query too deeply nested ({depth} levels of expressions; at most "
            f"{MAX_TREE_DEPTH}; a chain of OR, || or UNION nests one level per term): write "
            "long chains as IN (...) or concat(...)",
            sql=sql)
    size = expanded_size(tree)
    if size > MAX_EXPANDED_NODES:
        shown = f"{size:,}" if size < _HUGE else "more than 10^18"
        raise QueryTooComplexError(
            f"query too large once its CTEs and subqueries are inlined ({shown} expression "
            f"nodes; at most {MAX_EXPANDED_NODES:,}): a column defined from other columns "
            "is copied wherever it is used, so using it several times at every level grows "
            "the statement exponentially", sql=sql)


def check_run_depth(tree: exp.Expr, sql: str) -> None:
    """Raise ``QueryTooComplexError`` when the tree that will run (after the size checks are
    added) is too deep to write out."""
    depth = tree_depth(tree)
    if depth > MAX_RUN_DEPTH:
        raise QueryTooComplexError(
            f"query too deeply nested once each concatenation is size-checked ({depth} levels; "
            f"at most {MAX_RUN_DEPTH}): join many values with one concat(...) rather than a "
            "long chain of ||", sql=sql)


def tree_depth(tree: exp.Expr) -> int:
    """The depth of the parse tree, without recursion (the tree may be thousands deep)."""
    deepest = 0
    stack: list[tuple[exp.Expr, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
        for child in node.iter_expressions():
            stack.append((child, depth + 1))
    return deepest


@dataclass
class _Relation:
    """The output columns of a CTE or derived table, each with its expanded size."""

    columns: list[tuple[str, int]] = field(default_factory=list)
    by_name: dict[str, int] = field(default_factory=dict)
    unnamed: int = 0  # the largest column without a name (``s || s`` with no alias)
    cost: int = 0  # the whole query's expanded nodes: what each reference to it copies

    def add(self, name: str, size: int) -> None:
        self.columns.append((name, size))
        if name:
            self.by_name[name] = max(size, self.by_name.get(name, 0))
        else:
            self.unnamed = max(self.unnamed, size)

    def largest(self) -> int:
        return max([self.unnamed, *self.by_name.values()], default=1) or 1

    def renamed(self, names: list[str]) -> _Relation:
        """Columns renamed by position (``WITH a(x, y) AS``, ``AS t(x, y)``)."""
        out = _Relation(cost=self.cost)
        for i, (name, size) in enumerate(self.columns):
            out.add(names[i] if i < len(names) else name, size)
        return out


# alias -> the relation behind it; None for a base table (its columns are size 1)
_Frame = dict[str, _Relation | None]


def expanded_size(tree: exp.Expr) -> int:
    """Expression nodes of the whole statement once each reference to a CTE's or derived
    table's column is replaced by that column's (expanded) expression."""
    _rel, cost = _query(tree, {}, [])
    return cost


def _query(node: exp.Expr, ctes: dict[str, _Relation], outer: list[_Frame],
           ) -> tuple[_Relation, int]:
    """The output relation of a query node and its total expanded cost.

    The relation's own ``cost`` leaves out its output columns: where it is inlined, a
    column costs what it is at each use, and one never used is dropped."""
    if isinstance(node, exp.Subquery):
        rel, cost = _query(node.this, ctes, outer)
        return _aliased(rel, node), cost
    with_ = node.args.get("with_") or node.args.get("with")
    if isinstance(with_, exp.With):
        ctes = dict(ctes)
        for cte in with_.expressions:
            # charged where it is used (each use copies it); a recursive self-reference
            # inside it is a table
            rel, _c = _query(cte.this, ctes, outer)
            ctes[cte.alias_or_name.lower()] = _aliased(rel, cte)
    if isinstance(node, exp.Select):
        return _select(node, ctes, outer)
    elif isinstance(node, exp.SetOperation):
        left, lc = _query(node.left, ctes, outer)
        right, rc = _query(node.right, ctes, outer)
        rel = _Relation()
        for i, (name, size) in enumerate(left.columns):
            other = right.columns[i][1] if i < len(right.columns) else 0
            rel.add(name, max(size, other))
        extra = 0
        for key in ("order", "limit", "offset"):
            arg = node.args.get(key)
            if isinstance(arg, exp.Expression):
                extra = _add(extra, _expr(arg, ctes, outer))
        rel.cost = _add(_add(left.cost, right.cost), extra)
        return rel, _add(_add(lc, rc), extra)
    # VALUES and anything else: its own nodes, no inlining
    rel, c = _Relation(), _expr(node, ctes, outer)
    first = next(iter(node.find_all(exp.Tuple)), None)
    for value in (first.expressions if first is not None else []):
        rel.add("", _expr(value, ctes, outer))
    rel.cost = c
    return rel, c


def _select(node: exp.Select, ctes: dict[str, _Relation], outer: list[_Frame],
            ) -> tuple[_Relation, int]:
    frame: _Frame = {}
    cost = 0
    sources: list[exp.Expression] = []
    from_ = node.args.get("from_") or node.args.get("from")
    if isinstance(from_, exp.From):
        sources.append(from_.this)
    for join in node.args.get("joins") or []:
        sources.append(join.this)
        on = join.args.get("on")
        if isinstance(on, exp.Expression):
            sources.append(on)  # sized after the frame is complete, below
    conditions: list[exp.Expression] = []
    for source in sources:
        if isinstance(source, exp.Table) and not isinstance(source.this, exp.Func):
            name = source.name.lower()
            rel = ctes.get(name) if not source.db else None
            frame[source.alias_or_name.lower()] = _aliased(rel, source) if rel else None
            if rel is not None:
                cost = _add(cost, rel.cost)  # inlined here: a copy of the CTE's body
        elif isinstance(source, exp.Subquery):
            rel, _c = _query(source, ctes, [frame, *outer])  # LATERAL may see the left
            cost = _add(cost, rel.cost)
            frame[source.alias_or_name.lower()] = rel
        elif isinstance(source, (exp.Table, exp.Unnest, exp.Lateral, exp.Values)):
            conditions.append(source)  # table functions: their arguments' nodes
            frame[source.alias_or_name.lower()] = None
        else:
            conditions.append(source)  # a join condition
    frames = [frame, *outer]
    out = _Relation()
    projected = 0
    for projection in node.expressions:
        star = projection if isinstance(projection, exp.Star) else (
            projection if isinstance(projection, exp.Column) and
            isinstance(projection.this, exp.Star) else None)
        if star is not None:
            table = star.table.lower() if isinstance(star, exp.Column) else ""
            for alias, rel in frame.items():
                if table and alias != table:
                    continue
                for name, size in (rel.columns if rel is not None else [("", 1)]):
                    out.add(name, size)
                    projected = _add(projected, size)
            continue
        size = _expr(projection, ctes, frames)
        out.add(projection.alias_or_name.lower(), size)
        projected = _add(projected, size)
    for condition in conditions:
        cost = _add(cost, _expr(condition, ctes, frames))
    for key, arg in node.args.items():
        if key in ("expressions", "from_", "from", "joins", "with_", "with"):
            continue
        for value in (arg if isinstance(arg, list) else [arg]):
            if isinstance(value, exp.Expression):
                cost = _add(cost, _expr(value, ctes, frames))
    out.cost = cost
    return out, _add(cost, projected)


def _expr(node: exp.Expr, ctes: dict[str, _Relation], frames: list[_Frame]) -> int:
    """Nodes of an expression, a column of a CTE or derived table counting as its size."""
    total = 0
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, exp.Identifier):
            continue
        if isinstance(current, exp.Column) and not isinstance(current.this, exp.Star):
            total = _add(total, _resolve(frames, current.table.lower(), current.name.lower()))
            continue
        if isinstance(current, (exp.Select, exp.SetOperation, exp.Subquery)):
            _rel, c = _query(current, ctes, frames)
            total = _add(total, c)
            continue
        total += 1
        stack.extend(current.iter_expressions())
    return total


def _resolve(frames: list[_Frame], table: str, name: str) -> int:
    """The size a column reference stands for (1 for a base table's column)."""
    for frame in frames:
        if table:
            if table in frame:
                rel = frame[table]
                return 1 if rel is None else rel.by_name.get(name, rel.largest())
            continue
        hits = [rel.by_name[name] for rel in frame.values()
                if rel is not None and name in rel.by_name]
        if hits:
            return max(hits)
        if any(rel is None for rel in frame.values()):
            return 1  # most likely the base table's own column
    # not found by name: it may be a column without an alias, or an output alias
    return max([rel.largest() for frame in frames for rel in frame.values()
                if rel is not None] or [1])


def _aliased(rel: _Relation | None, node: exp.Expr) -> _Relation:
    rel = rel if rel is not None else _Relation()
    alias = node.args.get("alias")
    names = [c.name.lower() for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
    return rel.renamed(names) if names else rel


def _add(a: int, b: int) -> int:
    return min(a + b, _HUGE)
