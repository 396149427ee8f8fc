"""agentflow for agent clients: an MCP server built with the official ``mcp`` SDK.

Tools (each returns structured JSON):

    list_databases()                      ids, engines and table names
    describe_database(db)                 tables, columns (type, key), foreign keys
    ask(question, db, ...)                the pipeline's SQL, rows, status and a timeline
                                          summary; a scheduled query like any other (SLO,
                                          cancellation, follow-ups by conversation_id)
    run_sql(db, sql, max_rows)            one read-only SELECT through the same guard the
                                          pipelines use (single statement, allow-list,
                                          read-only connection, timeout, row cap)

Only catalog ids are accepted as ``db`` (never file paths: an HTTP client must not be able
to open files on this machine). Transports: stdio (a client starts ``agentflow mcp``) and
streamable HTTP (``agentflow mcp --http --port 8765``, endpoint ``/mcp``).

Over HTTP the HTTP API's keys and rules apply (``agentflow.tenants``): with keys configured,
a request without a valid key gets 401 before it reaches MCP, and each tool call acts for the
key's tenant — its databases only (others are unknown), its rate and concurrency limits, its
own conversations, its database role. Over stdio there is no tenant: the client is the local
process that started the server.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentflow import __version__
from agentflow.api import AgentFlow, AgentflowError
from agentflow.sql import DatabaseNotFoundError, json_value
from agentflow.tenants import (
    LimitExceeded,
    Tenant,
    TenantLimits,
    TenantTable,
    apply_share_weights,
    check_against_catalog,
    key_of,
)

try:  # resolved by the SDK from the tools' annotations, so it must be a module global
    from mcp.server.mcpserver import Context
except ImportError:  # the tools' logic (AgentflowTools) works without the mcp extra
    Context = Any  # type: ignore[misc,assignment]

MAX_ROWS = 200


def _rows(rows: list, limit: int) -> list[list[Any]]:
    return [[json_value(v) for v in row] for row in rows[:limit]]


def timeline_summary(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per stage: what ran, when, where, how long it queued and ran."""
    out = []
    for s in stages:
        calls = s.get("llm_calls") or []
        out.append({
            "stage": s["node_id"], "kind": s["kind"], "status": s.get("status"),
            "start_s": _round(s.get("start")), "end_s": _round(s.get("end")),
            "instances": sorted({c["instance"] for c in calls}),
            "queue_s": _round(sum(c["queue_s"] for c in calls)),
            "run_s": _round(sum(c["run_s"] for c in calls)),
            "summary": (s.get("error") or s.get("summary") or "")[:200]})
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class AgentflowTools:
    """The tools' logic, apart from MCP so it reads (and fails) like plain Python."""

    def __init__(self, af: AgentFlow, limits: TenantLimits | None = None):
        self.af = af
        self.limits = limits or TenantLimits()

    def _db(self, db: str, caller: Tenant | None = None) -> str:
        if caller is not None and not caller.may_use(db):  # as if it did not exist
            mine = [d for d in self.af.catalog.ids if caller.may_use(d)]
            raise DatabaseNotFoundError(f"unknown database {db!r} (known: "
                                        f"{', '.join(mine) or 'none'})")
        if db not in self.af.catalog.ids:
            # the catalog's message names the known databases; no file paths over MCP
            raise DatabaseNotFoundError(self.af.catalog.unknown_message(db, paths=False))
        return db

    def _open(self, db: str, caller: Tenant | None):
        """The database as ``caller`` sees it (its PostgreSQL role, if it has one; the
        engine's catalog for an admin)."""
        database = self.af.catalog.open(self._db(db, caller),
                                        caller.db_role(db) if caller is not None else None)
        return database.with_catalog() if caller is not None and caller.admin else database

    def list_databases(self, caller: Tenant | None = None) -> dict[str, Any]:
        catalog = self.af.catalog
        out = []
        for db_id in catalog.ids:
            if caller is not None and not caller.may_use(db_id):
                continue
            out.append({"id": db_id, "engine": catalog.engine_of(db_id),
                        "tables": catalog.table_names(db_id)})
        return {"databases": out}

    def describe_database(self, db: str, caller: Tenant | None = None) -> dict[str, Any]:
        database = self._open(db, caller)
        tables = []
        for t in database.schema().tables:
            tables.append({
                "name": t.name,
                "columns": [{"name": c.name, "type": c.type, "primary_key": c.primary_key}
                            for c in t.columns],
                "foreign_keys": [{"columns": list(f.columns), "ref_table": f.ref_table,
                                  "ref_columns": list(f.ref_columns)}
                                 for f in t.foreign_keys]})
        return {"db": db, "dialect": database.dialect, "tables": tables}

    async def ask(self, question: str, db: str, slo_seconds: float | None = None,
                  pipeline: str | None = None, conversation_id: str | None = None,
                  max_rows: int = 50, caller: Tenant | None = None,
                  min_confidence: float | None = None,
                  slo_class: str | None = None) -> dict[str, Any]:
        self._db(db, caller)
        holds_slot = self.limits.acquire(caller)
        try:
            answer = await self.af.ask_async(question, db, slo=slo_seconds, pipeline=pipeline,
                                             conversation=conversation_id, tenant=caller,
                                             min_confidence=min_confidence,
                                             slo_class=slo_class)
        finally:
            if holds_slot:
                self.limits.release(caller)
        limit = max(0, min(max_rows, MAX_ROWS))
        return {"query_id": answer.query_id, "status": answer.status, "error": answer.error,
                "sql": answer.sql, "columns": [str(c) for c in answer.columns],
                "rows": _rows(answer.rows, limit), "row_count": len(answer.rows),
                "rows_truncated": answer.truncated or len(answer.rows) > limit,
                "latency_s": _round(answer.latency_s), "slo_s": answer.slo_s,
                "met_slo": answer.met_slo, "pipeline": answer.pipeline,
                "slo_class": answer.slo_class,
                "conversation_id": answer.conversation_id, "confidence": answer.confidence,
                "llm_calls": answer.usage.get("calls", 0),
                "timeline": timeline_summary(answer.stages), "retries": answer.retries}

    async def run_sql(self, db: str, sql: str, max_rows: int = 50,
                      caller: Tenant | None = None) -> dict[str, Any]:
        database = await asyncio.to_thread(self._open, db, caller)
        limit = max(1, min(max_rows, MAX_ROWS))
        holds_slot = self.limits.acquire(caller)
        try:
            # in the caller's share of the database threads (agentflow.shares)
            result = await self.af.shares.run(self.af.share_of(caller), database.execute,
                                              sql, timeout_s=self.af.config.sql_timeout_s,
                                              max_rows=limit)
        finally:
            if holds_slot:
                self.limits.release(caller)
        return {"columns": [str(c) for c in result.columns], "rows": _rows(result.rows, limit),
                "truncated": result.truncated, "truncated_by": result.truncated_by,
                "elapsed_s": _round(result.elapsed_s)}


def build_server(af: AgentFlow, tenants: TenantTable | None = None):
    """An ``MCPServer`` whose tools answer with ``af``; with ``tenants`` (HTTP with keys on)
    each call acts for the tenant of the key its request carries."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    tools = AgentflowTools(af)

    def caller(ctx: Context | None) -> Tenant | None:
        if not tenants:
            return None
        headers = ctx.headers if ctx is not None else None
        key = key_of(headers) if headers is not None else None
        tenant = tenants.lookup(key) if key else None
        if tenant is None:  # KeyGate refuses these first; never act for nobody
            raise ToolError("unauthorized: a valid API key is required")
        return tenant
    server = MCPServer(
        name="agentflow", title="agentflow: agentic Text-to-SQL", version=__version__,
        instructions="Ask questions about SQL databases in plain language. Call "
                     "list_databases first, describe_database for a schema, ask to have the "
                     "pipeline write and run SQL, run_sql to run a read-only SELECT yourself.")

    def checked(fn):
        """Input errors become tool errors with agentflow's message (isError results).
        Synchronous tools (opening a database, reading its schema) run in a worker thread:
        on the event loop, one slow describe would hold up every session of the HTTP
        transport."""
        async def call(*args, **kwargs):
            try:
                if asyncio.iscoroutinefunction(fn):
                    return await fn(*args, **kwargs)
                return await asyncio.to_thread(fn, *args, **kwargs)
            except (AgentflowError, LookupError, ValueError) as err:
                message = err.args[0] if isinstance(err, LookupError) and err.args else err
                raise ToolError(f"{type(err).__name__}: {message}") from None
            except LimitExceeded as err:
                raise ToolError(f"{err.kind} limit: {err}; retry after "
                                f"{max(1, round(err.retry_after_s))} s") from None
        return call

    @server.tool(description="List the databases agentflow can answer questions about, with "
                             "their tables.")
    async def list_databases(ctx: Context) -> dict[str, Any]:
        return await checked(tools.list_databases)(caller(ctx))

    @server.tool(description="Describe one database: its tables, columns (type, primary "
                             "key) and foreign keys.")
    async def describe_database(db: str, ctx: Context) -> dict[str, Any]:
        return await checked(tools.describe_database)(db, caller(ctx))

    @server.tool(description="Answer a question about a database: a multi-stage LLM "
                             "pipeline writes SQL, runs it read-only, and returns the SQL, "
                             "rows, status and a per-stage timeline. Pass the "
                             "conversation_id of an earlier answer to ask a follow-up. "
                             "The answer's confidence (score, level, reasons) says how sure "
                             "it is; below min_confidence the status is 'unsure'. slo_class "
                             "(interactive, standard, batch; default: the key's) says how "
                             "the scheduler ranks it.")
    async def ask(question: str, db: str, slo_seconds: float | None = None,
                  pipeline: str | None = None, conversation_id: str | None = None,
                  max_rows: int = 50, ctx: Context | None = None,
                  slo: float | None = None,
                  min_confidence: float | None = None,
                  slo_class: str | None = None) -> dict[str, Any]:
        from agentflow.slo_classes import one_slo

        async def run() -> dict[str, Any]:  # ``slo``, the Python/CLI name, works too
            return await tools.ask(question, db, one_slo(slo, slo_seconds), pipeline,
                                   conversation_id, max_rows, caller(ctx), min_confidence,
                                   slo_class)
        return await checked(run)()

    @server.tool(description="Run one read-only SELECT on a database (single statement; "
                             "writes, DDL and PRAGMAs are refused) and return its rows.")
    async def run_sql(db: str, sql: str, max_rows: int = 50,
                      ctx: Context | None = None) -> dict[str, Any]:
        return await checked(tools.run_sql)(db, sql, max_rows, caller(ctx))

    from agentflow.mcp import teaching_tools

    # teach, list/forget_taught; a taught pair's SQL counts against the tenant's limits
    teaching_tools.register(server, af, checked, tools._db, caller, tools.limits)
    return server


class KeyGate:
    """ASGI middleware: with keys on, an HTTP request without a valid key gets 401 (the HTTP
    API's error shape) before the MCP transport sees it — no session for strangers.

    A session is bound to the key that opened it: the request carries that key's identity
    (a digest, never the key) as the ASGI ``user``, and the SDK's session manager answers a
    request for a session opened by another credential exactly as for an unknown session
    (404). Without it another tenant holding a session id could end the session or read its
    event stream."""

    def __init__(self, app: Any, tenants: TenantTable):
        self.app = app
        self.tenants = tenants

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.tenants:
            from starlette.datastructures import Headers
            from starlette.responses import JSONResponse

            key = key_of(Headers(scope=scope))
            if not key or self.tenants.lookup(key) is None:
                response = JSONResponse(
                    {"error": {"code": "unauthorized",
                               "message": "an API key is required: send 'Authorization: "
                                          "Bearer KEY' or 'X-API-Key: KEY'" if not key else
                                          "the API key is not valid"}},
                    status_code=401, headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
            scope = {**scope, "user": _key_principal(key)}
        await self.app(scope, receive, send)


def _key_principal(key: str) -> Any:
    """The SDK's authenticated user for ``key``: what it compares to bind sessions."""
    import hashlib

    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return AuthenticatedUser(AccessToken(token=f"key-{digest}", client_id=f"key-{digest}",
                                         scopes=[]))


def serve_http(af: AgentFlow, host: str, port: int, tenants: TenantTable | None = None) -> None:
    """MCP over streamable HTTP at ``/mcp``, behind the same API keys as the HTTP API."""
    import uvicorn

    if tenants:
        check_against_catalog(tenants, af.catalog, af.config.scheduler.slo_classes)
        apply_share_weights(tenants, af.router)
    server = build_server(af, tenants)
    app = server.streamable_http_app(host=host)
    if tenants:
        app = KeyGate(app, tenants)
    uvicorn.run(app, host=host, port=port, log_level="warning")
