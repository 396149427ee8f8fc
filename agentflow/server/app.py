"""The FastAPI app: routes, error mapping, the web page.

``create_app(config)`` starts agentflow (the embedded default when ``config`` is None) and
returns an ASGI app; ``create_app(agentflow=af)`` serves an engine the caller already made
(and still owns). Errors always come back as ``{"error": {"code", "message"}}``:

    400 malformed_json        body is not JSON / empty
    400 unknown_slo_class     slo_class names no configured class (``classes`` lists them)
    401 unauthorized          API keys configured, none or a wrong one sent
    403 forbidden             /metrics without an admin key
    404 unknown_database      db is not one this server serves to this key (ids only)
    404 query_not_found       unknown query id, or another tenant's
    404 conversation_not_found  unknown conversation id, or another tenant's
    409 already_finished      DELETE of a query that has ended
    408 request_timeout       headers or body did not arrive in time (slow client)
    413 payload_too_large     body over the limit
    415 unsupported_media_type body is not JSON-typed
    422 invalid_request       empty/too long question, bad SLO, unknown pipeline or field
    429 overloaded            the scheduler's admission bound; Retry-After says when
    429 rate_limited / too_many_queries  the key's tenant is over its queries per minute
                              or in flight (agentflow.tenants); Retry-After
    429 would_miss_deadline   scheduler.deadline_admission: reject; earliest_slo_s is feasible
    503 unavailable / shutting_down / too_many_connections  no instance up, draining, or
                              over the connection limit; Retry-After
    500 internal              a bug; the server log has the traceback
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Header, Query
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from agentflow import __version__
from agentflow.api import AgentFlow, connect
from agentflow.config import AgentFlowConfig
from agentflow.server import errors
from agentflow.server.auth import Caller, require_admin, require_key
from agentflow.server.errors import ApiError, retry_after_header
from agentflow.server.events import EventStreamResponse, stream
from agentflow.server.models import (
    DatabaseList,
    Health,
    InstanceList,
    PipelineList,
    QueryList,
    QueryRequest,
    QueryView,
)
from agentflow.server.prometheus import ServerMetrics
from agentflow.server.service import QueryService
from agentflow.server.settings import ServerSettings
from agentflow.tenants import apply_share_weights, check_against_catalog

STATIC_DIR = Path(__file__).parent / "static"
log = logging.getLogger("agentflow.server")


class BodyTooLarge(ApiError):
    def __init__(self, limit: int):
        super().__init__(413, "payload_too_large",
                         f"the request body is larger than {limit} bytes")


class BodyLimit:
    """Reject bodies over ``limit`` bytes, by Content-Length up front or while reading, and
    bodies that stop arriving: each part must come within ``timeout_s`` (a slow client
    must not hold a request open for ever). Both are counted by ``on_error``."""

    def __init__(self, app: Any, limit: int, timeout_s: float | None = None,
                 on_error: Any = None):
        self.app = app
        self.limit = limit
        self.timeout_s = timeout_s
        self.on_error = on_error

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            if self.on_error is not None:
                self.on_error(413, "payload_too_large")
            response = errors.error_response(413, "payload_too_large",
                                             f"the request body is {int(length)} bytes; at "
                                             f"most {self.limit} are accepted")
            return await response(scope, receive, send)
        seen = 0
        complete = False

        async def limited() -> dict:
            nonlocal seen, complete
            if complete or self.timeout_s is None:
                message = await receive()  # e.g. waiting for a disconnect: no time limit
            else:
                try:
                    message = await asyncio.wait_for(receive(), self.timeout_s)
                except asyncio.TimeoutError:
                    raise BodyTimeout(self.timeout_s) from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message
        return await self.app(scope, limited, send)


class BodyTimeout(ApiError):
    def __init__(self, timeout_s: float):
        super().__init__(408, "request_timeout", f"the request body did not arrive within "
                         f"{timeout_s:g} s", headers={"Connection": "close"})


def create_app(config: AgentFlowConfig | None = None, settings: ServerSettings | None = None,
               *, agentflow: AgentFlow | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    metrics = ServerMetrics()
    owns = agentflow is None
    af = agentflow if agentflow is not None else connect(config or AgentFlowConfig())
    service = QueryService(af, settings, metrics, owns_agentflow=owns)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        import asyncio

        await asyncio.to_thread(service.close)

    app = FastAPI(title="agentflow", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # /docs from local assets: server/docs.py
                  description="Agentic Text-to-SQL as a service: ask a question about a "
                              "database, get SQL, rows and a per-stage timeline.")
    app.state.service = service
    app.state.tenants = settings.tenant_table()  # key -> tenant; empty: keys are off
    check_against_catalog(app.state.tenants, af.catalog, af.config.scheduler.slo_classes)
    apply_share_weights(app.state.tenants, af.router)  # tenants' weights into fair shares
    if settings.state:  # queries, conversations, usage shared by replicas (agentflow.state)
        from agentflow.state import open_store

        service.use_state(open_store(settings.state, keep_per_tenant=settings.keep_per_tenant,
                                     max_row_bytes=settings.max_row_bytes),
                          app.state.tenants, replica_id=settings.replica_id,
                          lease_s=settings.lease_s)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes,
                       timeout_s=settings.body_timeout_s, on_error=metrics.error)
    from agentflow.server.edge import HeaderLimit

    app.add_middleware(HeaderLimit, max_count=settings.max_headers,  # outermost: first
                       max_bytes=settings.max_header_bytes, on_error=metrics.error)
    errors.install(app, on_error=metrics.error)
    keyed = [Depends(require_key)]

    # ------------------------------------------------------------------ queries
    @app.post("/v1/queries", response_model=QueryView, dependencies=keyed,
              status_code=200, tags=["queries"],
              responses={202: {"model": QueryView, "description": "accepted (wait=false, or "
                                                                  "still running after the "
                                                                  "wait limit)"},
                         429: {"description": "overloaded; Retry-After"}})
    async def post_query(body: QueryRequest, caller: Caller) -> Any:
        """Answer a question. With ``wait`` (default) the response is the answer; otherwise
        202 with the query id (poll ``GET /v1/queries/{id}`` or stream its events)."""
        handle = service.submit(body, caller)
        if body.wait:
            await service.wait(handle, settings.wait_timeout_s)
        else:
            await service.wait_admitted(handle, settings.admission_wait_s)
        view = service.view(handle)
        if view.status == "rejected":
            details = view.details or {}
            retry = details.get("retry_after_s")
            if details.get("code") == "would_miss_deadline":
                raise ApiError(429, "would_miss_deadline", view.error or "rejected",
                               headers=retry_after_header(retry), retry_after_s=retry,
                               earliest_slo_s=details.get("earliest_slo_s"),
                               query_id=view.query_id)
            overloaded = (view.error or "").startswith("overloaded")
            raise ApiError(429 if overloaded else 503, "overloaded" if overloaded else
                           "unavailable", view.error or "rejected",
                           headers=retry_after_header(retry), retry_after_s=retry,
                           query_id=view.query_id)
        if view.status in ("pending", "running"):
            return JSONResponse(view.model_dump(), status_code=202,
                                headers={"Location": view.links["self"]})
        return view

    @app.get("/v1/queries", response_model=QueryList, dependencies=keyed, tags=["queries"])
    async def list_queries(caller: Caller, limit: int = Query(20, ge=1, le=1000)) -> QueryList:
        """Recent queries, newest first: the key's own (an admin key's: everyone's)."""
        return QueryList(queries=service.recent(min(limit, settings.recent_limit), caller))

    @app.get("/v1/queries/{query_id}", response_model=QueryView, dependencies=keyed,
             tags=["queries"])
    async def get_query(query_id: str, caller: Caller) -> QueryView:
        return service.view(service.handle(query_id, caller))

    @app.delete("/v1/queries/{query_id}", response_model=QueryView, dependencies=keyed,
                tags=["queries"])
    async def cancel_query(query_id: str, caller: Caller) -> QueryView:
        """Cancel a running query; the response is its final state (status cancelled)."""
        handle = service.cancel(query_id, caller)
        await service.wait(handle, 30)
        return service.view(handle)

    @app.get("/v1/queries/{query_id}/events", dependencies=keyed, tags=["queries"],
             response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}}}})
    async def query_events(query_id: str, caller: Caller,
                           last_event_id: str | None = Header(None)) -> StreamingResponse:
        """Server-Sent Events: stage_started / stage_finished / stage_failed, then done
        (with the answer). Events so far are replayed first."""
        handle = service.handle(query_id, caller)
        start = event_position(last_event_id)
        return EventStreamResponse(stream(service, handle, start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache",
                                          "X-Accel-Buffering": "no"})

    # ------------------------------------------------------------------ catalog, cluster
    @app.get("/v1/databases", response_model=DatabaseList, dependencies=keyed,
             tags=["catalog"])
    async def databases(caller: Caller) -> DatabaseList:
        """The databases this key may query."""
        return DatabaseList(databases=await asyncio.to_thread(service.databases, caller))

    @app.get("/v1/pipelines", response_model=PipelineList, dependencies=keyed,
             tags=["catalog"])
    async def pipelines() -> PipelineList:
        from pipelines import pipeline_names

        return PipelineList(pipelines=pipeline_names(), default=af.config.pipeline,
                            default_slo_s=af.config.slo_s)

    @app.get("/v1/instances", response_model=InstanceList, dependencies=keyed,
             tags=["cluster"])
    async def instances() -> InstanceList:
        await service.refresh_instances()  # --replicas N: the scheduler process's view
        return InstanceList(instances=service.instances())

    @app.get("/healthz", response_model=Health, tags=["cluster"],
             responses={503: {"model": Health, "description": "no instance up, or draining"}})
    async def healthz() -> Any:
        """Open without a key. ``ok`` (every instance up), ``degraded`` (some down, still
        serving), 503 ``unavailable`` (none up) or 503 ``draining`` (shutting down)."""
        await service.refresh_instances()
        health = service.health()
        if health.status in ("unavailable", "draining"):
            return JSONResponse(health.model_dump(), status_code=503,
                                headers=retry_after_header(5))
        return health

    @app.get("/livez", tags=["cluster"])
    async def livez() -> Any:
        """Liveness (Kubernetes livenessProbe): the process and its engine loop run. Stays
        200 while instances are down or the server drains — restarting would not help."""
        if not service.alive():
            return JSONResponse({"status": "dead", "reason": "the engine loop has stopped"},
                                status_code=503)
        return {"status": "alive"}

    @app.get("/readyz", tags=["cluster"])
    async def readyz() -> Any:
        """Readiness (Kubernetes readinessProbe): 200 while new queries can be served; 503
        with Retry-After while no instance is up or the server drains."""
        await service.refresh_instances()
        health = service.health()
        if health.status in ("unavailable", "draining"):
            return JSONResponse({"status": "not_ready", "reason": health.status,
                                 "instances_up": health.instances_up}, status_code=503,
                                headers=retry_after_header(5))
        return {"status": "ready", "instances_up": health.instances_up}

    @app.get("/metrics", dependencies=[Depends(require_admin)], tags=["cluster"],
             response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        await service.refresh_instances()
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    from agentflow.server import docs
    from agentflow.server.results import router as results_router
    from agentflow.server.teaching_routes import router as teaching_router

    docs.install(app)

    app.include_router(results_router)  # CSV and charts of finished queries
    app.include_router(teaching_router)  # taught examples and glossary per database

    # ------------------------------------------------------------------ web page
    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app


__all__ = ["create_app"]


def event_position(last_event_id: str | None) -> int:
    """The ``Last-Event-ID`` header as a stream position (0: from the start); anything that is
    not a plain count (``²``, 4,300+ digits, text) is a 422, never a 500."""
    if last_event_id is None or last_event_id.strip() == "":
        return 0
    text = last_event_id.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ApiError(422, "invalid_request", "Last-Event-ID must be the id of an event of "
                       "this stream (a count of at most 18 digits)")
    return int(text)
