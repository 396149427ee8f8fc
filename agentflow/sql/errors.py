"""Typed errors of the database layer.

Every failure a caller can act on has its own class, so a pipeline can tell "revise the SQL"
(syntax, unknown column) from "give up" (timeout, rejected statement) without parsing messages.
Each carries a short machine-readable ``kind`` for traces, JSON answers and evaluation reports.
"""

from __future__ import annotations

import re

from agentflow.errors import AgentflowError

# sqlglot says an unfinished query in its own terms: "Required keyword: 'this' missing for
# <class 'sqlglot.expressions.core.Neg'>". A user (and a model revising its SQL) needs the
# SQL word it stopped at; the node names below are the ones a query cut short ends in.
_MISSING_PART = re.compile(r"Required keyword: '\w+' missing for <class '(?:[\w.]*\.)?(\w+)'>")
_NODE_SQL = {"Neg": "-", "EQ": "=", "NEQ": "<>", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<=",
             "Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "Mod": "%", "DPipe": "||",
             "And": "AND", "Or": "OR", "Not": "NOT", "Like": "LIKE", "ILike": "ILIKE",
             "In": "IN", "Between": "BETWEEN", "Is": "IS", "Order": "ORDER BY",
             "Group": "GROUP BY", "Where": "WHERE", "Having": "HAVING", "Limit": "LIMIT",
             "Offset": "OFFSET", "Join": "JOIN", "From": "FROM", "Alias": "AS",
             "Ordered": "ORDER BY", "Select": "SELECT", "Case": "CASE", "If": "WHEN"}


def plain_parse_error(description: str) -> str:
    """sqlglot's parse error in SQL words: which keyword or operator is left incomplete."""
    match = _MISSING_PART.search(description)
    if match is None:
        return description
    node = match.group(1)
    word = _NODE_SQL.get(node)
    thing = f"'{word}'" if word else f"a {node} expression"
    return f"{thing} is missing what must follow it"


class SqlError(AgentflowError):
    """Base class: something went wrong with one SQL statement."""

    kind = "error"

    def __init__(self, message: str, *, sql: str | None = None):
        super().__init__(message)
        self.message = message
        self.sql = sql

    def to_dict(self) -> dict:
        return {"kind": self.kind, "message": self.message}


class SqlSyntaxError(SqlError):
    """The statement does not parse. ``line``/``column`` are 1-based when known."""

    kind = "syntax_error"

    def __init__(self, message: str, *, sql: str | None = None, line: int | None = None,
                 column: int | None = None):
        if line is not None and column is not None:
            message = f"{message} (line {line}, column {column})"
        super().__init__(message, sql=sql)
        self.line = line
        self.column = column

    def to_dict(self) -> dict:
        return {**super().to_dict(), "line": self.line, "column": self.column}


class UnknownTableError(SqlError):
    kind = "unknown_table"

    def __init__(self, message: str, *, sql: str | None = None, name: str | None = None):
        super().__init__(message, sql=sql)
        self.name = name


class UnknownColumnError(SqlError):
    kind = "unknown_column"

    def __init__(self, message: str, *, sql: str | None = None, name: str | None = None):
        super().__init__(message, sql=sql)
        self.name = name


class QueryTimeoutError(SqlError):
    """The query ran past its time limit and was interrupted inside the engine."""

    kind = "timeout"

    def __init__(self, message: str, *, sql: str | None = None, limit_s: float | None = None):
        super().__init__(message, sql=sql)
        self.limit_s = limit_s


class RejectedStatementError(SqlError):
    """The statement is not a single read-only query; it never reached the database."""

    kind = "rejected"


class QueryTooComplexError(RejectedStatementError):
    """The statement is too long or too deeply nested to check safely; it never ran.

    Parsing is part of a query's budget: an unbounded text or nesting depth would let one
    question hold a worker (or blow the interpreter's stack) before any timeout applies."""

    kind = "too_complex"


class ConnectionLostError(SqlError):
    """The database connection broke (server restarted, network dropped) while the query ran,
    or no connection could be made. The query did not complete; a later one may succeed."""

    kind = "connection_lost"


class ExecutionError(SqlError):
    """The engine refused or failed the query for another reason (type error, ...)."""

    kind = "execution_error"


class DatabaseNotFoundError(AgentflowError, LookupError):
    """An unknown database id or a path that does not exist."""
