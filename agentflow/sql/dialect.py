"""Dialect names and transpiling between them (sqlglot does the work)."""

from __future__ import annotations

import sqlglot
from sqlglot.errors import ParseError, TokenError, UnsupportedError

from agentflow.sql.errors import SqlSyntaxError

# SQLAlchemy dialect name -> sqlglot dialect name, where they differ.
_SQLALCHEMY_TO_SQLGLOT = {"postgresql": "postgres", "mssql": "tsql", "mariadb": "mysql"}


def sqlglot_dialect(sqlalchemy_dialect: str) -> str:
    """The sqlglot dialect for a SQLAlchemy dialect name (``postgresql`` -> ``postgres``)."""
    return _SQLALCHEMY_TO_SQLGLOT.get(sqlalchemy_dialect, sqlalchemy_dialect)


def transpile(sql: str, *, read: str, write: str) -> str:
    """Rewrite one statement from dialect ``read`` into ``write``; identity when they match."""
    if read == write:
        return sql
    try:
        out = sqlglot.transpile(sql, read=read, write=write, unsupported_level="raise")
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        raise SqlSyntaxError(
            f"cannot parse as {read}: {first.get('description') or err}", sql=sql,
            line=first.get("line"), column=first.get("col")) from err
    except (TokenError, UnsupportedError) as err:
        raise SqlSyntaxError(f"cannot transpile {read} -> {write}: {err}", sql=sql) from err
    if len(out) != 1:
        raise SqlSyntaxError(f"expected one statement, got {len(out)}", sql=sql)
    return out[0]
