"""The statement allow-list: exactly one read-only query, checked with sqlglot before execution.

This is the second line of defence; the first is the read-only connection (see ``database``).
The guard exists so that a rejected statement gets a clear reason instead of an engine error,
and so that engines whose read-only mode still allows side effects (DuckDB can read files,
SQLite can ATTACH another file) are covered too.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from agentflow.sql.errors import RejectedStatementError, SqlSyntaxError

# Nodes that must not appear anywhere in the tree (a SELECT can hide DML in a CTE on some engines).
_FORBIDDEN_NODES: tuple[type[exp.Expression], ...] = tuple(
    getattr(exp, name)
    for name in (
        "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "AlterColumn",
        "TruncateTable", "Pragma", "Attach", "Detach", "Copy", "Command", "Set", "Use",
        "Transaction", "Commit", "Rollback", "Grant", "Into", "LoadData", "Export", "Install",
        "Summarize", "Describe", "Cache", "Uncache", "Refresh", "Analyze",
    )
    if hasattr(exp, name)
)

# Functions that read or write files, load code, or touch the host (lower-case names).
_FORBIDDEN_FUNCTIONS = frozenset({
    "load_extension", "readfile", "writefile", "edit", "fts3_tokenizer",
    "read_csv", "read_csv_auto", "read_parquet", "parquet_scan", "read_json", "read_json_auto",
    "read_json_objects", "read_ndjson", "read_ndjson_auto", "read_ndjson_objects", "read_text",
    "read_blob", "read_xlsx", "glob", "sniff_csv", "sqlite_scan", "sqlite_attach", "iceberg_scan",
    "delta_scan", "parquet_metadata", "parquet_schema", "duckdb_secrets", "getenv",
    "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "lo_import", "lo_export", "load_file",
})

# sqlglot parses several of these into dedicated nodes rather than Anonymous functions.
_FORBIDDEN_FUNCTION_NODES: tuple[type[exp.Expression], ...] = tuple(
    getattr(exp, name) for name in ("ReadCSV", "ReadParquet") if hasattr(exp, name)
)

_QUERY_ROOTS = (exp.Select, exp.SetOperation, exp.Subquery, exp.Values)


def parse_single_query(sql: str, dialect: str | None = None) -> exp.Expression:
    """Parse ``sql`` and return its tree if it is exactly one read-only query, else raise.

    Raises SqlSyntaxError (with line/column) when sqlglot cannot parse it and
    RejectedStatementError when it parses but is not an allowed query.
    """
    if not sql or not sql.strip():
        raise RejectedStatementError("empty SQL statement", sql=sql)
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        raise SqlSyntaxError(
            f"syntax error: {first.get('description') or str(err).splitlines()[0]}",
            sql=sql, line=first.get("line"), column=first.get("col"),
        ) from err
    except TokenError as err:
        raise SqlSyntaxError(f"syntax error: {err}", sql=sql) from err
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
    for node in tree.walk():
        if isinstance(node, _FORBIDDEN_NODES):
            raise RejectedStatementError(
                f"{_describe(node)} is not allowed inside a query", sql=sql)
        if isinstance(node, _FORBIDDEN_FUNCTION_NODES):
            raise RejectedStatementError(
                f"function {_describe(node)} reads files and is not allowed", sql=sql)
        if isinstance(node, exp.Func):
            name = _function_name(node)
            if name in _FORBIDDEN_FUNCTIONS:
                raise RejectedStatementError(
                    f"function {name}() touches files or extensions and is not allowed", sql=sql)
    return tree


def check_query(sql: str, dialect: str | None = None) -> None:
    """Raise unless ``sql`` is a single read-only query (see ``parse_single_query``)."""
    parse_single_query(sql, dialect)


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return node.sql_name().lower()


def _describe(node: exp.Expression) -> str:
    if isinstance(node, exp.Command):
        return f"{str(node.this).upper()} command"
    if isinstance(node, exp.Into):
        return "SELECT ... INTO"
    return f"{node.key.upper()} statement" if not isinstance(node, exp.Func) else node.key.upper()
