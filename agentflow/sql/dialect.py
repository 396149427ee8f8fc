"""Dialect names and transpiling between them (sqlglot does the work)."""

from __future__ import annotations

import sqlglot
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, TokenError, UnsupportedError

from agentflow.sql.errors import QueryTooComplexError, SqlSyntaxError, plain_parse_error

# The SQLAlchemy driver name of ``PlainSQLiteDialect`` (URL ``sqlite+pysqlite_plain:///...``).
PLAIN_SQLITE_DRIVER = "pysqlite_plain"


class PlainSQLiteDialect(SQLiteDialect_pysqlite):
    """pysqlite with the SQL functions of plain ``sqlite3`` and nothing more.

    SQLAlchemy's pysqlite dialect registers Python ``regexp()`` and ``floor()`` on every
    connection it opens. The official Spider and BIRD evaluators run plain ``sqlite3``, where
    ``x REGEXP y`` is an error ("no such function: regexp", raised when the statement is
    prepared), so a prediction using it must fail here too — in judging and in the execution
    feedback the pipelines give the model. ``floor()`` then is SQLite's own (built in since
    3.35 when the math functions are compiled in, as in CPython's bundled SQLite), exactly as
    for the official evaluators on the same SQLite.
    """

    supports_statement_cache = True

    def on_connect(self) -> None:  # type: ignore[override]  # None: no per-connection hook
        return None  # the parent's hook does nothing but register regexp() and floor()


registry.register(f"sqlite.{PLAIN_SQLITE_DRIVER}", __name__, "PlainSQLiteDialect")

# SQLAlchemy dialect name -> sqlglot dialect name, where they differ.
_SQLALCHEMY_TO_SQLGLOT = {"postgresql": "postgres", "mssql": "tsql", "mariadb": "mysql"}


# Engines where a quoted identifier keeps its case ("Country" is not country). SQLite ignores
# case even in quoted names, and `to-postgres` stores names lower-case, so names coming from
# SQLite are lower-cased on the way there (sqlglot's normalisation for SQLite does just that).
_CASE_SENSITIVE_QUOTED = {"postgres"}


# Engines whose LIKE is case-sensitive. SQLite's LIKE ignores (ASCII) case by default, so a
# SQLite query moved there says ILIKE to keep its answer: on chinook_1,
# ``COUNT(*) ... WHERE Name LIKE '%a%'`` is 211 on SQLite but 201 with DuckDB's LIKE. (One
# difference remains: SQLite folds only ASCII letters, ILIKE folds all of Unicode.)
_CASE_SENSITIVE_LIKE = {"duckdb", "postgres"}


def _sqlite_like_semantics(tree: exp.Expr) -> exp.Expr:
    return tree.transform(lambda node: exp.ILike(**node.args) if isinstance(node, exp.Like)
                          else node)


def _sqlite_names_to_lower(tree: exp.Expr) -> exp.Expr:
    from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

    return normalize_identifiers(tree, dialect="sqlite")


def sqlglot_dialect(sqlalchemy_dialect: str) -> str:
    """The sqlglot dialect for a SQLAlchemy dialect name (``postgresql`` -> ``postgres``)."""
    return _SQLALCHEMY_TO_SQLGLOT.get(sqlalchemy_dialect, sqlalchemy_dialect)


def transpile(sql: str, *, read: str, write: str) -> str:
    """Rewrite one statement from dialect ``read`` into ``write``; identity when they match."""
    if read == write:
        return sql
    from agentflow.sql.guard import check_size

    check_size(sql, read)  # bounded text and nesting before the (recursive) parser runs
    try:
        if read == "sqlite" and write in _CASE_SENSITIVE_QUOTED | _CASE_SENSITIVE_LIKE:
            out = []
            for tree in sqlglot.parse(sql, read=read):
                if tree is None or isinstance(tree, exp.Semicolon):
                    continue
                if write in _CASE_SENSITIVE_QUOTED:
                    tree = _sqlite_names_to_lower(tree)
                if write in _CASE_SENSITIVE_LIKE:
                    tree = _sqlite_like_semantics(tree)
                out.append(tree.sql(dialect=write, unsupported_level=ErrorLevel.RAISE))
        else:
            out = sqlglot.transpile(sql, read=read, write=write, unsupported_level=ErrorLevel.RAISE)
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        raise SqlSyntaxError(
            f"cannot parse as {read}: {plain_parse_error(first.get('description') or str(err))}",
            sql=sql,
            line=first.get("line"), column=first.get("col")) from err
    except (TokenError, UnsupportedError) as err:
        raise SqlSyntaxError(f"cannot transpile {read} -> {write}: {err}", sql=sql) from err
    except RecursionError as err:
        raise QueryTooComplexError("query too deeply nested", sql=sql) from err
    if len(out) != 1:
        raise SqlSyntaxError(f"expected one statement, got {len(out)}", sql=sql)
    return out[0]
