"""The statement allow-list: exactly one read-only query, checked with sqlglot before execution.

This is the second line of defence; the first is the read-only connection (see ``database``).
The guard exists so that a rejected statement gets a clear reason instead of an engine error,
and so that engines whose read-only mode still allows side effects (DuckDB can read files,
SQLite can ATTACH another file, PostgreSQL's read-only transaction still lets a function
signal a backend or take an advisory lock) are covered too.

Functions are checked against an allow-list (``allowlist``) after their names are
normalised, so a quoted, upper-cased or schema-qualified name gets the same verdict as the
plain one; formatting functions get width/precision caps (``formats``).
"""

from __future__ import annotations

import re
import time

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from agentflow.answer_shape import record_tree
from agentflow.sql.allowlist import check_function, normalised_name
from agentflow.sql.complexity import check_complexity
from agentflow.sql.engine_check import catalog_problem, is_catalog_function
from agentflow.sql.errors import (
    QueryTooComplexError,
    RejectedStatementError,
    SqlSyntaxError,
    plain_parse_error,
)
from agentflow.sql.formats import format_problem

# Parsing is part of a query's budget. sqlglot's parser is linear-ish in the text but far from
# free (a 1.3 MB OR chain took ~12 s; an 84k-character one ~1-2 s of CPU on a busy host), so
# the text is bounded first; 50k characters is ~10x the longest gold query of Spider/BIRD.
MAX_SQL_CHARS = 50_000
# sqlglot parses nested expressions recursively (~20 Python frames per level), so a few dozen
# levels exhaust the interpreter's stack. Benchmark gold queries nest fewer than 10 levels.
MAX_NESTING = 24

# Nodes that must not appear anywhere in the tree (a SELECT can hide DML in a CTE on some engines).
_FORBIDDEN_NODES: tuple[type[exp.Expression], ...] = tuple(
    getattr(exp, name)
    for name in (
        "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "AlterColumn",
        "TruncateTable", "Pragma", "Attach", "Detach", "Copy", "Command", "Set", "Use",
        "Transaction", "Commit", "Rollback", "Grant", "Into", "LoadData", "Export", "Install",
        "Summarize", "Describe", "Cache", "Uncache", "Refresh", "Analyze",
        "Lock",  # SELECT ... FOR UPDATE/SHARE takes row locks other sessions wait on
    )
    if hasattr(exp, name)
)

# DuckDB reads a file named where a table goes (``FROM 'data.csv'``, ``FROM "/etc/passwd"``:
# a "replacement scan"); a table name that looks like a path or URL is refused.
_PATH_LIKE = re.compile(r"[/\\:]|\.(?:csv|tsv|txt|parquet|json|jsonl|ndjson|xlsx|arrow|"
                        r"db|duckdb|sqlite|gz|zst)$", re.IGNORECASE)

_QUERY_ROOTS = (exp.Select, exp.SetOperation, exp.Subquery, exp.Values)


def parse_single_query(sql: str, dialect: str | None = None, *,
                       allow_catalog: bool = False) -> exp.Expression:
    """Parse ``sql`` and return its tree if it is exactly one read-only query, else raise.

    Catalog tables (``pragma_database_list``, ``duckdb_settings()``, ``pg_roles``: server
    paths, settings, other users) are refused unless ``allow_catalog`` (admins, introspection).

    Raises SqlSyntaxError (with line/column) when sqlglot cannot parse it and
    RejectedStatementError when it parses but is not an allowed query.
    """
    if not sql or not sql.strip():
        raise RejectedStatementError("empty SQL statement", sql=sql)
    tokens = check_size(sql, dialect)
    try:
        # A trailing comment becomes an empty statement holding it: not a second statement.
        # The tokens of the size check are parsed (tokenizing is half of the guard's cost).
        parsed = Dialect.get_or_raise(dialect).parser().parse(tokens, sql)
        statements = [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]
    except RecursionError as err:
        raise QueryTooComplexError("query too deeply nested", sql=sql) from err
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        raise SqlSyntaxError(
            "syntax error: "
            + plain_parse_error(first.get("description") or str(err).splitlines()[0]),
            sql=sql, line=first.get("line"), column=first.get("col"),
        ) from err
    except TokenError as err:
        raise SqlSyntaxError(f"syntax error: {err}", sql=sql) from err
    # The pipelines judge each candidate's shape (SELECT *?) from the same parse: hand it on
    # before anything changes the tree (bounds rewrite it for DuckDB and PostgreSQL).
    record_tree(sql, dialect, parsed)
    if not statements:
        raise RejectedStatementError("empty SQL statement", sql=sql)
    if len(statements) > 1:
        raise RejectedStatementError(
            f"exactly one statement is allowed, got {len(statements)}", sql=sql)
    tree = statements[0]
    if not isinstance(tree, _QUERY_ROOTS):
        raise RejectedStatementError(
            f"only read-only queries (SELECT, WITH, UNION/INTERSECT/EXCEPT) are allowed, "
            f"got {_describe(tree)}", sql=sql)
    # before anything walks the tree recursively, and before the engine prepares it
    check_complexity(tree, sql)
    try:
        _check_nodes(tree, sql, dialect, allow_catalog)
    except RecursionError as err:
        raise QueryTooComplexError("query too deeply nested", sql=sql) from err
    return tree


def strip_trailing(sql: str, dialect: str | None = None) -> str:
    """The text of the one statement, without a trailing ``;`` and whatever comment follows,
    nor the empty statements before it (``; SELECT 1``: the guard allows it, as sqlite3 does).

    PostgreSQL runs queries inside ``DECLARE ... CURSOR FOR <query>``, where a ``;`` is an
    error; the other engines do not mind either way."""
    if ";" not in sql:
        return sql  # no statement separator, nothing to tokenize
    start, leading = 0, True
    for token in Dialect.get_or_raise(dialect).tokenize(sql):
        if token.token_type == TokenType.SEMICOLON:
            if leading:
                start = token.end + 1
                continue
            return sql[start: token.start].strip()
        leading = False
    return sql[start:].lstrip() if start else sql


def check_size(sql: str, dialect: str | None = None) -> list[Token]:
    """Reject text longer than ``MAX_SQL_CHARS`` or nested deeper than ``MAX_NESTING``
    parentheses, before anything parses it (the transpiler included); return its tokens.

    Tokenizing is linear and iterative, so this is safe where the recursive parser is not."""
    if len(sql) > MAX_SQL_CHARS:
        raise QueryTooComplexError(
            f"query text is too long ({len(sql):,} characters; at most {MAX_SQL_CHARS:,})",
            sql=sql)
    try:
        tokens = Dialect.get_or_raise(dialect).tokenize(sql)
    except TokenError as err:
        raise SqlSyntaxError(f"syntax error: {err}", sql=sql) from err
    depth = deepest = 0
    for token in tokens:
        if token.token_type == TokenType.L_PAREN:
            depth += 1
            deepest = max(deepest, depth)
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
    if deepest > MAX_NESTING:
        raise QueryTooComplexError(
            f"query too deeply nested ({deepest} levels of parentheses; at most {MAX_NESTING})",
            sql=sql)
    return tokens


def _check_nodes(tree: exp.Expression, sql: str, dialect: str | None,
                 allow_catalog: bool = False) -> None:
    for node in tree.walk():
        if isinstance(node, exp.Table) and not allow_catalog and \
                not isinstance(node.this, exp.Func):  # table functions: the allow-list's
            problem = catalog_problem(dialect or "", node.db, node.name)
            if problem:
                raise RejectedStatementError(problem, sql=sql)
        if isinstance(node, _FORBIDDEN_NODES):
            raise RejectedStatementError(
                f"{_describe(node)} is not allowed inside a query", sql=sql)
        if isinstance(node, exp.Func):
            if allow_catalog and is_catalog_function(dialect or "", normalised_name(node)):
                continue
            verdict = check_function(node, dialect)
            if verdict is not None:
                raise RejectedStatementError(
                    f"function {verdict.name}() {verdict.reason}", sql=sql)
            problem = format_problem(normalised_name(node), node, dialect)
            if problem:
                raise RejectedStatementError(problem, sql=sql)
        elif dialect == "duckdb" and isinstance(node, exp.Table) and \
                isinstance(node.this, exp.Identifier) and _PATH_LIKE.search(node.name):
            raise RejectedStatementError(
                f"table {node.name!r} looks like a file path; DuckDB would read the file, "
                "and a query may only read the database's own tables", sql=sql)


def check_query(sql: str, dialect: str | None = None, *, allow_catalog: bool = False) -> float:
    """Raise unless ``sql`` is a single read-only query (see ``parse_single_query``).

    Returns the seconds the check took, so callers can charge it to the query's budget."""
    start = time.monotonic()
    parse_single_query(sql, dialect, allow_catalog=allow_catalog)
    return time.monotonic() - start


def _describe(node: exp.Expr) -> str:
    if isinstance(node, exp.Command):
        return f"{str(node.this).upper()} command"
    if isinstance(node, exp.Into):
        return "SELECT ... INTO"
    return f"{node.key.upper()} statement" if not isinstance(node, exp.Func) else node.key.upper()
