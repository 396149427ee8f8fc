"""One server replica's side of the shared state: what it runs goes into the store, what
others run comes out of it.

Every query this replica starts is recorded (request, owner, events as they happen, the
answer once), so any replica — or this one after a restart — can show its status, stream
its events, serve its rows and take a cancel for it. A background thread keeps the
replica's heartbeat, hands this replica the cancels others took for its queries, follows
the queries of others that someone here is waiting on, and takes over the queries of a
replica whose heartbeat stopped: Text-to-SQL is read-only, so running the pipeline again
under the same id is safe, and the store accepts one answer per query, from its current
owner only. The move is an event of the query and is named in its answer's details.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import fields
from typing import Any

from agentflow.api import AgentFlow, Answer, QueryHandle
from agentflow.state import QueryRecord, QueryRequest, StateStore
from agentflow.state.limits import StoreLimits
from agentflow.tenants import Tenant, TenantTable

log = logging.getLogger("agentflow.server")

_ANSWER_FIELDS = {f.name for f in fields(Answer)}


def answer_of(data: dict[str, Any]) -> Answer:
    """An ``Answer`` back from its stored dict (``to_dict``'s derived keys dropped)."""
    return Answer(**{k: v for k, v in data.items() if k in _ANSWER_FIELDS})


class RemoteHandle(QueryHandle):
    """A query known from the store (another replica's, or from before a restart): the same
    face as a live handle, its events and answer filled in from the store."""

    def __init__(self, record: QueryRecord, events: list[dict[str, Any]]):
        r = record.request
        super().__init__(record.query_id, r.question, r.db, r.pipeline, r.slo_s,
                         conversation_id=r.conversation_id)
        self.tenant, self.slo_class = record.tenant, r.slo_class
        self.owner = record.owner
        self.events = list(events)
        self.seen = time.monotonic()
        if record.answer is not None:
            self.future.set_result(answer_of(record.answer))

    def feed(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self._emit(event)


class Replica:
    """Mirrors this replica's queries into ``store`` and follows everyone else's there."""

    def __init__(self, store: StateStore, af: AgentFlow, limits: StoreLimits,
                 tenants: TenantTable, *, replica_id: str | None = None, lease_s: float = 5.0,
                 tick_s: float = 0.05, watch_s: float = 900.0,
                 on_moved: Callable[[QueryHandle], None] | None = None):
        self.store = store
        self.af = af
        self.limits = limits
        self.tenants = {t.name: t for t in tenants.tenants()}
        self.id = replica_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.lease_s = lease_s
        self.tick_s = tick_s
        self.watch_s = watch_s
        self.on_moved = on_moved  # the service counts and watches a moved query like its own
        self._seq: dict[str, int] = {}
        self._seq_lock = threading.Lock()
        # events and "running" marks wait here for the next batch (one commit per tick)
        self._pending: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self._running: set[str] = set()
        self._pending_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one batch (or one finish) queued at a time
        # answers queued for the store, not yet committed: a client told "done" here must
        # find it done on any replica, so the server waits on these before it says so
        self._storing: dict[str, Future] = {}
        self._watched: dict[str, RemoteHandle] = {}
        self._watch_lock = threading.Lock()
        self._stop = threading.Event()
        self.moved_here = 0
        store.register_replica(self.id, f"pid {os.getpid()}")
        self._thread = threading.Thread(target=self._run, name=f"replica-{self.id}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ this replica's
    def track(self, handle: QueryHandle, *, created: bool = False, start_seq: int = 0) -> None:
        """Record ``handle`` (unless ``created``: a moved query's record exists) and mirror
        its events and answer into the store from now on."""
        if not created:
            self.store.create_query(QueryRecord(
                query_id=handle.query_id, tenant=handle.tenant, owner=self.id,
                request=request_of(handle)))
        lock = threading.Lock()
        self._seq[handle.query_id] = start_seq
        state = {"running": False}

        def write(event: dict[str, Any]) -> None:  # queued: the next tick writes the batch
            with self._seq_lock:
                seq = self._seq[handle.query_id] = self._seq.get(handle.query_id, 0) + 1
            with self._pending_lock:
                self._pending.setdefault(handle.query_id, []).append((seq, event))
                if not state["running"] and event.get("type") == "stage_started":
                    state["running"] = True
                    self._running.add(handle.query_id)

        def listener(event: dict[str, Any]) -> None:
            with lock:
                write(event)

        with lock:  # events that come while the past ones are written wait for them
            for event in handle.subscribe(listener):
                write(event)
        handle.future.add_done_callback(lambda f: self._finished(handle, f))

    def _finished(self, handle: QueryHandle, future: Future) -> None:
        if future.cancelled():
            data = _synthetic(handle, "cancelled", "cancelled")
        elif future.exception() is not None:
            err = future.exception()
            data = _synthetic(handle, "failed", f"{type(err).__name__}: {err}")
        else:
            data = future.result().to_dict()
        try:
            # Queued behind any batch of its events, with its last events: the writer
            # thread commits it; this (the engine's loop) does not wait for that.
            with self._flush_lock:
                with self._pending_lock:
                    events = self._pending.pop(handle.query_id, [])
                    self._running.discard(handle.query_id)
                future = self.store.finish_later(handle.query_id, self.id, data, events)
                self._storing[handle.query_id] = future
            future.add_done_callback(lambda f: self._stored(handle.query_id, f))
        except Exception:  # noqa: BLE001 - say so; the answer is still served from memory
            log.exception("storing the answer of %s failed", handle.query_id)
        with self._seq_lock:
            self._seq.pop(handle.query_id, None)

    def _stored(self, query_id: str, future: Future) -> None:
        self._storing.pop(query_id, None)
        if not future.cancelled() and future.exception() is None and not future.result():
            log.warning("query %s was answered elsewhere (it moved); this answer is "
                        "dropped", query_id)

    def storing(self, query_id: str) -> Future | None:
        """The commit of this replica's answer to ``query_id`` while it is under way."""
        return self._storing.get(query_id)

    # ------------------------------------------------------------------ everyone's
    def lookup(self, query_id: str) -> RemoteHandle | None:
        record = self.store.get_query(query_id)
        if record is None:
            return None
        handle = RemoteHandle(record, self.store.events(query_id))
        if not handle.done():
            with self._watch_lock:
                self._watched[f"{query_id}:{id(handle)}"] = handle
        return handle

    def recent(self, tenant: str | None, limit: int, everyone: bool) -> list[QueryRecord]:
        return self.store.recent(tenant, limit, everyone=everyone)

    def request_cancel(self, query_id: str, reason: str = "cancelled by request") -> bool:
        return self.store.request_cancel(query_id, reason)

    def flush(self) -> None:
        """Write the queued events and running marks, all queries in one transaction."""
        with self._flush_lock:
            with self._pending_lock:
                events, self._pending = self._pending, {}
                running, self._running = self._running, set()
            if events or running:  # queued in order; the writer commits it
                self.store.add_events(events, running, owner=self.id, wait=False)

    # ------------------------------------------------------------------ the background
    def _run(self) -> None:
        last_beat = last_scan = 0.0
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            try:
                self.flush()
                if now - last_beat >= self.lease_s / 5:
                    self.store.heartbeat(self.id)
                    last_beat = now
                self._cancels()
                self._follow()
                if now - last_scan >= self.lease_s / 2:
                    last_scan = now
                    for record in self.store.claim_orphans(self.id, self.lease_s):
                        self._rerun(record)
            except Exception:  # noqa: BLE001 - a store hiccup must not stop the replica
                if not self._stop.is_set():
                    log.exception("replica %s: state store step failed", self.id)

    def _cancels(self) -> None:
        for query_id, reason in self.store.cancel_requests(self.id):
            handle = self.af.handles.get(query_id)
            if handle is not None and not handle.done():
                self.af._loop.call_soon_threadsafe(self.af._cancel_in_loop, query_id, reason)

    def _follow(self) -> None:
        with self._watch_lock:
            watched = list(self._watched.items())
        for key, handle in watched:
            record = self.store.get_query(handle.query_id)
            handle.feed(self.store.events(handle.query_id, after=len(handle.events)))
            if record is None or record.answer is not None \
                    or time.monotonic() - handle.seen > self.watch_s:
                if record is not None and record.answer is not None:
                    handle.future.set_result(answer_of(record.answer))
                elif not handle.future.done():
                    handle.future.set_result(answer_of(_synthetic(
                        handle, "failed", "the query was forgotten before it finished")))
                with self._watch_lock:
                    self._watched.pop(key, None)

    def _rerun(self, record: QueryRecord) -> None:
        """Run a dead replica's query here, under its id and in its conversation."""
        r, tenant = record.request, self._tenant(record.tenant)
        move = record.moves[-1]
        log.warning("query %s moved here from replica %s (no heartbeat for %.0fs)",
                    record.query_id, move["from"], self.lease_s)
        seq = self.store.last_seq(record.query_id)  # the dead replica's events stay first
        try:
            handle = self.af.submit(r.question, r.db, slo=r.slo_s, pipeline=r.pipeline,
                                    evidence=r.evidence, conversation=r.conversation_id,
                                    tenant=tenant, min_confidence=r.min_confidence,
                                    slo_class=r.slo_class, query_id=record.query_id)
        except Exception as err:  # noqa: BLE001 - answer it as failed, never drop it
            self.store.finish_query(record.query_id, self.id, {
                "query_id": record.query_id, "question": r.question, "db": r.db,
                "pipeline": r.pipeline, "status": "failed", "sql": None, "slo_s": r.slo_s,
                "error": f"could not re-run after replica {move['from']} died: {err}",
                "details": {"moved": record.moves}, "tenant": record.tenant})
            return
        self.moved_here += 1
        if tenant is not None and tenant.max_concurrent is not None:
            self.limits.hold(tenant.name)
            handle.future.add_done_callback(lambda _: self.limits.release(tenant.name))

        def note(f: Future) -> None:  # the answer names the move (before it is stored)
            if not f.cancelled() and f.exception() is None:
                f.result().details["moved"] = record.moves
        handle.future.add_done_callback(note)
        with handle._lock:  # the move heads this run's events, here and in the store
            handle.events.insert(0, {"type": "moved", "query_id": record.query_id, **move})
        self.track(handle, created=True, start_seq=seq)
        if self.on_moved is not None:
            self.on_moved(handle)

    def _tenant(self, name: str | None) -> Tenant | None:
        if name is None:
            return None
        return self.tenants.get(name) or Tenant(name=name)

    def close(self) -> None:
        """Stop the heartbeat and leave cleanly (after this replica's queries ended)."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.flush()
            self.store.deregister_replica(self.id)
        except Exception:  # noqa: BLE001 - shutting down: say so, go on
            log.exception("replica %s: leaving the state store failed", self.id)
        self.store.close()


def request_of(handle: QueryHandle) -> QueryRequest:
    return QueryRequest(question=handle.question, db=handle.db, pipeline=handle.pipeline,
                        slo_s=handle.slo_s, evidence=getattr(handle, "evidence", ""),
                        conversation_id=handle.conversation_id,
                        min_confidence=handle.min_confidence, slo_class=handle.slo_class)


def _synthetic(handle: QueryHandle, status: str, error: str) -> dict[str, Any]:
    return {"query_id": handle.query_id, "question": handle.question, "db": handle.db,
            "pipeline": handle.pipeline, "status": status, "error": error, "sql": None,
            "slo_s": handle.slo_s, "conversation_id": handle.conversation_id,
            "tenant": handle.tenant, "slo_class": handle.slo_class}
