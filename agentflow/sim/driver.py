"""The virtual-time driver: the real workflow runtime and coordinator, simulated GPUs.

A discrete-event loop over a heap of (time, sequence, event). Arrivals build a
``WorkflowRun`` per query from its recorded DAG and register it with the ``Coordinator``
(same objects and policies as real serving, with a ``ManualClock``); ready LLM stages become
coordinator calls, whose ``StartCall`` decisions feed ``SimInstance`` engines; engine events
(progress, finish) go back to the coordinator and the runs. Tool steps take their recorded
duration. Deterministic: no wall clock, seeded randomness, stable tie-breaking.

The scheduler is told only what serving would know: the pipeline's initial graph at arrival
and each stage the pipeline adds at run time only once serving would have added it
(``GrowingDag``, through the runtime's own ``Expansion``), a stage's prompt when it is ready,
the pipeline's ``max_tokens`` caps, tool steps' mean duration so far — never a future call's
recorded sizes or a revision round before it exists. The sizes go to the length model through
``reveal``, which only the ``oracle`` model listens to.
"""

from __future__ import annotations

import copy
import gc
import heapq
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentflow.metrics import SLO_SCALES
from agentflow.scheduler import CallState, FailCall, QueryRejected, StartCall
from agentflow.scheduler.decisions import PreemptCall
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS
from agentflow.scheduler.lengths import TrueLengths, make_length_model
from agentflow.scheduler.policies import parse_policy
from agentflow.scheduler.prefix_index import BLOCK_TOKENS
from agentflow.scheduler.setup import build_coordinator
from agentflow.sim.cluster import SimClusterConfig
from agentflow.sim.engine import SimInstance, engine_for
from agentflow.sim.faults import Fault
from agentflow.sim.replay import GrowingDag
from agentflow.sim.workload import TraceNode, TraceQuery
from agentflow.slo_classes import SloClass
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun

# A tool step's expected duration before any step of its stage has finished (the pipelines'
# own default guess, agentflow's pipelines.common.TOOL_EXPECTED_S).
TOOL_PRIOR_S = 0.05


_LOCK_TYPES = {type(threading.Lock()): threading.Lock, type(threading.RLock()): threading.RLock}

# Container allocations between two young-generation collections while events drain
# (CPython's default is 700; see ``_fewer_collections``).
GC_YOUNG_THRESHOLD = 50_000
# How many drains are inside ``_fewer_collections`` now (nested, or in other threads), and
# what the outermost one found: the collector's settings are the process's, so only the
# first in changes them and only the last out puts them back.
_GC_LOCK = threading.Lock()
_gc_depth = 0
_gc_restore: tuple[tuple[int, ...], bool] | None = None


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect garbage less often while the event loop runs, and never walk what existed
    before it. Each event allocates short-lived containers (event tuples, decisions,
    distributions) by the dozen, so at CPython's default threshold a young collection ran
    every ~10 events, its survivors were walked again in the older generations, and each
    full collection walked the whole workload built before the run: 6-7% of a 5,000-query
    replay's CPU on 1,024 instances (1.6% with this), more as the heap grows. A threshold of
    ``GC_YOUNG_THRESHOLD`` lets most of them die by reference count first, and the objects
    alive at the start (the workload, the cluster, the coordinator) are frozen out of the
    collector's walks (``gc.freeze``) unless something else froze objects already (then
    that is left as it is). Reference counting still frees everything acyclic at once; the
    previous thresholds come back afterwards. Results cannot change: nothing the
    simulation computes depends on when the collector runs (no finalisers, no weak
    references on its path)."""
    global _gc_depth, _gc_restore
    with _GC_LOCK:  # drains overlapping in threads: the first in sets, the last out restores
        if _gc_depth == 0:
            old = gc.get_threshold()
            freeze = gc.get_freeze_count() == 0
            if freeze:
                gc.freeze()
            gc.set_threshold(max(old[0], GC_YOUNG_THRESHOLD), *old[1:])
            _gc_restore = (old, freeze)
        _gc_depth += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_depth -= 1
            if _gc_depth == 0 and _gc_restore is not None:
                found, unfreeze = _gc_restore
                _gc_restore = None
                gc.set_threshold(*found)
                if unfreeze:
                    gc.unfreeze()


async def _replayed(ctx):  # pragma: no cover - simulated stages are never executed
    raise RuntimeError("a simulated stage has no code to run")


@dataclass
class QueryRecord:
    id: str
    arrival: float
    slo_s: float | None  # the deadline the scheduler was given, seconds after arrival
    idle_latency_s: float
    status: str = "pending"  # done | rejected | failed
    finish: float | None = None
    reason: str | None = None
    calls: int = 0
    tenant: str | None = None  # who sent it (shared-cluster runs), None otherwise
    slo_class: str | None = None  # its SLO class as admitted (admission may move it)
    preemptions: int | None = None  # its calls stopped for a better class (None: off)

    @property
    def latency_s(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival


@dataclass(frozen=True)
class StageTiming:
    """One finished stage of a simulated query, for ``Simulation(on_stage=...)``.

    Times are virtual seconds since the run began. For an LLM stage ``run_s`` is the time its
    call ran on ``instance`` (from the engine's first iteration to its last) and ``queue_s``
    the rest of the stage: waiting in the coordinator's queue and in the engine's, plus any
    attempt lost to a failed instance. A tool step runs as soon as it is ready.
    """

    query_id: str
    node_id: str
    stage: str
    kind: str  # llm | tool
    parents: tuple[str, ...]
    start: float
    end: float
    queue_s: float
    run_s: float
    instance: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0


@dataclass
class SimResult:
    policy: str
    records: list[QueryRecord]
    alpha_history: list[tuple[float, float]] = field(default_factory=list)
    events: int = 0

    def summary(self, scales: Iterable[float] = SLO_SCALES) -> dict[str, Any]:
        from agentflow.sim.summary import summarize

        return summarize(self, scales)


class Simulation:
    def __init__(self, cluster: SimClusterConfig, policy: str, *, alpha: float | None = None,
                 embedder: str = "hashing", max_waiting_calls: int | None = None,
                 max_active_queries: int | None = None,
                 admit_by_backlog: bool = False, max_backlog_s: float | None = None,
                 alpha_tuner: Any = None, cached_prefix: float | str = 0.0,
                 faults: Sequence[Fault] = (),
                 on_stage: Callable[[StageTiming], None] | None = None,
                 slo_classes: Mapping[str, SloClass] | None = None,
                 deadline_admission: str | None = None, preemption: str | None = "auto",
                 fast_lane: int | None = FAST_LANE_CALLS, coordinators: int | None = None,
                 shard_route: str = "p2c", shard_summary_s: float = 0.5):
        """``on_stage`` is called with each stage's ``StageTiming`` as the stage finishes.

        ``cached_prefix``: a fixed fraction of every prompt served from a prefix cache (0:
        cold prompts, physical prefill; the vLLM latency measurements correspond to fully
        cached prompts), or ``"auto"``: each engine models vLLM's automatic prefix caching
        over the prompts' text (``SimInstance``), for the calls whose trace recorded their
        prompt (agentflow traces); calls without text (HexGen-Flow traces) run cold.

        ``slo_classes`` (None: the defaults) and ``deadline_admission`` (None: off;
        ``reject`` or ``batch``, ``agentflow.scheduler.backlog``) as serving's scheduler
        settings; ``preemption`` (``auto``, serving's default: ``fair`` under the flowsage
        queue, else off; None or ``off``; ``class``, ``fair``) too: a stopped call
        is aborted on its engine (KV freed, its prompt's prefix blocks left in the cache) and
        runs again from its prompt when the scheduler admits it again — its generated tokens
        are lost (recompute), as in vLLM's preemption. ``fast_lane``: serving's
        ``scheduler.fast_lane`` (None: off). ``coordinators``: K sharded coordinators
        (``agentflow.scheduler.shards``: a stratified split of the instances, each query
        routed at arrival by ``shard_route`` over load summaries at most
        ``shard_summary_s`` old); None: the one coordinator."""
        self.prefix_cache = cached_prefix == "auto"
        if self.prefix_cache:
            cached_prefix = 0.0
        elif isinstance(cached_prefix, str) or not 0.0 <= cached_prefix < 1.0:
            raise ValueError("cached_prefix must be in [0, 1) or 'auto'")
        self.cached_prefix = cached_prefix
        self.cluster = cluster
        self.policy = policy
        self.clock = ManualClock(0.0)
        self.instances: dict[str, SimInstance] = {}
        instances = []
        for name, cfg in cluster.expanded():
            self.instances[name] = engine_for(name, cfg)
            instances.append(cfg)
        # The coordinator serving builds from the same description (build_coordinator): it
        # admits no more than each engine's KV cache holds, so calls wait in its queues —
        # ordered by the queue policy — rather than inside the engines.
        settings: dict[str, Any] = dict(
            alpha=alpha, max_waiting_calls=max_waiting_calls,
            max_active_queries=max_active_queries, admit_by_backlog=admit_by_backlog,
            max_backlog_s=max_backlog_s, preemption=preemption, fast_lane=fast_lane)
        self.coordinator: Any
        self.length_model: Any  # one model, or every shard's (``ShardLengths``)
        if coordinators is not None:  # K shards, each with its own length model
            if alpha_tuner is not None:
                raise ValueError("the online alpha tuner forks one coordinator; it does not "
                                 "run with sharded coordinators")
            from agentflow.scheduler.shards import build_sharded

            self.coordinator, self.length_model = build_sharded(
                instances, coordinators, clock=self.clock, policy=policy, embedder=embedder,
                rule=shard_route, summary_s=shard_summary_s, **settings)
        else:
            model = make_length_model(parse_policy(policy).length_model, embedder=embedder)
            self.length_model = model
            self.coordinator = build_coordinator(
                instances, clock=self.clock, policy=policy, length_model=model, **settings)
        if slo_classes is not None:
            self.coordinator.slo_classes = slo_classes
        if deadline_admission is not None:
            self.coordinator.deadline_admission = deadline_admission
        self.alpha_tuner = alpha_tuner
        for fault in faults:
            if fault.instance not in self.instances:
                raise ValueError(f"fault on unknown instance {fault.instance!r}; this cluster "
                                 f"has {', '.join(self.instances)}")
        self.faults = list(faults)
        self.on_stage = on_stage
        self._heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        # ``run``'s arrivals not yet in the heap, latest first (``_ARRIVALS_IN_HEAP``)
        self._arrivals: list[tuple[float, int, str, Any]] = []
        self._versions: dict[str, int] = {name: 0 for name in self.instances}
        self._runs: dict[str, tuple[WorkflowRun, TraceQuery, QueryRecord]] = {}
        self._calls: dict[str, Any] = {}  # call id -> ScheduledCall
        self._trace_nodes: dict[str, dict[str, TraceNode]] = {}  # query id -> node id -> node
        self._dags: dict[str, GrowingDag] = {}  # query id -> what its pipeline has shown
        self._tool_s: dict[str, tuple[float, int]] = {}  # stage -> (mean duration, count)
        self.events = 0
        self._progress_at: float | None = None  # when running calls' tokens were last read

    # ------------------------------------------------------------------------------ public
    def run(self, queries: list[TraceQuery], arrivals: list[float],
            slo_s: Sequence[float | None], idle_latency_s: list[float], *,
            tenants: Sequence[str | None] | None = None,
            classes: Sequence[str | None] | None = None) -> SimResult:
        """``slo_s``: each query's deadline after arrival (None: its class's default);
        ``tenants`` and ``classes``: who sent each query and its SLO class (shared-cluster
        runs; None: every query anonymous and of the default class)."""
        records = []
        for i, (q, t, slo, idle) in enumerate(zip(queries, arrivals, slo_s, idle_latency_s)):
            record = QueryRecord(id=f"{i}:{q.id}", arrival=float(t), slo_s=slo,
                                 idle_latency_s=idle,
                                 tenant=tenants[i] if tenants is not None else None,
                                 slo_class=classes[i] if classes is not None else None)
            if self.coordinator.preemption is not None and (tenants is not None
                                                            or classes is not None):
                record.preemptions = 0  # counted where it can act: one pair stops nothing
            records.append(record)
            entry = (float(t), next(self._seq), "arrival", (q, record))
            if _ARRIVALS_IN_HEAP:
                heapq.heappush(self._heap, entry)
            else:
                self._arrivals.append(entry)
        self._feed_arrivals()
        for fault in self.faults:
            self._push(fault.at_s, "fault", fault)
        if self.alpha_tuner is not None:
            self.alpha_tuner.attach(self, queries, arrivals, slo_s, idle_latency_s)
        self.drain()
        history = self.alpha_tuner.history if self.alpha_tuner is not None else []
        return SimResult(policy=self.policy, records=records, alpha_history=history,
                         events=self.events)

    def drain(self) -> None:
        """Process events until none is left (``run`` does this; a forked simulation that was
        given more arrivals with ``add_arrival`` does it too)."""
        with _fewer_collections():
            self._drain()

    def _feed_arrivals(self) -> None:
        """Put the earliest of ``run``'s arrivals not yet in the heap into it.

        Why: pushing every arrival at the start made the heap as large as the run (5,000
        entries at 5,000 queries, 50,000 at 50,000, against ~1,000-4,000 engine events in
        flight), so every event's pop and push walked a deeper heap as runs grew. Kept
        aside, sorted by (time, sequence number), with the sequence numbers they were given
        in ``run``, and fed one at a time (the next goes in when one is popped), the heap's
        least entry is always the one it would have been with all of them in: the same
        events in the same order. ``_ARRIVALS_IN_HEAP = True`` pushes them all (the tests
        compare)."""
        arrivals = self._arrivals
        if arrivals:
            arrivals.sort(reverse=True)  # (time, seq) are unique: a total order
            heapq.heappush(self._heap, arrivals.pop())

    def _drain(self) -> None:
        clock = self.clock
        manual = type(clock) is ManualClock
        heap, pop, versions = self._heap, heapq.heappop, self._versions
        on_instance = self._on_instance
        arrivals = self._arrivals
        while heap:
            t, _, kind, payload = pop(heap)
            if manual:  # advance_to(max(t, now)) without two calls per event
                if t > clock._t:
                    clock._t = t
            else:
                clock.advance_to(max(t, clock.now()))
            self.events += 1
            if kind == "instance":  # most events: an engine's next iteration end
                name, version = payload
                if version == versions[name]:
                    on_instance(name)
            elif kind == "arrival":
                if arrivals:  # the next of run's (one more in the heap is harmless)
                    heapq.heappush(heap, arrivals.pop())
                self._on_arrival(*payload)
            elif kind == "tool_done":
                self._on_node_done(*payload)
            elif kind == "fault":
                self._on_fault(payload)
            elif kind == "hook":
                payload(self)

    def add_arrival(self, query: TraceQuery, record: QueryRecord) -> None:
        """One more query arriving at ``record.arrival`` (forecasts in forked simulations)."""
        self._push(record.arrival, "arrival", (query, record))

    def fork(self) -> Simulation:
        """A copy of the live state — engines, queues, running and waiting calls, workflows in
        flight — without the future: no pending arrivals, no faults still to come, no hooks,
        no alpha tuner. What a tuner replays its forecasts on, so the backlog counts."""
        heap, tuner, arrivals = self._heap, self.alpha_tuner, self._arrivals
        self._heap = [e for e in heap if e[2] not in ("arrival", "fault", "hook")]
        self.alpha_tuner, self._arrivals = None, []
        # Locks (the length model's, for serving threads) cannot be copied: a fork,
        # single-threaded, gets fresh ones.
        memo: dict[int, Any] = {}
        stack, seen = [self.length_model], set()
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
            self._heap, self.alpha_tuner, self._arrivals = heap, tuner, arrivals
        heapq.heapify(clone._heap)
        return clone

    @property
    def in_flight(self) -> list[QueryRecord]:
        """Records of the queries that arrived and have not finished."""
        return [record for _, _, record in self._runs.values()]

    def schedule_hook(self, t: float, fn: Callable[[Simulation], None]) -> None:
        self._push(t, "hook", fn)

    @property
    def pending_queries(self) -> int:
        return len(self._runs)

    # ------------------------------------------------------------------------------ events
    def _on_arrival(self, trace: TraceQuery, record: QueryRecord) -> None:
        now = self.clock.now()
        dag = GrowingDag(trace, self._node)
        query = Query(question=trace.question, db_id="", arrival=now, slo_s=record.slo_s,
                      id=record.id)
        run = WorkflowRun(query, dag.initial_graph())
        self.length_model.reveal(record.id, {
            n.id: TrueLengths(n.prompt_tokens, n.output_tokens,
                              n.duration_s if n.kind == "tool" else None)
            for n in trace.nodes})
        try:
            state = self.coordinator.on_query_arrival(
                record.id, arrival=now,
                deadline=None if record.slo_s is None else now + record.slo_s,
                key_text=trace.question, run=run, slo_class=record.slo_class,
                tenant=record.tenant)
        except QueryRejected as err:
            record.status, record.reason = "rejected", err.reason
            self.length_model.forget(record.id)
            return
        if record.slo_s is None and state.deadline is not None:
            record.slo_s = state.deadline - now  # its class's default deadline
        # admission may have moved it to another class (batch); it is still judged by the
        # deadline it was sent with
        record.slo_class = state.slo_class
        self._runs[record.id] = (run, trace, record)
        self._trace_nodes[record.id] = {n.id: n for n in trace.nodes}
        self._dags[record.id] = dag
        self._start_ready(record.id)

    def _node(self, n: TraceNode) -> Node:
        """The runtime node of a recorded stage as it appears: what the pipeline knows of it."""
        if n.kind == "llm":  # no sizes: the stage's prompt is known once it is ready
            hints = {} if n.max_tokens is None else {"max_tokens": n.max_tokens}
            return Node(n.id, n.stage, NodeKind.LLM, _replayed, hints=hints)
        # a tool step is expected to take what its stage has taken so far
        return Node(n.id, n.stage, NodeKind.TOOL, _replayed,
                    expected_s=self._tool_s.get(n.stage, (TOOL_PRIOR_S, 0))[0])

    def _start_ready(self, query_id: str) -> None:
        run, trace, record = self._runs[query_id]
        recorded = self._trace_nodes[query_id]
        now = self.clock.now()
        for node in run.ready():
            if node.kind == NodeKind.TOOL:  # no event: a pass put off must see the run first
                self.coordinator.settle_paths(query_id)
            run.mark_started(node.id, now)
            if node.kind == NodeKind.TOOL:
                self._push(now + recorded[node.id].duration_s, "tool_done", (query_id, node.id))
                continue
            record.calls += 1
            self._report_progress()
            call, decisions = self.coordinator.on_call_ready(
                query_id, stage=node.stage, node_id=node.id,
                prompt_tokens=recorded[node.id].prompt_tokens, payload=(query_id, node.id),
                max_tokens=recorded[node.id].max_tokens,
                prompt_text=recorded[node.id].prompt_text if self.prefix_cache else None)
            self._calls[call.id] = call
            self._apply(decisions)
            if query_id not in self._runs:
                return  # the call failed the query: its other ready stages never start

    def _on_node_done(self, query_id: str, node_id: str, *, run_s: float | None = None,
                      instance: str | None = None) -> None:
        entry = self._runs.get(query_id)
        if entry is None:
            return
        run, trace, record = entry
        done = self._trace_nodes[query_id][node_id]
        now = self.clock.now()
        if done.kind == "tool":
            mean, n = self._tool_s.get(done.stage, (0.0, 0))
            self._tool_s[done.stage] = (mean + (done.duration_s - mean) / (n + 1), n + 1)
        if self.on_stage is not None:
            start = run.query.stage(node_id).start
            assert start is not None  # the stage finishing now has started
            ran = now - start if run_s is None else min(run_s, now - start)
            self.on_stage(StageTiming(
                query_id, node_id, done.stage, done.kind, done.parents, start, now,
                queue_s=max(0.0, now - start - ran), run_s=ran, instance=instance,
                prompt_tokens=done.prompt_tokens, output_tokens=done.output_tokens))
        dag = self._dags[query_id]
        if done.kind == "tool":  # no event: a pass put off must see the run first
            self.coordinator.settle_paths(query_id)
        run.mark_done(node_id, now, expansion=dag.expansion_after(node_id))
        if run.finished:
            if dag.hidden:  # every recorded stage must have appeared before the query ends
                raise RuntimeError(f"query {query_id} finished with recorded stages never "
                                   f"shown: {dag.hidden}")
            record.finish = self.clock.now()
            if trace.meta.get("status") == "failed":  # back on time, with no answer
                record.status, record.reason = "failed", "the recorded run failed"
            else:
                record.status = "done"
            self.coordinator.on_query_done(query_id)
            self._forget(query_id)
        else:
            self._start_ready(query_id)

    def _on_instance(self, name: str) -> None:
        engine = self.instances[name]
        calls, running, clock = self._calls, CallState.RUNNING, self.clock
        for ev in engine.step_until(clock.now()):
            seq_id = ev.seq_id
            call = calls.get(seq_id)  # a first attempt: the engine's id is the call's
            if call is None:
                call = calls.get(seq_id.partition(_ATTEMPT)[0])
            if call is None or call.instance != name or call.state != running \
                    or seq_id != (call.id if call.preemptions == 0 else _engine_id(call)):
                continue  # an aborted call or attempt, or one that moved to another instance
            kind = ev.kind
            if kind == "progress":  # the most common event: most make no decision
                decisions = self.coordinator.on_call_progress(call, ev.output_tokens_so_far)
                if decisions:
                    self._apply(decisions)
                continue
            self._report_progress()  # a finish or first token may admit, so stop calls
            if kind == "finished":
                del calls[call.id]
                self._apply(self.coordinator.on_call_done(
                    call, output_tokens=ev.output_tokens_so_far, ttft_s=ev.ttft_s or 0.0,
                    total_s=ev.total_s or 0.0))
                self._on_node_done(*call.payload, run_s=ev.total_s, instance=name)
            else:
                decisions = self.coordinator.on_call_progress(call, ev.output_tokens_so_far)
                if decisions:
                    self._apply(decisions)
        # ``_reschedule(name)`` inline (once per wake, the most common push)
        versions = self._versions
        version = versions[name] = versions[name] + 1
        t = engine.next_event_time()
        if t is not None:
            now = clock.now()
            heapq.heappush(self._heap, (t if t > now else now, next(self._seq), "instance",
                                        (name, version)))

    # ------------------------------------------------------------------------------ helpers
    def _report_progress(self) -> None:
        """Before a decision that may stop running calls (``scheduler.preemption``), tell the
        coordinator how many tokens each has written by now, as serving's stream does
        token by token. The engines' events say so only at 1, 2, 4, 8..., so preemption
        would price a call 1000 tokens in as 512 in: less to redo, more left, a victim too
        early. Read from the engines once per instant (nothing is written between two
        decisions at one time), only while a preemption can happen: with it off, or one
        class in flight (under ``fair``: one class-and-tenant pair), runs are unchanged to
        the digit. First tokens stay the engines' events (they free a prefill slot, a
        decision of its own)."""
        coordinator = self.coordinator
        now = self.clock.now()
        if self._progress_at == now or not coordinator.can_preempt():
            return
        self._progress_at = now
        behind = []
        for name, queue in coordinator.queues.items():
            if not queue.running:
                continue
            written = self.instances[name].tokens_written(now)
            for call in queue.running:
                n = written.get(_engine_id(call))
                if n is not None and 0 < call.attained_tokens < n:
                    behind.append((call.seq, call, n))
        behind.sort(key=lambda e: e[0])  # a set's order is no order: reports in call order
        for _, call, n in behind:
            self._apply(coordinator.on_call_progress(call, n))

    def _apply(self, decisions) -> None:
        now = self.clock.now()
        touched = set()
        for d in decisions:
            if isinstance(d, StartCall):
                call = d.call
                if d.attempt != call.preemptions:
                    continue  # a start for a run that was stopped since: stale
                query_id, node_id = call.payload
                hashes, per_block = call.prefix_hashes, 0.0
                if hashes:  # trace tokens per hashed block of pseudo-tokens
                    per_block = call.prompt_tokens * BLOCK_TOKENS / call.prefix_pseudo_tokens
                try:
                    self.instances[d.instance].add(
                        _engine_id(call, d.attempt), call.prompt_tokens,
                        max(1, self._trace_nodes[query_id][node_id].output_tokens),
                        d.priority, now, cached_tokens=int(self.cached_prefix *
                                                           call.prompt_tokens),
                        prefix_hashes=hashes, tokens_per_block=per_block)
                except ValueError as err:  # can never fit this instance's KV cache
                    self._apply(self.coordinator.on_call_failed(call, str(err),
                                                                retryable=True))
                    continue
                touched.add(d.instance)
            elif isinstance(d, PreemptCall):  # already back in a queue: abort this attempt
                self.instances[d.instance].abort(_engine_id(d.call, d.attempt), now)
                touched.add(d.instance)
                entry = self._runs.get(d.call.payload[0])
                if entry is not None and entry[2].preemptions is not None:
                    entry[2].preemptions += 1
            elif isinstance(d, FailCall):
                query_id = d.call.payload[0]
                entry = self._runs.get(query_id)
                if entry is not None:
                    run, _, record = entry
                    self._forget(query_id)
                    record.status, record.reason = "failed", d.reason
                    run.cancel_pending(now)
                    running, more = self.coordinator.cancel_query(query_id)
                    for call in running:  # siblings still running: the engines drop them
                        assert call.instance is not None  # running calls were dispatched
                        if self.instances[call.instance].abort(_engine_id(call), now):
                            touched.add(call.instance)
                    for call_id in [i for i, c in self._calls.items()
                                    if c.payload[0] == query_id]:
                        del self._calls[call_id]
                    self._apply(more)
        for name in sorted(touched):
            self._reschedule(name)

    def _on_fault(self, fault: Fault) -> None:
        now = self.clock.now()
        self._report_progress()
        name, engine = fault.instance, self.instances[fault.instance]
        if fault.kind == "slow":
            engine.set_slowdown(fault.factor, now)
        elif fault.kind == "up":
            self._apply(self.coordinator.on_instance_up(name))
        elif self.coordinator.queues[name].up:  # down (twice down is once down)
            victims = sorted((c for c in self._calls.values()
                              if c.instance == name and c.state == CallState.RUNNING),
                             key=lambda c: c.seq)
            for call in victims:
                engine.abort(_engine_id(call), now)
            self._apply(self.coordinator.on_instance_down(name))
            for call in victims:  # as serving does: each comes back as a retryable failure
                self._apply(self.coordinator.on_call_failed(
                    call, f"instance {name} went down", retryable=True))
        self._reschedule(name)

    @property
    def down_instances(self) -> list[str]:
        return [n for n, q in self.coordinator.queues.items() if not q.up]

    def _forget(self, query_id: str) -> None:
        del self._runs[query_id]
        self._trace_nodes.pop(query_id, None)
        self._dags.pop(query_id, None)
        self.length_model.forget(query_id)

    def _reschedule(self, name: str) -> None:
        version = self._versions[name] = self._versions[name] + 1
        t = self.instances[name].next_event_time()
        if t is not None:
            now = self.clock.now()
            heapq.heappush(self._heap, (t if t > now else now, next(self._seq), "instance",
                                        (name, version)))

    def _push(self, t: float, kind: str, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))


# True: ``run`` pushes every arrival into the event heap at once, as before
# ``Simulation._feed_arrivals`` (the same events in the same order either way; the tests
# compare).
_ARRIVALS_IN_HEAP = False

_ATTEMPT = "~"  # engine sequence ids: the call's id, then ~n for its n-th run after a preemption


def _engine_id(call: Any, preemptions: int | None = None) -> str:
    """The engine's id for the call's current attempt (``preemptions``: another attempt), so
    an event the engine still reports for an aborted attempt is told apart from the redo."""
    n = call.preemptions if preemptions is None else preemptions
    return call.id if n == 0 else f"{call.id}{_ATTEMPT}{n}"
