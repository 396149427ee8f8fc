"""The virtual-time driver: the real workflow runtime and coordinator, simulated GPUs.

A discrete-event loop over a heap of (time, sequence, event). Arrivals build a
``WorkflowRun`` per query from its recorded DAG and register it with the ``Coordinator``
(same objects and policies as real serving, with a ``ManualClock``); ready LLM stages become
coordinator calls, whose ``StartCall`` decisions feed ``SimInstance`` engines; engine events
(progress, finish) go back to the coordinator and the runs. Tool steps take their recorded
duration. Deterministic: no wall clock, seeded randomness, stable tie-breaking.

The scheduler is told only what serving would know: a stage's prompt when it is ready, the
pipeline's ``max_tokens`` caps, tool steps' mean duration so far — never a future call's
recorded sizes. Those go to the length model through ``reveal``, which only the ``oracle``
model listens to.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from agentflow import hardware
from agentflow.scheduler import Coordinator, FailCall, InstanceSpec, QueryRejected, StartCall
from agentflow.scheduler.length_models import TrueLengths, make_predictor
from agentflow.scheduler.policies import parse_policy
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.engine import SimInstance
from agentflow.sim.workload import TraceNode, TraceQuery
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun


# A tool step's expected duration before any step of its stage has finished (the pipelines'
# own default guess, agentflow's pipelines.common.TOOL_EXPECTED_S).
TOOL_PRIOR_S = 0.05


_LOCK_TYPES = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}


async def _replayed(ctx):  # pragma: no cover - simulated stages are never executed
    raise RuntimeError("a simulated stage has no code to run")


@dataclass
class QueryRecord:
    id: str
    arrival: float
    slo_s: float  # the deadline the scheduler was given (scale x idle latency)
    idle_latency_s: float
    status: str = "pending"  # done | rejected | failed
    finish: float | None = None
    reason: str | None = None
    calls: int = 0

    @property
    def latency_s(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival


@dataclass
class SimResult:
    policy: str
    records: list[QueryRecord]
    alpha_history: list[tuple[float, float]] = field(default_factory=list)
    events: int = 0

    def summary(self, scales=(1.0, 1.5, 2.0, 3.0, 5.0)) -> dict[str, Any]:
        from agentflow.sim.metrics import summarize

        return summarize(self, scales)


class Simulation:
    def __init__(self, cluster: SimClusterConfig, policy: str, *, alpha: float | None = None,
                 embedder: str = "hashing", max_waiting_calls: int | None = None,
                 alpha_tuner: Any = None, cached_prefix: float = 0.0):
        if not 0.0 <= cached_prefix < 1.0:
            raise ValueError("cached_prefix must be in [0, 1)")
        # Fraction of every prompt served from a prefix cache (0: cold prompts, physical
        # prefill; the vLLM latency measurements correspond to fully cached prompts).
        self.cached_prefix = cached_prefix
        self.cluster = cluster
        self.policy = policy
        self.clock = ManualClock(0.0)
        self.instances: dict[str, SimInstance] = {}
        specs = []
        for name, cfg in cluster.expanded():
            engine = make_engine(name, cfg)
            self.instances[name] = engine
            # The coordinator admits no more than the engine's KV cache holds, so calls wait
            # in the coordinator's queue — ordered by the queue policy — rather than inside
            # the engine, where only admission order counts.
            specs.append(InstanceSpec(name=name, gpu=cfg.gpu, model=cfg.model,
                                      max_inflight=cfg.max_inflight,
                                      max_pending_prefill=cfg.max_pending_prefill,
                                      kv_token_budget=engine.kv_blocks_total * engine.block_size,
                                      tensor_parallel=cfg.tensor_parallel,
                                      weight_bits=cfg.weight_bits, kv_bits=cfg.kv_bits))
        self.predictor = make_predictor(parse_policy(policy).predictor, embedder=embedder)
        self.coordinator = Coordinator(
            specs, clock=self.clock, policy=policy, alpha=alpha, predictor=self.predictor,
            max_waiting_calls=max_waiting_calls)
        self.alpha_tuner = alpha_tuner
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._versions: dict[str, int] = {name: 0 for name in self.instances}
        self._runs: dict[str, tuple[WorkflowRun, TraceQuery, QueryRecord]] = {}
        self._calls: dict[str, Any] = {}  # call id -> ScheduledCall
        self._trace_nodes: dict[str, dict[str, TraceNode]] = {}  # query id -> node id -> node
        self._tool_s: dict[str, tuple[float, int]] = {}  # stage -> (mean duration, count)
        self.events = 0

    # ------------------------------------------------------------------------------ public
    def run(self, queries: list[TraceQuery], arrivals: list[float], slo_s: list[float],
            idle_latency_s: list[float]) -> SimResult:
        records = []
        for i, (q, t, slo, idle) in enumerate(zip(queries, arrivals, slo_s, idle_latency_s)):
            record = QueryRecord(id=f"{i}:{q.id}", arrival=float(t), slo_s=slo,
                                 idle_latency_s=idle)
            records.append(record)
            self._push(float(t), "arrival", (q, record))
        if self.alpha_tuner is not None:
            self.alpha_tuner.attach(self, queries, arrivals, slo_s, idle_latency_s)
        self.drain()
        history = self.alpha_tuner.history if self.alpha_tuner is not None else []
        return SimResult(policy=self.policy, records=records, alpha_history=history,
                         events=self.events)

    def drain(self) -> None:
        """Process events until none is left (``run`` does this; a forked simulation that was
        given more arrivals with ``add_arrival`` does it too)."""
        while self._heap:
            t, _, kind, payload = heapq.heappop(self._heap)
            self.clock.advance_to(max(t, self.clock.now()))
            self.events += 1
            if kind == "arrival":
                self._on_arrival(*payload)
            elif kind == "tool_done":
                self._on_node_done(*payload)
            elif kind == "instance":
                name, version = payload
                if version == self._versions[name]:
                    self._on_instance(name)
            elif kind == "hook":
                payload(self)

    def add_arrival(self, query: TraceQuery, record: QueryRecord) -> None:
        """One more query arriving at ``record.arrival`` (forecasts in forked simulations)."""
        self._push(record.arrival, "arrival", (query, record))

    def fork(self) -> "Simulation":
        """A copy of the live state — engines, queues, running and waiting calls, workflows in
        flight — without the future: no pending arrivals, no hooks, no alpha tuner. What a
        tuner replays its forecasts on, so the backlog counts."""
        heap, tuner = self._heap, self.alpha_tuner
        self._heap = [e for e in heap if e[2] not in ("arrival", "hook")]
        self.alpha_tuner = None
        # Locks (the length predictor's, for serving threads) cannot be copied: a fork,
        # single-threaded, gets fresh ones.
        memo: dict[int, Any] = {}
        stack, seen = [self.predictor], set()
        while stack:
            obj = stack.pop()
            if obj is None or id(obj) in seen:
                continue
            seen.add(id(obj))
            for value in getattr(obj, "__dict__", {}).values():
                if isinstance(value, tuple(_LOCK_TYPES)):
                    memo[id(value)] = _LOCK_TYPES[type(value)]()
                elif hasattr(value, "__dict__") and not isinstance(value, type):
                    stack.append(value)
        try:
            clone = copy.deepcopy(self, memo)
        finally:
            self._heap, self.alpha_tuner = heap, tuner
        heapq.heapify(clone._heap)
        return clone

    @property
    def in_flight(self) -> list[QueryRecord]:
        """Records of the queries that arrived and have not finished."""
        return [record for _, _, record in self._runs.values()]

    def schedule_hook(self, t: float, fn: Callable[["Simulation"], None]) -> None:
        self._push(t, "hook", fn)

    @property
    def pending_queries(self) -> int:
        return len(self._runs)

    # ------------------------------------------------------------------------------ events
    def _on_arrival(self, trace: TraceQuery, record: QueryRecord) -> None:
        now = self.clock.now()
        graph = nx.DiGraph()
        for n in trace.nodes:
            if n.kind == "llm":  # no sizes: the stage's prompt is known once it is ready
                hints = {} if n.max_tokens is None else {"max_tokens": n.max_tokens}
                node = Node(n.id, n.stage, NodeKind.LLM, _replayed, hints=hints)
            else:  # a tool step is expected to take what its stage has taken so far
                node = Node(n.id, n.stage, NodeKind.TOOL, _replayed,
                            expected_s=self._tool_s.get(n.stage, (TOOL_PRIOR_S, 0))[0])
            graph.add_node(n.id, node=node)
        graph.add_edges_from((p, n.id) for n in trace.nodes for p in n.parents)
        query = Query(question=trace.question, db_id="", arrival=now, slo_s=record.slo_s,
                      id=record.id)
        run = WorkflowRun(query, graph)
        self.predictor.reveal(record.id, {
            n.id: TrueLengths(n.prompt_tokens, n.output_tokens,
                              n.duration_s if n.kind == "tool" else None)
            for n in trace.nodes})
        try:
            self.coordinator.on_query_arrival(record.id, arrival=now,
                                              deadline=now + record.slo_s,
                                              key_text=trace.question, run=run)
        except QueryRejected as err:
            record.status, record.reason = "rejected", err.reason
            self.predictor.forget(record.id)
            return
        self._runs[record.id] = (run, trace, record)
        self._trace_nodes[record.id] = {n.id: n for n in trace.nodes}
        self._start_ready(record.id)

    def _start_ready(self, query_id: str) -> None:
        run, trace, record = self._runs[query_id]
        recorded = self._trace_nodes[query_id]
        now = self.clock.now()
        for node in run.ready():
            run.mark_started(node.id, now)
            if node.kind == NodeKind.TOOL:
                self._push(now + recorded[node.id].duration_s, "tool_done", (query_id, node.id))
                continue
            record.calls += 1
            call, decisions = self.coordinator.on_call_ready(
                query_id, stage=node.stage, node_id=node.id,
                prompt_tokens=recorded[node.id].prompt_tokens, payload=(query_id, node.id),
                max_tokens=recorded[node.id].max_tokens)
            self._calls[call.id] = call
            self._apply(decisions)

    def _on_node_done(self, query_id: str, node_id: str) -> None:
        entry = self._runs.get(query_id)
        if entry is None:
            return
        run, trace, record = entry
        done = self._trace_nodes[query_id][node_id]
        if done.kind == "tool":
            mean, n = self._tool_s.get(done.stage, (0.0, 0))
            self._tool_s[done.stage] = (mean + (done.duration_s - mean) / (n + 1), n + 1)
        run.mark_done(node_id, self.clock.now())
        if run.finished:
            record.status, record.finish = "done", self.clock.now()
            self.coordinator.on_query_done(query_id)
            self._forget(query_id)
        else:
            self._start_ready(query_id)

    def _on_instance(self, name: str) -> None:
        engine = self.instances[name]
        now = self.clock.now()
        for ev in engine.step_until(now):
            call = self._calls.get(ev.seq_id)
            if call is None:
                continue
            if ev.kind == "finished":
                del self._calls[ev.seq_id]
                self._apply(self.coordinator.on_call_done(
                    call, output_tokens=ev.output_tokens, ttft_s=ev.ttft_s or 0.0,
                    total_s=ev.total_s or 0.0))
                self._on_node_done(*call.payload)
            else:
                self._apply(self.coordinator.on_call_progress(call, ev.output_tokens))
        self._reschedule(name)

    # ------------------------------------------------------------------------------ helpers
    def _apply(self, decisions) -> None:
        now = self.clock.now()
        touched = set()
        for d in decisions:
            if isinstance(d, StartCall):
                call = d.call
                query_id, node_id = call.payload
                try:
                    self.instances[d.instance].add(
                        call.id, call.prompt_tokens,
                        max(1, self._trace_nodes[query_id][node_id].output_tokens),
                        d.priority, now, cached_tokens=int(self.cached_prefix *
                                                           call.prompt_tokens))
                except ValueError as err:  # can never fit this instance's KV cache
                    self._calls.pop(call.id, None)
                    self._apply(self.coordinator.on_call_failed(call, str(err),
                                                                retryable=True))
                    continue
                touched.add(d.instance)
            elif isinstance(d, FailCall):
                query_id = d.call.payload[0]
                entry = self._runs.get(query_id)
                if entry is not None:
                    run, _, record = entry
                    self._forget(query_id)
                    record.status, record.reason = "failed", d.reason
                    run.cancel_pending(now)
                    _, more = self.coordinator.cancel_query(query_id)
                    self._apply(more)
        for name in sorted(touched):
            self._reschedule(name)

    def _forget(self, query_id: str) -> None:
        del self._runs[query_id]
        self._trace_nodes.pop(query_id, None)
        self.predictor.forget(query_id)

    def _reschedule(self, name: str) -> None:
        self._versions[name] += 1
        t = self.instances[name].next_event_time()
        if t is not None:
            self._push(max(t, self.clock.now()), "instance", (name, self._versions[name]))

    def _push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))


def make_engine(name: str, cfg: SimInstanceConfig) -> SimInstance:
    model = hardware.model(cfg.model).quantized(cfg.weight_bits, cfg.kv_bits) \
        if (cfg.weight_bits, cfg.kv_bits) != (16, 16) else hardware.model(cfg.model)
    return SimInstance(gpu=hardware.gpu(cfg.gpu), model=model,
                       tensor_parallel=cfg.tensor_parallel, max_num_seqs=cfg.max_num_seqs,
                       max_num_batched_tokens=cfg.max_num_batched_tokens, name=name)
