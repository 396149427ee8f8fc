"""The Python API: ``connect()`` then ``ask()``.

    import agentflow
    af = agentflow.connect()                       # embedded default: local CPU model, demo DB
    answer = af.ask("How many stores are there?", db="bookshop", slo=60)
    print(answer.sql, answer.rows, answer.status)

``AgentFlow`` runs its own event loop in a background thread: the backends (a llama.cpp
worker, HTTP clients) live on that loop, so ``ask`` works from plain scripts and
``ask_async`` from any other event loop alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
import uuid
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from agentflow.catalog import DatabaseCatalog
from agentflow.config import AgentFlowConfig
from agentflow.llm.base import LLMBackend
from agentflow.shares import DbShares, Share, default_tenant_max, share_of
from agentflow.sql import SqlError
from agentflow.sql.database import row_bytes
from agentflow.teaching import TeachingMixin, TeachingStore
from agentflow.tenants import DatabaseLogin, Tenant, as_tenant, owner_of, sees
from agentflow.workflow import (
    MonotonicClock,
    Query,
    QueryStatus,
    WorkflowRun,
    execute,
)
from agentflow.workflow.pipeline import Pipeline, PipelineEnv
from agentflow.workflow.router import CallRouter
from agentflow.workflow.trace import TraceWriter, trace_record

MAX_QUESTION_CHARS = 2000


from agentflow.errors import (  # noqa: E402
    AgentflowError,
    ConversationNotFoundError,
    InvalidRequest,
    ShuttingDownError,
)
from agentflow.sql import DatabaseNotFoundError  # noqa: E402

# Rows of finished answers kept in memory for GET /v1/queries/{id}, in all (about, in bytes).
KEPT_ANSWER_BYTES = 256 * 1024 * 1024


@dataclass
class Answer:
    query_id: str
    question: str
    db: str
    pipeline: str
    status: str  # done | unsure (below min_confidence) | failed | cancelled | rejected
    error: str | None
    sql: str | None
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    truncated: bool = False
    # which cap cut the rows short: "rows" (max_rows) or "bytes" (the answer's byte cap)
    truncated_by: str | None = None
    latency_s: float | None = None
    slo_s: float | None = None
    stages: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    conversation_id: str | None = None  # pass to ask/submit to follow up on this answer
    tenant: str | None = None  # who asked (agentflow.tenants); None: no tenant
    slo_class: str | None = None  # the query's SLO class (agentflow.slo_classes)
    # How sure the pipeline is: {score, level, reasons} (agentflow.confidence); None when it
    # never produced an answer to judge (rejected, cancelled).
    confidence: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done" and self.error is None

    @property
    def met_slo(self) -> bool | None:
        """Whether the answer came back done within its SLO (None without an SLO); see
        ``agentflow.metrics``."""
        from agentflow.metrics import Outcome, met_slo

        return met_slo(Outcome(self.status, self.latency_s, slo_s=self.slo_s))

    @property
    def retries(self) -> list[dict[str, Any]]:
        """LLM call attempts that failed and were re-run (their time is in the call's queue
        wait); see ``agentflow.timeline``."""
        from agentflow.timeline import retries_of

        return retries_of(self.stages)

    def to_dict(self) -> dict[str, Any]:
        """The answer as plain data, nothing shared with it: ``dataclasses.asdict``'s result
        (plus ``met_slo`` and ``retries``), built without its generic walk, which
        deep-copied every value of the rows, stages and details one by one (~12% of a
        replica's engine-loop CPU per CHESS query in ``bench replicas_load --profile``)."""
        d = {f.name: _plain(getattr(self, f.name)) for f in _ANSWER_FIELDS}
        d["met_slo"] = self.met_slo
        d["retries"] = self.retries
        return d


_ANSWER_FIELDS = fields(Answer)
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes})


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``'s copy of ``value`` (its ``_asdict_inner``), the common types
    first: immutable leaves are returned as they are (deepcopy returns them too), plain
    lists, dicts and tuples are rebuilt, anything else goes to ``asdict``'s own code."""
    kind = type(value)
    if kind in _IMMUTABLE:
        return value
    if kind is list:
        return [_plain(v) for v in value]
    if kind is dict:
        return {_plain(k): _plain(v) for k, v in value.items()}
    if kind is tuple:
        return tuple(_plain(v) for v in value)
    return _ASDICT_INNER(value, dict)


_ASDICT_INNER = getattr(dataclasses, "_asdict_inner")  # noqa: B009 - private: no stub


LOCAL_SHARE = Share()


class QueryHandle:
    """A submitted question: its id at once, its live stage events, its answer when done.

    Events are appended from agentflow's loop thread; ``subscribe`` registers a callback
    (called in that thread) for each new event, e.g. to feed a Server-Sent-Events stream.
    """

    tenant: str | None = None  # the owner (agentflow.tenants); None: asked without one
    slo_class: str | None = None  # the query's SLO class, carried for the scheduler
    db_role: str | DatabaseLogin | None = None  # the database role its SQL runs as (PostgreSQL RLS)
    share: Share = LOCAL_SHARE  # its tenant's share of the database threads (agentflow.shares)
    catalog: bool = False  # its SQL may read the engine's catalog (admins only)

    def __init__(self, query_id: str, question: str, db: str, pipeline: str,
                 slo_s: float | None, conversation_id: str | None = None,
                 history: tuple = ()):
        self.conversation_id = conversation_id
        self.history = history  # earlier turns of the conversation (follow-up context)
        self.query_id = query_id
        self.question = question
        self.db = db
        self.pipeline = pipeline
        self.slo_s = slo_s
        self.min_confidence: float | None = None  # below it the answer is "unsure"
        self.events: list[dict[str, Any]] = []
        self.future: Future = Future()
        self._listeners: list[Any] = []
        self.kept_bytes = 0  # about how many bytes its answer's rows hold (``_trim_handles``)
        self._lock = threading.Lock()

    def _emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(event)

    def subscribe(self, listener) -> list[dict[str, Any]]:
        """Register ``listener`` and return the events so far (no event is missed)."""
        with self._lock:
            self._listeners.append(listener)
            return list(self.events)

    def unsubscribe(self, listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Answer:
        return self.future.result(timeout)


def usage_of(query: Query) -> dict[str, Any]:
    """LLM calls and tokens, in total and per stage type."""
    by_stage: dict[str, dict[str, int]] = defaultdict(
        lambda: {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0})
    for record in query.timeline:
        for call in record.llm_calls:
            s = by_stage[record.stage]
            s["calls"] += 1
            s["prompt_tokens"] += call.prompt_tokens
            s["completion_tokens"] += call.completion_tokens
    total = {k: sum(s[k] for s in by_stage.values())
             for k in ("calls", "prompt_tokens", "completion_tokens")}
    return {**total, "by_stage": dict(by_stage)}


class AgentFlow(TeachingMixin):  # + teach/examples/define/glossary (agentflow.teaching)
    def _open_teaching(self, path: str | None) -> TeachingStore:
        """``teaching_store`` may name a state store's URL (replicas share its tables)."""
        from agentflow.state.teaching import open_teaching_store

        return open_teaching_store(path)

    def __init__(self, config: AgentFlowConfig | None = None, *,
                 backends: dict[str, LLMBackend] | None = None,
                 router: CallRouter | None = None):
        self.config = config or AgentFlowConfig()
        self.catalog = DatabaseCatalog.from_config(self.config)
        # SQL runs in these threads, each tenant within its share (agentflow.shares)
        self.shares = DbShares(self.config.db_workers,
                               self.config.db_tenant_threads or default_tenant_max())
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentflow-loop",
                                        daemon=True)
        self._thread.start()
        self.backends = backends if backends is not None else self._create_backends()
        self.router = router or self._create_router()
        self._fewshot = None
        self._fewshot_loaded = False
        self._traces = TraceWriter(self.config.record) if self.config.record else None
        self._closed = False
        self._closing = False
        self.handles: dict[str, QueryHandle] = {}  # recent queries by id (bounded)
        self._tasks: dict[str, asyncio.Task] = {}
        self._cancel_reasons: dict[str, str] = {}
        from agentflow.conversation import Conversations

        self.conversations = Conversations()

    # ----------------------------------------------------------------------------- public
    def ask(self, question: str, db: str, *, slo: float | None = None,
            pipeline: str | None = None, evidence: str = "",
            record: str | Path | None = None, conversation: str | None = None,
            tenant: str | Tenant | None = None,
            slo_seconds: float | None = None,
            min_confidence: float | None = None,
            slo_class: str | None = None) -> Answer:
        """Answer one question (blocking). Raises an ``AgentflowError`` (``InvalidRequest``,
        ``DatabaseNotFoundError``, ...) for bad input; pipeline failures come back as an
        Answer with ``status='failed'`` and the reason. ``conversation``: the
        ``conversation_id`` of an earlier answer, to ask a follow-up question. ``tenant``
        (a name or a ``Tenant``) owns the query: see ``agentflow.tenants``.
        ``min_confidence`` (default: the config's): below it the answer is ``unsure``.
        ``slo_class`` (default: the tenant's, else ``standard``): see ``agentflow.slo_classes``;
        without ``slo`` the query's deadline is the class's ``slo_seconds``, if it has one."""
        return self.submit(question, db, slo=slo, pipeline=pipeline, evidence=evidence,
                           record=record, conversation=conversation, tenant=tenant,
                           slo_seconds=slo_seconds, min_confidence=min_confidence,
                           slo_class=slo_class).result()

    async def ask_async(self, question: str, db: str, *, slo: float | None = None,
                        pipeline: str | None = None, evidence: str = "",
                        record: str | Path | None = None,
                        conversation: str | None = None,
                        tenant: str | Tenant | None = None,
                        slo_seconds: float | None = None,
                        min_confidence: float | None = None,
                        slo_class: str | None = None) -> Answer:
        handle = self.submit(question, db, slo=slo, pipeline=pipeline, evidence=evidence,
                             record=record, conversation=conversation, tenant=tenant,
                             slo_seconds=slo_seconds, min_confidence=min_confidence,
                             slo_class=slo_class)
        try:
            return await asyncio.wrap_future(handle.future)
        except asyncio.CancelledError:
            self.cancel(handle.query_id)  # the caller stopped waiting: stop the work too
            raise

    def submit(self, question: str, db: str, *, slo: float | None = None,
               pipeline: str | None = None, evidence: str = "",
               record: str | Path | None = None,
               conversation: str | None = None,
               tenant: str | Tenant | None = None,
               slo_seconds: float | None = None,
               min_confidence: float | None = None,
               slo_class: str | None = None,
               query_id: str | None = None) -> QueryHandle:
        """Start answering without waiting: bad input raises here, at once; the handle has
        the query id, live stage events and, later, the answer. Each question is a turn of a
        conversation: a new one unless ``conversation`` names an earlier answer's.
        ``query_id``: run it under this id (a server replica re-running a query whose
        replica died); by default a new one."""
        if self._closed or self._closing:
            raise ShuttingDownError("agentflow is shutting down; not accepting questions")
        from agentflow.slo_classes import one_slo

        slo = one_slo(slo, slo_seconds)  # the HTTP/MCP name works here too
        question = self._validate(question, slo)
        from agentflow.confidence import validate_threshold

        try:
            threshold = validate_threshold(min_confidence if min_confidence is not None
                                           else self.config.min_confidence)
        except ValueError as err:
            raise InvalidRequest(str(err)) from None
        pipeline_obj = self.pipeline(pipeline)
        entry = self.catalog.entry(db)
        who = as_tenant(tenant)
        if who is not None and not who.may_use(entry.db_id):  # as if it did not exist
            mine = [d for d in self.catalog.ids if who.may_use(d)]
            raise DatabaseNotFoundError(f"unknown database {db!r} (known: "
                                        f"{', '.join(mine) or 'none'})")
        from agentflow.slo_classes import choose_class, deadline_s

        klass = choose_class(slo_class, who.slo_class if who else None,
                             self.config.scheduler.slo_classes,  # UnknownSloClassError
                             ceiling=who is not None and not who.admin)
        slo = deadline_s(slo, klass, self.config.slo_s)
        if conversation is not None:
            history = self.conversations.follow(conversation, entry.db_id, viewer=who)
        else:
            conversation, history = self.conversations.start(entry.db_id, owner_of(who)), ()
        query_id = query_id or f"q-{uuid.uuid4().hex[:12]}"
        handle = QueryHandle(query_id, question, entry.db_id, pipeline_obj.name, slo,
                             conversation_id=conversation, history=history)
        handle.tenant, handle.slo_class = owner_of(who), klass.name
        handle.db_role = who.db_role(entry.db_id) if who else None
        handle.share = self.share_of(who)
        handle.catalog = bool(who and who.admin)
        handle.min_confidence = threshold
        self.handles[query_id] = handle
        self._trim_handles()
        task_future = self._submit(self._ask(handle, db, pipeline_obj, evidence, record))

        def copy_result(f: Future) -> None:
            if handle.future.done():  # the caller gave up waiting (e.g. cancelled ask_async)
                return
            if f.cancelled():
                handle.future.cancel()
            elif f.exception() is not None:
                handle.future.set_exception(f.exception())
            else:
                answer = f.result()
                answer.tenant, answer.slo_class = handle.tenant, handle.slo_class
                handle.kept_bytes = sum(row_bytes(tuple(r)) for r in answer.rows)
                handle.future.set_result(answer)
        task_future.add_done_callback(copy_result)
        return handle

    def share_of(self, tenant: str | Tenant | None) -> Share:
        """``tenant``'s share of the database threads (its weight x its class's)."""
        return share_of(as_tenant(tenant), self.config.scheduler.slo_classes)

    def get(self, query_id: str, *, tenant: str | Tenant | None = None) -> QueryHandle | None:
        """A recent query's handle; None when unknown, forgotten, or another tenant's."""
        handle = self.handles.get(query_id)
        return handle if handle is not None and sees(as_tenant(tenant), handle.tenant) \
            else None

    def cancel(self, query_id: str, *, tenant: str | Tenant | None = None) -> bool:
        """Cancel a running query; its answer then has ``status='cancelled'``. Returns False
        when the query is unknown, another tenant's or already finished."""
        handle = self.get(query_id, tenant=tenant)
        if handle is None or handle.done():
            return False
        self._loop.call_soon_threadsafe(self._cancel_in_loop, query_id, "cancelled by request")
        return True

    def _cancel_in_loop(self, query_id: str, reason: str) -> None:
        # Remember the request even when the query's task has not started yet (a cancel
        # right after submit): ``_ask`` checks it before doing any work.
        if query_id in self._cancel_reasons:
            return  # already cancelling: a second cancel would interrupt its clean-up
        self._cancel_reasons[query_id] = reason
        task = self._tasks.get(query_id)
        if task is not None and not task.done():
            task.cancel()

    def close(self, drain_s: float = 0.0) -> None:
        """Stop: wait up to ``drain_s`` for queries in flight, cancel the rest (their answers
        say so), then release backends and databases.

        Every task that may still call a backend (a query, one of its stages, a call being
        tokenized) is cancelled *and joined* on the loop before any backend is closed: a
        llama.cpp model freed under a running stage crashes the process (SIGSEGV)."""
        if self._closed:
            return
        self._closing = True
        pending = [h.future for h in self.handles.values() if not h.done()]
        if pending and drain_s > 0:
            from concurrent.futures import wait

            wait(pending, timeout=drain_s)
        try:
            self._submit(self._cancel_and_join("cancelled: agentflow is shutting down")) \
                .result(timeout=60)
            self._submit(self._close_backends()).result(timeout=60)
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self.shares.close()
            self.catalog.close()

    async def _cancel_and_join(self, reason: str, patience_s: float = 30.0) -> None:
        """Cancel every unfinished query and wait until no task but this one is left on the
        loop (stage tasks included), so nothing touches a backend after this returns."""
        for query_id, handle in list(self.handles.items()):
            if not handle.done():
                self._cancel_in_loop(query_id, reason)
        me = asyncio.current_task()
        deadline = self._loop.time() + patience_s
        while True:
            others = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
            if not others:
                return
            left = deadline - self._loop.time()
            if left <= 0:  # a stage ignores cancellation: cancel it directly, then wait
                for task in others:
                    task.cancel()
                await asyncio.wait(others, timeout=5)
                return
            await asyncio.wait(others, timeout=min(left, 1.0))

    def __enter__(self) -> AgentFlow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------- internals
    def _submit(self, coro) -> Future:
        if self._closed:
            coro.close()
            raise RuntimeError("this AgentFlow is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _trim_handles(self, keep: int = 1000, keep_bytes: int | None = None) -> None:
        """Forget the oldest finished queries beyond ``keep``, and beyond ``keep_bytes`` of
        answer rows in all (``KEPT_ANSWER_BYTES``: a thousand 16 MB answers would otherwise
        stay in memory); never one still running."""
        budget = KEPT_ANSWER_BYTES if keep_bytes is None else keep_bytes
        kept = sum(h.kept_bytes for h in list(self.handles.values()))
        if len(self.handles) <= keep and kept <= budget:
            return
        for query_id in list(self.handles):
            if len(self.handles) <= keep and kept <= budget:
                break
            handle = self.handles.get(query_id)
            if handle is not None and handle.done():
                kept -= handle.kept_bytes
                self.handles.pop(query_id, None)

    def _create_backends(self) -> dict[str, LLMBackend]:
        if self.config.placement is not None:  # instances as Ray actors on their nodes
            from agentflow.distributed.ray_backend import start_instances

            backends: dict[str, LLMBackend] = dict(start_instances(self.config, loop=self._loop))
            return backends
        if self.config.scheduler.shard_hosts != "local":  # the shards' processes have them
            return {}
        from agentflow.llm.registry import create_backend

        return {inst.label: create_backend(inst.backend) for inst in self.config.instances}

    def _create_router(self) -> CallRouter:
        """Every call goes through the scheduler: one instance spec per configured backend."""
        from agentflow.config import InstanceConfig
        from agentflow.scheduler import ScheduledRouter, build_coordinator
        from agentflow.scheduler.setup import scheduler_settings

        by_name = {i.name: i for i in self.config.instances}
        # Backends passed in code without a configured instance run as plain CPU instances.
        instances = [by_name.get(name) or InstanceConfig(name=name) for name in self.backends] \
            if self.backends else list(self.config.instances)
        sched = self.config.scheduler
        if sched.shards > 1 or sched.shard_hosts != "local":  # K coordinators, maybe shared
            from agentflow.scheduler.shard_router import build_sharded_router

            return build_sharded_router(self.config, instances, self.backends,
                                        MonotonicClock())
        coordinator = build_coordinator(instances, clock=MonotonicClock(),
                                        **scheduler_settings(self.config.scheduler))
        return ScheduledRouter(coordinator, self.backends,
                               revive_after_s=self.config.scheduler.revive_after_s,
                               health=self.config.scheduler.health)

    async def _close_backends(self) -> None:
        for backend in self.backends.values():
            await backend.close()
        close = getattr(self.router, "close", None)  # a sharded router's shard actors
        if close is not None:
            await close()

    def pipeline(self, name: str | None) -> Pipeline:
        from pipelines import get_pipeline

        name = name or self.config.pipeline
        try:
            return get_pipeline(name, **self.config.pipeline_params.get(name, {}))
        except ValueError as err:
            raise InvalidRequest(str(err)) from None

    def fewshot_pool(self):
        """The retrieval pool for few-shot examples: configured, or 'auto' — the train split
        of a registered Spider/BIRD folder (never the split questions are evaluated on)."""
        if self._fewshot_loaded:
            return self._fewshot
        self._fewshot_loaded = True
        setting = self.config.fewshot
        if setting is None:
            return None
        from agentflow.datasets import load_dataset
        from agentflow.retrieval import FewShotPool

        if setting == "auto":
            for dataset in self.catalog.datasets:
                if dataset.kind == "demo":
                    continue
                try:
                    self._fewshot = FewShotPool.for_dataset(load_dataset(dataset.root, "train"))
                    break
                except FileNotFoundError:
                    continue
        else:
            self._fewshot = FewShotPool.for_dataset(load_dataset(setting.dataset, setting.split))
        return self._fewshot

    def _validate(self, question: str, slo: float | None) -> str:
        if not isinstance(question, str) or not question.strip():
            raise InvalidRequest("the question is empty")
        if len(question) > MAX_QUESTION_CHARS:
            raise InvalidRequest(f"the question is too long ({len(question)} characters; "
                                 f"at most {MAX_QUESTION_CHARS})")
        if slo is not None and not (0 < slo <= 24 * 3600):
            raise InvalidRequest(f"slo must be a positive number of seconds, got {slo!r}")
        return question.strip()

    async def _ask(self, handle: QueryHandle, db: str, pipeline: Pipeline, evidence: str,
                   record: str | Path | None) -> Answer:
        task = asyncio.current_task()
        assert task is not None  # a coroutine run by the loop always has its task
        self._tasks[handle.query_id] = task
        try:
            if handle.query_id in self._cancel_reasons:  # cancelled before it started
                raise asyncio.CancelledError
            return await self._answer(handle, db, pipeline, evidence, record)
        except asyncio.CancelledError:
            # Cancelled before the pipeline ran (execute() answers for itself after that).
            reason = self._cancel_reasons.pop(handle.query_id, "cancelled")
            handle._emit({"type": "done", "query_id": handle.query_id, "status": "cancelled",
                          "error": reason, "latency_s": None})
            return Answer(query_id=handle.query_id, question=handle.question, db=handle.db,
                          pipeline=handle.pipeline, status="cancelled", error=reason,
                          sql=None, slo_s=handle.slo_s, conversation_id=handle.conversation_id)
        finally:
            self._tasks.pop(handle.query_id, None)
            self._cancel_reasons.pop(handle.query_id, None)

    async def _answer(self, handle: QueryHandle, db: str, pipeline: Pipeline, evidence: str,
                      record: str | Path | None) -> Answer:
        question, slo = handle.question, handle.slo_s
        database = await asyncio.to_thread(self.catalog.open, db, handle.db_role)
        samples = max(0, int(getattr(pipeline, "samples", 3) or 0))
        if samples > database.prompts_prepared:
            # The first query of a database (view): its prompts' sample-value SQL runs here,
            # in a worker thread, not in the pipeline's stages on the loop.
            await asyncio.to_thread(database.prepare_prompts, samples)
        if handle.catalog:  # an admin's SQL may read server paths, settings and roles
            database = database.with_catalog()
        entry = self.catalog.entry(db)
        fewshot, glossary = await asyncio.to_thread(  # taught pairs + the dataset pool
            self._taught_context, entry.db_id, handle, getattr(handle, "tenant", None))
        env = PipelineEnv(db=database, fewshot=fewshot, glossary=glossary,
                          descriptions=entry.entry.descriptions if entry.entry else {},
                          sql_timeout_s=self.config.sql_timeout_s, max_rows=self.config.max_rows,
                          constrain_sql=self.config.constrain_sql, history=handle.history,
                          run_db=functools.partial(self.shares.run, handle.share))
        clock = self.router.clock
        query = Query(question=question, db_id=entry.db_id, arrival=clock.now(), slo_s=slo,
                      evidence=evidence, pipeline=pipeline.name, id=handle.query_id,
                      slo_class=handle.slo_class, tenant=handle.tenant)
        graph = await asyncio.to_thread(pipeline.build, query, env)
        run = WorkflowRun(query, graph)
        from agentflow.scheduler import QueryRejected
        from agentflow.scheduler.backlog import rejection_details

        try:
            self.router.start_query(query, run)
        except QueryRejected as err:
            query.status, query.error = QueryStatus.REJECTED, err.reason
            handle._emit({"type": "done", "query_id": query.id, "status": "rejected",
                          "error": err.reason, "latency_s": None})
            return Answer(query_id=query.id, question=question, db=entry.db_id,
                          pipeline=pipeline.name, status="rejected", error=err.reason,
                          sql=None, slo_s=slo, conversation_id=handle.conversation_id,
                          details=rejection_details(err))
        state: dict[str, Any] = {}
        try:
            state = await execute(run, self.router, env, state, observer=handle._emit)
        except asyncio.CancelledError:
            query.error = self._cancel_reasons.pop(query.id, "cancelled")
            self.router.cancel_query(query.id)
        finally:
            self.router.end_query(query)
        output = pipeline.output(state)
        # A cancelled query was never finished, so there is no answer to judge: a score of
        # the half-done state would read as "Low confidence: likely wrong" on the page.
        judged = output.confidence if query.status != QueryStatus.CANCELLED else None
        answer = Answer(query_id=query.id, question=question, db=entry.db_id,
                        pipeline=pipeline.name, status=query.status.value, error=query.error,
                        sql=output.sql, slo_s=slo, details=output.details,
                        conversation_id=handle.conversation_id,
                        confidence=judged.to_dict() if judged else None)
        if query.status == QueryStatus.DONE and output.error:
            query.status, query.error = QueryStatus.FAILED, output.error
            answer.status, answer.error = "failed", output.error
        final = state.get("final")
        if query.status == QueryStatus.DONE and final is not None and final.ok:
            answer.columns = list(final.columns)
            answer.rows = [list(r) for r in final.rows]
            answer.truncated_by = getattr(final, "truncated_by", None) or (
                "rows" if len(final.rows) >= self.config.max_rows else None)
            answer.truncated = answer.truncated_by is not None
        from agentflow.confidence import UNSURE, below, unsure_message

        threshold = handle.min_confidence
        if (answer.status == "done" and answer.confidence is not None and threshold is not None
                and below(answer.confidence, threshold)):
            answer.status = UNSURE  # explicit, never a silent done; sql and rows stay attached
            answer.error = unsure_message(answer.confidence, threshold)
        if answer.status == "done" and handle.conversation_id:
            self.conversations.add(handle.conversation_id, question, answer.sql)
        answer.latency_s = query.latency_s
        answer.stages = query.timeline_dicts()
        answer.usage = usage_of(query)
        self._record(query, pipeline, output.sql, state, record)
        handle._emit({"type": "done", "query_id": query.id, "status": answer.status,
                      "error": answer.error, "latency_s": answer.latency_s})
        return answer

    def _record(self, query: Query, pipeline: Pipeline, sql: str | None, state: dict,
                extra_path: str | Path | None) -> None:
        writers = [w for w in (self._traces, TraceWriter(extra_path) if extra_path else None) if w]
        if not writers:
            return
        rec = trace_record(query, pipeline=pipeline.describe(), sql=sql,
                           texts=state.get("_llm_texts"))
        for writer in writers:
            writer.write(rec)


def connect(config: AgentFlowConfig | dict | str | Path | None = None, **kwargs: Any) -> AgentFlow:
    """Start agentflow. ``config``: a config object, a dict, or a YAML/JSON file path;
    ``None`` is the embedded default (local CPU model, demo database)."""
    if isinstance(config, (str, Path)):
        config = AgentFlowConfig.load(config)
    elif isinstance(config, dict):
        config = AgentFlowConfig.model_validate(config)
    return AgentFlow(config, **kwargs)


__all__ = ["AgentFlow", "AgentflowError", "Answer", "ConversationNotFoundError",
           "DatabaseNotFoundError", "InvalidRequest", "QueryHandle", "ShuttingDownError",
           "SqlError", "connect"]

