"""The database layer: read-only connections, the statement allow-list, schema text."""

from agentflow.sql.database import Database, QueryResult, json_value
from agentflow.sql.dialect import transpile
from agentflow.sql.errors import (
    DatabaseNotFoundError,
    ExecutionError,
    QueryTimeoutError,
    RejectedStatementError,
    SqlError,
    SqlSyntaxError,
    UnknownColumnError,
    UnknownTableError,
)
from agentflow.sql.guard import check_query

__all__ = [
    "Database", "QueryResult", "transpile", "check_query", "SqlError", "SqlSyntaxError",
    "UnknownTableError", "UnknownColumnError", "QueryTimeoutError", "RejectedStatementError",
    "ExecutionError", "DatabaseNotFoundError", "json_value",
]
