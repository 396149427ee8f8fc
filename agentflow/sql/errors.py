"""Typed errors of the database layer.

Every failure a caller can act on has its own class, so a pipeline can tell "revise the SQL"
(syntax, unknown column) from "give up" (timeout, rejected statement) without parsing messages.
Each carries a short machine-readable ``kind`` for traces, JSON answers and evaluation reports.
"""

from __future__ import annotations

from agentflow.errors import AgentflowError


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
