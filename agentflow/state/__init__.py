"""Server state out of process: queries, conversations, tenant usage, replicas.

``open_store(url)`` gives a SQLite file store (one host) or a PostgreSQL one (many hosts);
see ``agentflow.state.store``. ``StoreConversations`` and ``StoreLimits`` put the engine's
conversations and the server's tenant limits in it.
"""

from agentflow.state.records import FINAL, QueryRecord, QueryRequest, cap_rows
from agentflow.state.store import PostgresStore, SqliteStore, StateStore, open_store

__all__ = ["FINAL", "PostgresStore", "QueryRecord", "QueryRequest", "SqliteStore",
           "StateStore", "cap_rows", "open_store"]
