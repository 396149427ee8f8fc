"""The server's side of agentflow: submit, wait, cancel, look up, shut down.

Why a layer between the routes and ``AgentFlow``: the HTTP rules (which database ids a remote
client may name, how long a request may wait, what a rejection maps to) and the
observations the API reports (which instance failed a call before another re-ran it, how
long the scheduler took per event) belong to serving, not to the engine. Everything here
wraps ``AgentFlow`` from the outside; the scheduler itself is not changed.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

from pydantic_core import PydanticSerializationError

from agentflow.api import (
    AgentFlow,
    Answer,
    ConversationNotFoundError,
    InvalidRequest,
    QueryHandle,
    ShuttingDownError,
)
from agentflow.llm.base import BackendError, LLMBackend, LLMRequest, LLMResult
from agentflow.scheduler.serving import ScheduledRouter
from agentflow.server.errors import ApiError, retry_after_header
from agentflow.server.examples import ExampleQuestions
from agentflow.server.models import (
    DatabaseInfo,
    FailedAttempt,
    InstanceInfo,
    QueryRequest,
    QuerySummary,
    QueryView,
    Retry,
    StageView,
    valid_text,
)
from agentflow.server.prometheus import ServerMetrics
from agentflow.server.replica import RemoteHandle, Replica
from agentflow.server.results import result_links
from agentflow.server.settings import ServerSettings
from agentflow.slo_classes import SloClassNotAllowedError, UnknownSloClassError
from agentflow.sql import DatabaseNotFoundError, json_value
from agentflow.state import StateStore
from agentflow.state.limits import StoreLimits
from agentflow.tenants import LimitExceeded, Tenant, TenantLimits, TenantTable, sees

log = logging.getLogger("agentflow.server")


class FailureLog:
    """Failed LLM call attempts by query id, kept until the query is forgotten."""

    def __init__(self) -> None:
        self._by_query: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._lock = threading.Lock()

    def add(self, request: LLMRequest, instance: str, error: BackendError) -> None:
        with self._lock:
            self._by_query[request.query_id].append({
                "request_id": request.request_id, "stage": request.stage,
                "instance": instance, "error": str(error), "retryable": error.retryable})

    def of(self, query_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._by_query.get(query_id, ()))

    def forget(self, keep: set[str]) -> None:
        with self._lock:
            for query_id in [q for q in self._by_query if q not in keep]:
                del self._by_query[query_id]


class RecordingBackend(LLMBackend):
    """Passes calls through to ``inner`` and notes each failure (the scheduler then re-runs
    the call elsewhere or fails it); the answer reports both, so a client can tell a query
    that survived a dying instance from one that never met a failure."""

    def __init__(self, inner: LLMBackend, instance: str, failures: FailureLog,
                 metrics: ServerMetrics):
        self.inner = inner
        self.name = getattr(inner, "name", instance)
        self.instance = instance
        self._failures = failures
        self._metrics = metrics

    async def generate(self, request: LLMRequest, on_progress=None) -> LLMResult:
        try:
            return await self.inner.generate(request, on_progress)
        except BackendError as err:
            self._failures.add(request, self.instance, err)
            self._metrics.call_failures.labels(instance=self.instance).inc()
            raise

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    @property
    def tokenizer_key(self) -> tuple:
        # Defined on LLMBackend, so __getattr__ below would never forward it: without this,
        # every wrapped instance looked like one tokenizer and the router counted a prompt
        # with the first backend's counter for all of them.
        return self.inner.tokenizer_key

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else the inner backend offers
        return getattr(self.inner, name)


class DecisionTimer:
    """A coordinator observer: the time each event takes, into the decision histogram."""

    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self._started: list[float] = []  # events nest: a stack of start times

    def event_started(self, event: str) -> None:
        self._started.append(time.perf_counter())

    def event_finished(self, event: str, decisions: list) -> None:
        elapsed = time.perf_counter() - self._started.pop()
        self.metrics.decision_seconds.labels(event=event.removeprefix("on_")).observe(elapsed)


def _clean(value: Any) -> Any:
    """Pipeline details may hold arbitrary objects: keep JSON-able structure, stringify the
    rest."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_clean(v) for v in value]
    return json_value(value)


def _serialisable(model: Any) -> Any:
    """The model itself if it serialises, else a copy with every string made valid
    Unicode (a lone surrogate from the Python API, a database or a model's output)."""
    try:
        model.model_dump_json()
        return model
    except PydanticSerializationError:
        return type(model).model_validate(_valid_strings(model.model_dump()))


def _valid_strings(value: Any) -> Any:
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {_valid_strings(k): _valid_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_strings(v) for v in value]
    return value


def _owner(handle: QueryHandle) -> dict[str, str | None]:
    return {"tenant": handle.tenant, "slo_class": handle.slo_class}


def _progress(handle: QueryHandle) -> str:
    """Status of a query whose answer is not set yet: running once a stage has started."""
    return "running" if any(e.get("type") == "stage_started" for e in list(handle.events)) \
        else "pending"


def teaching_in_state(store: StateStore, teaching_store: str | None) -> bool:
    """Whether taught pairs and glossary live in the state store: when it is PostgreSQL
    (replicas on many hosts share nothing else) and the config names no teaching store.
    A SQLite state store is one host's, whose replicas and ``agentflow teach`` already
    share ``<cache>/teaching.sqlite``; ``teaching_store: sqlite:///<state file>`` moves
    them into it anyway."""
    return teaching_store is None and store.url.startswith(("postgresql://", "postgres://"))


class QueryService:
    def __init__(self, af: AgentFlow, settings: ServerSettings, metrics: ServerMetrics, *,
                 owns_agentflow: bool = True):
        self.af = af
        self.settings = settings
        self.metrics = metrics
        self.owns_agentflow = owns_agentflow
        self.failures = FailureLog()
        # per-tenant rate and concurrency (agentflow.tenants); across replicas once a state
        # store is attached (use_state)
        self.limits: TenantLimits | StoreLimits = TenantLimits()
        self.replica: Replica | None = None
        self.draining = False
        self._close_lock = threading.Lock()
        self._closed = False
        self._tables: dict[str, list[str]] = {}
        self._examples = ExampleQuestions()
        # the scheduler process's report of its instances (socket mode): (when, report)
        self._remote: tuple[float, dict[str, dict[str, Any]]] | None = None
        # A router passed in code may schedule nothing (no coordinator, no health states).
        self.scheduled = af.router if isinstance(af.router, ScheduledRouter) else None
        self.coordinator = self.scheduled.coordinator if self.scheduled else None
        for name in list(af.backends):
            if not isinstance(af.backends[name], RecordingBackend):
                # The router holds the same dict, so wrapping in place reaches it too.
                af.backends[name] = RecordingBackend(af.backends[name], name, self.failures,
                                                     metrics)
        if self.scheduled:  # calls the router cut off (deadline, stall): retries too
            self.scheduled.attempt_listeners.append(self._abandoned)
        if self.coordinator is not None:
            self.coordinator.add_observer(DecisionTimer(metrics))
        metrics.bind(self)

    def use_state(self, store: StateStore, tenants: TenantTable, *,
                  replica_id: str | None = None, lease_s: float = 5.0) -> Replica:
        """Keep queries, conversations and tenant usage in ``store`` (shared with the
        other replicas and kept across restarts); see ``agentflow.server.replica``."""
        from agentflow.state.conversations import StoreConversations

        self.af.conversations = StoreConversations(store)  # type: ignore[assignment]
        rid = replica_id or None
        replica = Replica(store, self.af, StoreLimits(store, "", lease_s), tenants,
                          replica_id=rid, lease_s=lease_s)
        replica.limits.replica = replica.id
        self.limits = replica.limits
        self.replica = replica
        if teaching_in_state(store, self.af.config.teaching_store):
            from agentflow.state.teaching import open_teaching

            self.af._teaching_store = open_teaching(store)
        return replica

    def _abandoned(self, request: LLMRequest, instance: str, error: BackendError) -> None:
        self.failures.add(request, instance, error)
        self.metrics.call_failures.labels(instance=instance).inc()

    # ------------------------------------------------------------------ queries
    def database_ids(self, caller: Tenant | None) -> list[str]:
        """The catalog ids ``caller`` may use (all of them when keys are off)."""
        return [d for d in self.af.catalog.ids if caller is None or caller.may_use(d)]

    def database_id(self, db: str, caller: Tenant | None) -> str:
        """``db`` if ``caller`` may query it; else 404 — the same for a database outside
        the key's list as for one that does not exist (hints name only the caller's)."""
        ids = self.database_ids(caller)
        if db not in ids:
            # Only catalog ids: the engine also accepts file paths, which a remote client
            # must not be able to open on this machine.
            close = difflib.get_close_matches(db, ids, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ApiError(404, "unknown_database",
                           f"unknown database {db!r}{hint} (GET /v1/databases lists the "
                           f"{len(ids)} available)")
        return db

    def admit(self, caller: Tenant | None) -> bool:
        """Take one of ``caller``'s queries from its limits (rate, in flight), or 429; True
        when it holds a slot to ``limits.release``. Asking and teaching SQL both count."""
        try:
            return self.limits.acquire(caller)
        except LimitExceeded as err:
            raise ApiError(429, "rate_limited" if err.kind == "rate" else "too_many_queries",
                           str(err), headers=retry_after_header(err.retry_after_s),
                           retry_after_s=round(err.retry_after_s, 3)) from None

    def submit(self, req: QueryRequest, caller: Tenant | None = None) -> QueryHandle:
        """Start a query for ``caller`` or raise ``ApiError`` (bad input, unknown db,
        over the tenant's limits, shutting down)."""
        if self.draining:
            raise ApiError(503, "shutting_down", "the server is shutting down; retry on "
                           "another replica or in a moment", headers=retry_after_header(5))
        self.database_id(req.db, caller)
        holds_slot = self.admit(caller)
        try:
            handle = self.af.submit(req.question, req.db, slo=req.slo_seconds,
                                    pipeline=req.pipeline, evidence=req.evidence,
                                    conversation=req.conversation_id, tenant=caller,
                                    min_confidence=req.min_confidence,
                                    slo_class=req.slo_class)
        except BaseException as err:
            if holds_slot:
                self.limits.release(caller)
            if isinstance(err, SloClassNotAllowedError):
                raise ApiError(403, "slo_class_not_allowed", str(err),
                               ceiling=err.ceiling) from None
            if isinstance(err, UnknownSloClassError):
                raise ApiError(400, "unknown_slo_class", str(err),
                               classes=err.classes) from None
            if isinstance(err, ConversationNotFoundError):
                raise ApiError(404, "conversation_not_found", str(err)) from None
            if isinstance(err, InvalidRequest):
                raise ApiError(422, "invalid_request", str(err)) from None
            if isinstance(err, DatabaseNotFoundError):
                raise ApiError(404, "unknown_database",
                               err.args[0] if err.args else str(err)) from None
            if isinstance(err, ShuttingDownError):  # closing: AgentFlow refuses questions
                raise ApiError(503, "shutting_down", str(err),
                               headers=retry_after_header(5)) from None
            raise
        if holds_slot:
            handle.future.add_done_callback(lambda _: self.limits.release(caller))
        if self.replica is not None:
            handle.evidence = req.evidence  # type: ignore[attr-defined]  # for a re-run
            self.replica.track(handle)
        self.metrics.submitted.inc()
        handle.future.add_done_callback(lambda f: self._finished(handle, f))
        self.failures.forget(set(self.af.handles))
        return handle

    def _finished(self, handle: QueryHandle, future: Future) -> None:
        try:
            answer = None if future.cancelled() or future.exception() else future.result()
            self.metrics.observe_answer(handle, answer)
        except Exception:  # noqa: BLE001 - metrics must never break a query
            log.exception("recording metrics for %s failed", handle.query_id)

    def handle(self, query_id: str, caller: Tenant | None) -> QueryHandle:
        """The query ``query_id`` if ``caller`` may see it; another tenant's query is the
        same 404 as an unknown id (never 403: that would confirm the id exists)."""
        handle = self.af.handles.get(query_id)
        if handle is None and self.replica is not None:  # another replica's, or older
            handle = self.replica.lookup(query_id)
        if handle is None or not sees(caller, handle.tenant):
            raise ApiError(404, "query_not_found",
                           f"unknown query id {query_id!r} (the server keeps the last "
                           f"1000 finished queries)")
        if handle.done() and self.replica is not None:  # rare: its commit is under way
            storing = self.replica.storing(query_id)
            if storing is not None:
                wait_futures([storing], timeout=5)
        return handle

    async def wait(self, handle: QueryHandle, timeout: float | None) -> Answer | None:
        """The answer, or None after ``timeout``. Waiting is shielded: a client that goes
        away does not cancel the query (it stays available by id)."""
        if handle.done():
            await self._stored(handle)
            return self.result(handle)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future = loop.create_future()

        def wake(_: Future) -> None:
            try:
                loop.call_soon_threadsafe(_settle, waiter)
            except RuntimeError:  # the HTTP loop is gone (shutdown)
                pass
        handle.future.add_done_callback(wake)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            return None
        await self._stored(handle)
        return self.result(handle)

    async def _stored(self, handle: QueryHandle) -> None:
        """Until this replica's answer to ``handle`` is in the state store (so the next
        request, on any replica, finds it done; the writer commits it in milliseconds)."""
        storing = self.replica.storing(handle.query_id) if self.replica is not None else None
        if storing is not None:
            await asyncio.wait([asyncio.wrap_future(storing)], timeout=5)

    async def wait_admitted(self, handle: QueryHandle, timeout: float) -> None:
        """Until the query has started (first stage event) or ended (e.g. rejected)."""
        def started() -> bool:
            return any(e.get("type") == "stage_started" for e in list(handle.events))

        if timeout <= 0 or handle.done() or started():
            return
        loop = asyncio.get_running_loop()
        seen: asyncio.Future = loop.create_future()

        def wake(event: Any = None) -> None:
            # A "done" event comes just before the answer is set: wait for the answer then.
            if isinstance(event, dict) and event.get("type") != "stage_started":
                return
            try:
                loop.call_soon_threadsafe(_settle, seen)
            except RuntimeError:
                pass
        handle.subscribe(wake)
        handle.future.add_done_callback(lambda _: wake())
        try:
            if started() or handle.done():
                return
            await asyncio.wait_for(asyncio.shield(seen), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            handle.unsubscribe(wake)

    def result(self, handle: QueryHandle) -> Answer:
        """The query's answer; for one cancelled or failed outside the pipeline, an answer
        that says so (never an exception)."""
        future = handle.future
        if future.cancelled():
            return self._synthetic(handle, "cancelled", "cancelled")
        if future.exception() is not None:
            err = future.exception()
            return self._synthetic(handle, "failed", f"{type(err).__name__}: {err}")
        return future.result()

    def _synthetic(self, handle: QueryHandle, status: str, error: str) -> Answer:
        return Answer(query_id=handle.query_id, question=handle.question, db=handle.db,
                      pipeline=handle.pipeline, status=status, error=error, sql=None,
                      slo_s=handle.slo_s)

    def cancel(self, query_id: str, caller: Tenant | None) -> QueryHandle:
        handle = self.handle(query_id, caller)
        if isinstance(handle, RemoteHandle):  # its replica cancels it (via the store)
            if handle.done() or self.replica is None \
                    or not self.replica.request_cancel(query_id):
                status = self.result(handle).status if handle.done() else "finishing"
                raise ApiError(409, "already_finished", f"query {query_id} already finished "
                               f"({status}); nothing to cancel", query_status=status)
            return handle
        if handle.done() or not self.af.cancel(query_id):
            status = self.result(handle).status if handle.done() else "finishing"
            raise ApiError(409, "already_finished",
                           f"query {query_id} already finished ({status}); nothing to cancel",
                           query_status=status)
        return handle

    # ------------------------------------------------------------------ views
    def view(self, handle: QueryHandle) -> QueryView:
        return _serialisable(self._view(handle))

    def _view(self, handle: QueryHandle) -> QueryView:
        links = {"self": f"/v1/queries/{handle.query_id}",
                 "events": f"/v1/queries/{handle.query_id}/events"}
        if not handle.done():
            return QueryView(query_id=handle.query_id, status=_progress(handle),
                             question=handle.question, db=handle.db, pipeline=handle.pipeline,
                             slo_s=handle.slo_s, stages=self._stages_from_events(handle),
                             links=links, conversation_id=handle.conversation_id, **_owner(handle))
        answer = self.result(handle)
        stages, retries = self._stages_from_answer(answer)
        links.update(result_links(handle.query_id, answer))
        return QueryView(
            query_id=answer.query_id, status=answer.status, question=answer.question,
            db=answer.db, pipeline=answer.pipeline, slo_s=answer.slo_s, sql=answer.sql,
            columns=[str(c) for c in answer.columns],
            rows=[[json_value(v) for v in row] for row in answer.rows],
            truncated=answer.truncated, truncated_by=answer.truncated_by,
            error=answer.error, latency_s=answer.latency_s,
            met_slo=answer.met_slo, stages=stages, usage=_clean(answer.usage),
            details=_clean(answer.details), retries=retries, links=links,
            conversation_id=handle.conversation_id, confidence=answer.confidence,
            **_owner(handle))

    def summary(self, handle: QueryHandle) -> QuerySummary:
        if not handle.done():
            return QuerySummary(query_id=handle.query_id, status=_progress(handle),
                                question=handle.question, db=handle.db,
                                pipeline=handle.pipeline, slo_s=handle.slo_s,
                                conversation_id=handle.conversation_id, **_owner(handle))
        a = self.result(handle)
        return QuerySummary(query_id=a.query_id, status=a.status, question=a.question, db=a.db,
                            pipeline=a.pipeline, slo_s=a.slo_s, latency_s=a.latency_s,
                            met_slo=a.met_slo, error=a.error,
                            conversation_id=handle.conversation_id, **_owner(handle))

    def recent(self, limit: int, caller: Tenant | None = None) -> list[QuerySummary]:
        """Newest first, only ``caller``'s own (all for an admin, or with keys off). Each
        record is checked on its own, so one that cannot be shown (text that is not valid
        Unicode, from any source) is repaired, never allowed to break the listing."""
        if self.replica is not None:
            handles = self._recent_stored(limit, caller)
        else:
            handles = [h for h in list(self.af.handles.values())
                       if sees(caller, h.tenant)][-limit:]
        out = []
        for h in reversed(handles):
            try:
                out.append(_serialisable(self.summary(h)))
            except Exception:  # noqa: BLE001 - one record must not break the listing
                log.exception("query %s cannot be listed", h.query_id)
        return out

    def _recent_stored(self, limit: int, caller: Tenant | None) -> list[QueryHandle]:
        """Every replica's queries from the store, oldest first (as ``af.handles``); this
        replica's own live handles where it has them."""
        assert self.replica is not None
        everyone = caller is None or caller.admin
        records = self.replica.recent(caller.name if caller else None, limit, everyone)
        out: list[QueryHandle] = []
        for record in reversed(records):
            local = self.af.handles.get(record.query_id)
            out.append(local if local is not None else RemoteHandle(record, []))
        return out

    def _stages_from_events(self, handle: QueryHandle) -> list[StageView]:
        latest: dict[str, dict[str, Any]] = {}
        for event in list(handle.events):
            if event.get("type", "").startswith("stage_"):
                latest[event["node_id"]] = event
        stages = []
        for node_id, e in latest.items():
            status = {"stage_started": "running", "stage_finished": "ok",
                      "stage_failed": "error"}[e["type"]]
            stages.append(StageView(
                node_id=node_id, stage=e.get("stage", node_id), kind=e.get("kind", ""),
                parents=e.get("parents") or [], start=e.get("start"), end=e.get("end"),
                status=status, error=e.get("error"), summary=e.get("summary") or "",
                instances=[e["instance"]] if e.get("instance") else [],
                queue_s=e.get("queue_s") or 0.0, run_s=e.get("run_s") or 0.0))
        return stages

    def _stages_from_answer(self, answer: Answer) -> tuple[list[StageView], list[Retry]]:
        failed = self.failures.of(answer.query_id)
        by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for f in failed:
            by_request[f["request_id"]].append(f)
        stages, retries, seen = [], [], set()
        for s in answer.stages:
            calls = []
            for c in s.get("llm_calls", []):
                attempts = by_request.get(c["request_id"], [])
                seen.add(c["request_id"])
                calls.append({**c, "failed_attempts": [
                    FailedAttempt(instance=a["instance"], error=a["error"],
                                  retryable=a["retryable"]) for a in attempts]})
                retries += [Retry(node_id=s["node_id"], stage=s["stage"],
                                  request_id=c["request_id"], failed_on=a["instance"],
                                  error=a["error"], rerun_on=c["instance"]) for a in attempts]
            stages.append(StageView(
                **{k: v for k, v in s.items() if k != "llm_calls"},
                instances=sorted({c["instance"] for c in calls}),
                queue_s=sum(c["queue_s"] for c in calls), run_s=sum(c["run_s"] for c in calls),
                llm_calls=calls))
        stage_of = {s.node_id: s for s in stages}
        for f in failed:  # failures of calls that never succeeded anywhere
            if f["request_id"] in seen:
                continue
            node = next((s.node_id for s in stage_of.values()
                         if s.stage == f["stage"] and s.status == "error"), f["stage"])
            retries.append(Retry(node_id=node, stage=f["stage"], request_id=f["request_id"],
                                 failed_on=f["instance"], error=f["error"], rerun_on=None))
        return stages, retries

    # ------------------------------------------------------------------ catalog, cluster
    def databases(self, caller: Tenant | None = None) -> list[DatabaseInfo]:
        catalog = self.af.catalog
        out = []
        for db_id in self.database_ids(caller):
            entry = catalog.entry(db_id)
            examples = self._examples.for_db(entry.dataset, db_id)  # train split only
            out.append(DatabaseInfo(id=db_id, engine=catalog.engine_of(db_id),
                                    tables=self._table_names(db_id), examples=examples))
        return out

    def _table_names(self, db_id: str) -> list[str]:
        """The catalog's table names, cached; a broken database lists none."""
        if db_id not in self._tables:
            try:
                self._tables[db_id] = self.af.catalog.table_names(db_id)
            except Exception as err:  # noqa: BLE001 - a broken file must not break listing
                log.warning("cannot list tables of %s: %s", db_id, err)
                self._tables[db_id] = []
        return self._tables[db_id]

    def _remote_shard(self) -> Any:
        """The handle whose ``instance_report`` asks the scheduler process (socket mode:
        one link serves every shard), or None where the coordinators are in this process."""
        for shard in getattr(self.af.router, "shards", ()):
            if asyncio.iscoroutinefunction(getattr(shard, "instance_report", None)):
                return shard
        return None

    async def refresh_instances(self, max_age_s: float = 1.0, timeout_s: float = 2.0) -> None:
        """Ask the scheduler process for its instances' state (``--replicas N``: this
        replica holds no coordinator) unless the last answer is under ``max_age_s`` old;
        the routes that show instances await this first. Only over a connection the
        replica's calls have made: a health view does not dial the process itself, so
        readiness still turns on what the calls found (the process gone: not ready). No
        connection, or no answer within ``timeout_s``, leaves no report: the instances then
        read as up while the process can be reached, as before."""
        shard = self._remote_shard()
        if shard is None:
            return
        if not shard.link.connected:
            self._remote = None
            return
        if self._remote is not None and time.monotonic() - self._remote[0] < max_age_s:
            return
        try:
            future = self.af._submit(shard.instance_report())  # on the engine's loop
            report = await asyncio.wait_for(asyncio.wrap_future(future), timeout_s)
        except Exception as err:  # noqa: BLE001 - a health view must answer regardless
            log.debug("no instance report from the scheduler process: %s", err)
            self._remote = None
            return
        self._remote = (time.monotonic(), report)

    def instance_reports(self) -> dict[str, dict[str, Any]] | None:
        """Each instance's state and counters (``ScheduledRouter.instance_report``), from
        this process's coordinators or, in socket mode, the scheduler process's last report
        (``refresh_instances``); None where nothing schedules (a router passed in code)."""
        router = self.af.router
        if isinstance(router, ScheduledRouter):
            return router.instance_report()
        shards = getattr(router, "shards", None)
        if not shards:
            return None
        out: dict[str, dict[str, Any]] = {}
        found = False
        for shard in shards:
            local = getattr(shard, "router", None)
            if isinstance(local, ScheduledRouter):  # a shard in this process
                out.update(local.instance_report())
                found = True
        if self._remote_shard() is not None and self._remote is not None:
            out.update(self._remote[1])
            found = True
        return out if found else None

    def instances(self) -> list[InstanceInfo]:
        by_name = {i.name: i for i in self.af.config.instances}
        reports = self.instance_reports() or {}
        out = []
        # a replica whose calls go to a shared scheduler process holds no backends itself:
        # its instances are up while that process can be reached (and its report says so)
        names = list(self.af.backends) or list(by_name)
        reachable = getattr(self.af.router, "reachable", None)
        shared_up = reachable() if callable(reachable) else True
        for name in names:
            cfg = by_name.get(name)
            placed = getattr(self.af.backends.get(name), "placement_info", None)
            where = placed() if callable(placed) else {}
            report = reports.get(name)
            state = report["health"] if report is not None else "healthy"
            out.append(InstanceInfo(
                name=name, gpu=cfg.gpu if cfg else None, model=cfg.model if cfg else None,
                up=(report["up"] and shared_up) if report is not None else shared_up,
                waiting=report["waiting"] if report is not None else 0,
                running=report["running"] if report is not None else 0,
                max_inflight=cfg.inflight_limit if cfg else 1, health=state,
                node=where.get("node"), gpu_ids=where.get("gpu_ids"),
                restarts=where.get("restarts"),
                reason=report["reason"] if report is not None and state != "healthy" else None))
        return out

    def health(self):
        """What /healthz, /readyz say: ok, degraded (some instances down), unavailable
        (none up) or draining."""
        from agentflow.server.models import Health

        infos = self.instances()
        up = sum(i.up for i in infos)
        status = ("draining" if self.draining else "unavailable" if not up
                  else "degraded" if up < len(infos) else "ok")
        return Health(status=status, instances=len(infos), instances_up=up,
                      instances_down=[i.name for i in infos if not i.up])

    def alive(self) -> bool:
        """The engine's event loop still runs (liveness: restart the process if not)."""
        thread = getattr(self.af, "_thread", None)
        return thread is None or thread.is_alive() or self.draining

    # ------------------------------------------------------------------ shutdown
    def running(self) -> int:
        """Queries in flight."""
        return sum(1 for h in list(self.af.handles.values()) if not h.done())

    def close(self, drain_s: float | None = None) -> None:
        """Finish or cancel queries in flight (their answers say which), then release the
        engine. Idempotent and thread-safe: uvicorn's shutdown and the app's lifespan may
        both call it."""
        self.draining = True
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            if not self.owns_agentflow:
                if self.replica is not None:
                    self.replica.close()
                return
            drain = self.settings.drain_s if drain_s is None else drain_s
            in_flight = [h for h in self.af.handles.values() if not h.done()]
            running = len(in_flight)
            log.info("shutting down: %d queries in flight, draining up to %.0fs", running, drain)
            try:
                self.af.close(drain_s=drain)
            except Exception:  # noqa: BLE001 - shutdown must finish; say what went wrong
                log.exception("closing agentflow failed")
            if self.replica is not None:  # after the answers of the cancelled are stored
                self.replica.close()
            # Only the queries the shutdown met: a query a user cancelled an hour ago is no
            # reason to warn on a normal Ctrl+C.
            statuses: dict[str, int] = defaultdict(int)
            for h in in_flight:
                if h.done():
                    statuses[self.result(h).status] += 1
            level = logging.WARNING if statuses.get("cancelled") else logging.INFO
            log.log(level, "agentflow closed; query statuses: %s (of those in flight at "
                    "shutdown)", dict(statuses))


def _settle(waiter: asyncio.Future) -> None:
    """Wake ``waiter`` once; later wake-ups for the same wait are no-ops."""
    if not waiter.done():
        waiter.set_result(None)
