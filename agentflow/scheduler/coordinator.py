"""The coordinator: every LLM call of every query passes through here.

Event-driven and clock-injected: the runtime (asyncio serving, or the simulator's virtual
time) reports events — a query arrived, a call became ready, made progress, finished or
failed, an instance went down — and gets back decisions: which calls to start where, with
which backend priority, and which to fail. The coordinator never sleeps and never reads wall
time, so the same object runs real serving and simulation.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agentflow.scheduler.call import CallState, QueryState, ScheduledCall
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.distribution import Distribution, cost_distribution
from agentflow.scheduler.instance import InstanceQueue, LoadBook
from agentflow.scheduler.lengths import LengthModel, make_length_model
from agentflow.scheduler.policies import parse_policy, resolve
from agentflow.scheduler.prefix_index import BLOCK_TOKENS, PrefixIndex, block_hashes, pseudo_tokens
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.slo_classes import DEFAULT_SLO_CLASSES, SloClass
from agentflow.workflow.clock import Clock
from agentflow.workflow.graph import Node, NodeKind


@dataclass(frozen=True)
class StartCall:
    call: ScheduledCall
    instance: str
    priority: int


@dataclass(frozen=True)
class FailCall:
    call: ScheduledCall
    reason: str


Decision = StartCall | FailCall


@dataclass(frozen=True)
class BatchView:
    """What dispatch to a continuous-batching engine needs to know, one entry per candidate
    instance (``Coordinator.batch_view``): seconds of calls waiting in its queue (``queued_s``),
    of prompt prefill admitted there but not yet done (``prefilling_s``) and left on the calls
    it runs (``running_s``), in single-request time; how many it runs
    (``n_running``) of at most ``slots``; whether it has a slot and KV room for the call now
    (``room``); the call's expected time there (``time_s``) and the part of it that is prompt
    prefill (``prefill_s``); the decode seconds the call gains, and inflicts, per call running
    beside it (``co_runner_decode_s``, learned) and the co-runners ``time_s`` already assumes
    (``co_runners_seen``); and the rank of the instance's name (ties)."""

    queued_s: np.ndarray
    prefilling_s: np.ndarray
    running_s: np.ndarray
    n_running: np.ndarray
    room: np.ndarray
    slots: np.ndarray
    time_s: np.ndarray
    prefill_s: np.ndarray
    co_runner_decode_s: np.ndarray
    co_runners_seen: np.ndarray
    name_rank: np.ndarray


class QueryRejected(RuntimeError):
    """Admission refused (overload); ``retry_after_s`` estimates when to try again."""

    def __init__(self, reason: str, retry_after_s: float = 1.0):
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


# Prompt tokens assumed for a future stage when neither its pipeline hints nor any earlier
# call of its stage says more.
DEFAULT_PROMPT_TOKENS = 500


class CoordinatorObserver(Protocol):
    """Watches the coordinator's events (e.g. the server times each decision): told when an
    event method starts and when it returns, with the decisions it made (empty when it made
    none or raised). Events may nest (``cancel_query`` ends with ``on_query_done``)."""

    def event_started(self, event: str) -> None: ...

    def event_finished(self, event: str, decisions: list[Decision]) -> None: ...


class Coordinator:
    # The event methods observers see (see ``add_observer``).
    EVENTS = ("on_query_arrival", "on_call_ready", "on_call_progress", "on_call_done",
              "on_call_failed", "on_call_cancelled", "on_instance_down", "on_instance_up",
              "on_query_done", "cancel_query")

    def __init__(self, instances: list[InstanceSpec], *, clock: Clock, policy: str = "flowsage",
                 alpha: float | None = None, length_model: LengthModel | None = None,
                 max_waiting_calls: int | None = None, max_active_queries: int | None = None,
                 max_attempts: int = 3, admit_by_backlog: bool = False,
                 max_backlog_s: float | None = None,
                 slo_classes: Mapping[str, SloClass] | None = None, **queue_kwargs: Any):
        """``length_model``: the length model; None builds the one the policy name picks
        (``flowsage@oracle``; the learned length model by default)."""
        if not instances:
            raise ValueError("a cluster needs at least one instance")
        names = [s.name for s in instances]
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be unique: {names}")
        self.clock = clock
        self.policy_name = policy
        self.dispatch, queue_policy = resolve(policy, alpha=alpha, **queue_kwargs)
        self._queue_policy = queue_policy
        self.loads = LoadBook(len(instances))
        self.queues = {s.name: InstanceQueue(s, queue_policy, self.loads, i)
                       for i, s in enumerate(instances)}
        self._index = {s.name: i for i, s in enumerate(instances)}
        self._name_rank = np.argsort(np.argsort(np.array(names, dtype=object)))
        # What a batching engine can hold at once (``batch_view``): call slots and KV tokens.
        self._max_inflight = np.array([s.max_inflight for s in instances], dtype=float)
        self._kv_budget = np.array([s.kv_token_budget if s.kv_token_budget is not None
                                    else np.inf for s in instances], dtype=float)
        self.time_models = _TimeModels(self, {s.name: InstanceTimeModel.for_spec(s)
                                              for s in instances})
        self.length_model: LengthModel = length_model if length_model is not None \
            else make_length_model(parse_policy(policy).length_model)
        self.max_waiting_calls = max_waiting_calls
        self.max_active_queries = max_active_queries
        self.max_attempts = max_attempts
        # refuse a query the committed backlog would keep past its SLO (scheduler.backlog)
        self.admit_by_backlog = admit_by_backlog
        self.max_backlog_s = max_backlog_s
        # the SLO classes queries name (agentflow.slo_classes); a query naming none is standard
        self.slo_classes: Mapping[str, SloClass] = (DEFAULT_SLO_CLASSES if slo_classes is None
                                                    else slo_classes)
        self.queries: dict[str, QueryState] = {}
        self._observers: list[CoordinatorObserver] = []
        self._ids = itertools.count()
        # per query: stage -> predicted length (future stages), and its (mean, P10, P90)
        self._stage_prediction: dict[str, dict[str, Distribution]] = {}
        self._stage_summary: dict[str, dict[str, tuple[Distribution, tuple[Any, ...]]]] = {}
        # Mean prompt tokens of each stage's calls so far: the estimate for future calls of
        # the stage when the pipeline gives no hint (what serving knows before a prompt exists).
        self._stage_prompts: dict[str, tuple[float, int]] = {}
        # Bumped whenever a time model learns or an instance goes up/down: the cluster-mean
        # stage-time coefficients are recomputed only then.
        self._models_epoch = 0
        self._mean_coef: tuple[int, float, float, float] | None = None
        self._coef_cache: tuple[Any, ...] | None = None
        self._batch_cache: tuple[Any, ...] | None = None
        # Router-side approximate prefix index, kept only for dispatch policies that read it
        # (``prefix_aware``): fed with the prompt text of dispatched calls.
        self.prefix_index = None
        if getattr(self.dispatch, "prefix_aware", False):
            self.prefix_index = PrefixIndex({
                s.name: (s.kv_token_budget or 2 ** 40) // BLOCK_TOKENS for s in instances})

    # ============================================================================ events
    def on_query_arrival(self, query_id: str, *, arrival: float | None = None,
                         deadline: float | None = None, key_text: str = "",
                         run: Any = None, slo_class: str | None = None,
                         tenant: str | None = None) -> QueryState:
        """Admit a query or raise ``QueryRejected`` (bounded queues, never unbounded growth)."""
        now = self.clock.now()
        if self.max_active_queries is not None and len(self.queries) >= self.max_active_queries:
            raise QueryRejected(
                f"overloaded: {len(self.queries)} queries in progress (limit "
                f"{self.max_active_queries})", retry_after_s=self._retry_after(now))
        waiting = self.waiting_calls
        if self.max_waiting_calls is not None and waiting >= self.max_waiting_calls:
            raise QueryRejected(f"overloaded: {waiting} LLM calls waiting (limit "
                                f"{self.max_waiting_calls})", retry_after_s=self._retry_after(now))
        if not self.up_instances:
            raise QueryRejected("no model instance is up", retry_after_s=5.0)
        if self.admit_by_backlog:
            from agentflow.scheduler.backlog import backlog_rejection

            refused = backlog_rejection(self, now, deadline, self.max_backlog_s)
            if refused is not None:
                raise QueryRejected(refused[0], retry_after_s=refused[1])
        query = QueryState(id=query_id, arrival=now if arrival is None else arrival,
                           deadline=deadline, key_text=key_text, run=run,
                           slo_class=slo_class, tenant=tenant)
        self.queries[query_id] = query
        self._refresh(query, now)
        return query

    def on_call_ready(self, query_id: str, *, stage: str, node_id: str, prompt_tokens: int,
                      payload: Any = None, max_tokens: int | None = None,
                      prompt_tokens_by_instance: dict[str, int] | None = None,
                      prompt_text: str | None = None
                      ) -> tuple[ScheduledCall, list[Decision]]:
        """A call is ready. ``max_tokens`` is its output cap: the prediction is clipped to
        it (a call cannot write more), which bounds ranking, outstanding work and KV use.
        ``prompt_tokens_by_instance``: the prompt's length on each instance when their
        tokenizers disagree (different models); run times and KV use are priced with it.
        ``prompt_text``: the prompt itself, where the runtime has it: its prefix blocks are
        hashed (``call.prefix_hashes``) for prefix-aware dispatch and engines that cache."""
        now = self.clock.now()
        query = self.queries[query_id]
        truth = self.length_model.true_lengths(query_id, node_id)
        if truth is not None:
            output = Distribution.point(truth.output_tokens)
        else:
            output = self.length_model.predict(stage, query.key_text, prompt_tokens,
                                            max_tokens=max_tokens)
        mean, n = self._stage_prompts.get(stage, (0.0, 0))
        self._stage_prompts[stage] = (mean + (prompt_tokens - mean) / (n + 1), n + 1)
        call = ScheduledCall(id=f"c{next(self._ids)}", query=query, stage=stage,
                             node_id=node_id, prompt_tokens=prompt_tokens, output=output,
                             ready_at=now, payload=payload,
                             prompt_tokens_on=prompt_tokens_by_instance)
        if prompt_text:
            call.prefix_hashes = block_hashes(prompt_text)
            call.prefix_pseudo_tokens = pseudo_tokens(prompt_text)
        query.calls.add(call)
        query.calls_version += 1
        self._refresh(query, now)
        return call, self._dispatch(call, now)

    def on_call_progress(self, call: ScheduledCall, output_tokens: int) -> list[Decision]:
        """Streaming progress: attained service feeds Gittins ranks and outstanding work; a
        first token frees a pending-prefill slot, so more calls may be admitted."""
        if not self._live(call):
            return []
        first = call.attained_tokens == 0 and output_tokens > 0
        crossed = self._bucket(call.attained_tokens) != self._bucket(output_tokens)
        call.attained_tokens = max(call.attained_tokens, output_tokens)
        if crossed and call.query.id in self.queries:
            call.query.calls_version += 1  # re-rank at bucket boundaries, not every token
            self._refresh(call.query, self.clock.now())
        if crossed and call.instance is not None and call.state == CallState.RUNNING:
            self.queues[call.instance].reserve(call, self._kv_tokens(call))
        if first and call.instance is not None and call.state == CallState.RUNNING:
            queue = self.queues[call.instance]
            queue.first_token(call)
            if queue.spec.max_pending_prefill is not None:
                return self._admit(queue, self.clock.now())
        return []

    def on_call_done(self, call: ScheduledCall, *, output_tokens: int, ttft_s: float = 0.0,
                     total_s: float = 0.0, cached_tokens: int = 0) -> list[Decision]:
        if not self._live(call):
            return []  # its query was cancelled or failed: nothing to free, nothing to learn
        now = self.clock.now()
        call.state, call.finished_at = CallState.DONE, now
        call.attained_tokens = output_tokens
        assert call.instance is not None  # a live call that finished was dispatched
        queue = self.queues[call.instance]
        # calls beside it: the mean of what it found on admission and leaves behind
        co_runners = (call.co_runners_at_start + len(queue.running) - 1) / 2
        queue.finish(call)
        call.query.calls.discard(call)
        call.query.calls_version += 1
        call.query.done_nodes.add(call.node_id)
        self.length_model.observe(call.stage, call.query.key_text, output_tokens,
                               call.prompt_tokens)
        self._stage_prediction.get(call.query.id, {}).pop(call.stage, None)
        if total_s > 0:
            self.time_models[call.instance].observe(call.tokens_on(call.instance),
                                                    output_tokens, ttft_s, total_s,
                                                    cached_tokens, co_runners=co_runners)
            self._models_epoch += 1
        if call.query.id in self.queries:
            self._refresh(call.query, now)
        return self._admit(queue, now)

    def on_call_failed(self, call: ScheduledCall, reason: str, *,
                       retryable: bool = True) -> list[Decision]:
        """A call failed on its instance: try another instance if sensible, else fail it."""
        if not self._live(call):
            return []
        now = self.clock.now()
        assert call.instance is not None  # a live call that failed was dispatched
        queue = self.queues[call.instance]
        queue.finish(call)
        decisions = self._admit(queue, now)
        call.excluded.add(queue.name)
        call.attempts += 1
        # A non-retryable error may still be the instance's fault (a broken server): try
        # an instance that has not failed this call, if one is up; a second instance
        # failing it too means the call itself is bad.
        untried = any(n not in call.excluded for n in self.up_instances)
        if (not retryable and not untried) or call.attempts >= self.max_attempts:
            call.state = CallState.FAILED
            call.query.calls.discard(call)
            return decisions + [FailCall(call, reason)]
        call.attained_tokens = 0
        return decisions + self._dispatch(call, now, reason_if_none=reason)

    def on_call_cancelled(self, call: ScheduledCall) -> list[Decision]:
        """The runtime gave up on a call (its query was cancelled): free its place."""
        now = self.clock.now()
        decisions: list[Decision] = []
        if call.instance is not None:
            queue = self.queues[call.instance]
            if call.state == CallState.WAITING:
                queue.remove(call)
            elif call.state == CallState.RUNNING:
                queue.finish(call)
                decisions = self._admit(queue, now)
        call.state = CallState.CANCELLED
        call.query.calls.discard(call)
        return decisions

    def on_instance_down(self, name: str) -> list[Decision]:
        """Mark an instance down and move its waiting calls elsewhere. Its running calls are
        the runtime's to cancel; each then comes back through ``on_call_failed``."""
        now = self.clock.now()
        queue = self.queues[name]
        queue.up = False
        self._models_epoch += 1
        if self.prefix_index is not None:  # its cache is lost with it
            self.prefix_index.forget_instance(name)
        decisions: list[Decision] = []
        for call in sorted(queue.waiting, key=lambda c: c.seq):
            queue.remove(call)
            decisions += self._dispatch(call, now, reason_if_none=f"instance {name} is down")
        return decisions

    def on_instance_up(self, name: str) -> list[Decision]:
        queue = self.queues[name]
        queue.up = True
        self._models_epoch += 1
        return self._admit(queue, self.clock.now())

    def on_query_done(self, query_id: str) -> None:
        self.queries.pop(query_id, None)
        self._stage_prediction.pop(query_id, None)
        self._stage_summary.pop(query_id, None)

    def cancel_query(self, query_id: str) -> tuple[list[ScheduledCall], list[Decision]]:
        """Remove the query's waiting calls everywhere. Returns its running calls (for the
        runtime to abort) and the admissions their freed capacity allows."""
        query = self.queries.get(query_id)
        if query is None:
            return [], []
        running, decisions = [], []
        now = self.clock.now()
        calls = sorted(query.calls, key=lambda c: c.seq)
        # Waiting calls go first, so freed capacity is never handed to this query's own calls.
        for call in calls:
            if call.state == CallState.WAITING and call.instance is not None:
                self.queues[call.instance].remove(call)
                call.state = CallState.CANCELLED
        for call in calls:
            if call.state == CallState.RUNNING and call.instance is not None:
                queue = self.queues[call.instance]
                queue.finish(call)
                call.state = CallState.CANCELLED
                running.append(call)
                decisions += self._admit(queue, now)
        query.calls.clear()
        self.on_query_done(query_id)
        return running, decisions

    def add_observer(self, observer: CoordinatorObserver) -> None:
        self._observers.append(observer)

    # ============================================================================ view
    @property
    def up_instances(self) -> list[str]:
        return [name for name, q in self.queues.items() if q.up]

    @property
    def waiting_calls(self) -> int:
        return sum(len(q.waiting) for q in self.queues.values())

    def expected_s(self, call: ScheduledCall, instance: str) -> float:
        model = self.time_models[instance]
        cached = call.time_cache.get(instance)
        if cached is None or cached[0] != model.observations:
            cached = (model.observations,
                      model.expected_s(call.tokens_on(instance), call.mean_output))
            call.time_cache[instance] = cached
        return cached[1]

    def outstanding_work(self, instance: str, now: float) -> float:
        return float(self.work_vector(now)[self._index[instance]])

    def work_vector(self, now: float) -> np.ndarray:
        """``W_i`` of every instance (construction order): the waiting calls' expected time
        from their token totals, plus what is left of the running calls."""
        oh, pf, df = self._coef_vectors()
        book = self.loads
        work: np.ndarray = (book.n_wait * oh + book.wait_prompt * pf + book.wait_output * df
                            + book.running(now))
        return work

    def time_vector(self, call: ScheduledCall) -> np.ndarray:
        """``t(call, i)`` on every instance (construction order)."""
        oh, pf, df = self._coef_vectors()
        prompt: float | np.ndarray = call.prompt_tokens
        if call.prompt_tokens_on:  # tokenizers disagree: each instance's own count
            prompt = np.array([call.tokens_on(n) for n in self.queues], dtype=float)
        return oh + prompt * pf + call.mean_output * df

    def dispatch_view(self, call: ScheduledCall, instances: list[str], now: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(W, t, name rank) for ``instances``, aligned with that list: what every dispatch
        policy reads, in a few vector operations whatever the cluster size."""
        idx = [self._index[n] for n in instances]
        return self.work_vector(now)[idx], self.time_vector(call)[idx], self._name_rank[idx]

    def batch_view(self, call: ScheduledCall, instances: list[str], now: float) -> BatchView:
        """How each of ``instances`` would take ``call`` now, as arrays aligned with the list:
        see ``BatchView``."""
        idx = [self._index[n] for n in instances]
        oh, pf, df = self._coef_vectors()
        book = self.loads
        queued = (book.n_wait * oh + book.wait_prompt * pf + book.wait_output * df)[idx]
        prompt: float | np.ndarray = call.prompt_tokens
        if call.prompt_tokens_on:
            prompt = np.array([call.tokens_on(n) for n in instances], dtype=float)
        n_run = book.n_run[idx]
        need = prompt + self._output_reserve(call)  # as ``_kv_tokens``, on each instance
        room = (n_run < self._max_inflight[idx]) & (
            (n_run == 0) | (book.kv_used[idx] + need <= self._kv_budget[idx]))
        slope, seen = self._batch_coefs()
        return BatchView(queued_s=queued, prefilling_s=book.prefill_prompt[idx] * pf[idx],
                         running_s=book.running(now)[idx], n_running=n_run,
                         room=room, slots=self._max_inflight[idx],
                         time_s=self.time_vector(call)[idx], prefill_s=prompt * pf[idx],
                         co_runner_decode_s=call.mean_output * slope[idx],
                         co_runners_seen=seen[idx], name_rank=self._name_rank[idx])

    def _batch_coefs(self) -> tuple[np.ndarray, np.ndarray]:
        """Per instance: decode seconds per output token that each co-runner adds (the
        learned ``InstanceTimeModel.co_runner_slope``, a decode ratio, times the model's base
        decode rate, which the ratio is relative to), and the mean co-runners the ratio was
        learned at; refreshed when a time model learns."""
        cached = self._batch_cache
        if cached is None or cached[0] != self._models_epoch:
            models = [self.time_models[n] for n in self.queues]
            fits = [m.co_runner_slope() for m in models]
            cached = self._batch_cache = (
                self._models_epoch,
                np.array([m.decode_s_per_token * f[0] for m, f in zip(models, fits)]),
                np.array([f[1] for f in fits]))
        return cached[1], cached[2]

    def prefix_saved_s(self, call: ScheduledCall, instances: list[str]) -> np.ndarray:
        """Expected prefill seconds ``call`` would skip on each of ``instances``: the prompt
        tokens the router-side prefix index believes each holds, at its prefill rate."""
        if self.prefix_index is None or not call.prefix_hashes:
            return np.zeros(len(instances))
        blocks = self.prefix_index.matched_blocks(call.prefix_hashes, instances)
        tokens = np.array([call.prefix_tokens(b) for b in blocks], dtype=float)
        pf = self._coef_vectors()[1]
        saved: np.ndarray = tokens * pf[[self._index[n] for n in instances]]
        return saved

    def _coef_vectors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-instance overhead, prefill and decode seconds per token (with the online
        corrections), refreshed only when a time model learns."""
        cached = self._coef_cache
        key = self._models_epoch
        if cached is None or cached[0] != key:
            models = [self.time_models[n] for n in self.queues]
            cached = self._coef_cache = (
                key, np.array([m.overhead_s for m in models]),
                np.array([m.prefill_s_per_token * m.prefill_ratio for m in models]),
                np.array([m.decode_s_per_token * m.decode_ratio for m in models]))
        return cached[1], cached[2], cached[3]

    def downstream_s(self, call: ScheduledCall, now: float) -> float:
        """Expected seconds on the longest chain after ``call``'s stage, as of the query's
        last event (see ``_refresh``)."""
        if call.query.run is None:
            return 0.0
        self._paths_on_demand(call.query, now)
        return call.query.path_cache.get(call.node_id, 0.0)

    def remaining_s(self, query: QueryState, now: float) -> float:
        """Expected seconds left on the query's critical path, as of its last event."""
        if query.run is not None:
            self._paths_on_demand(query, now)
            return query.path_cache.get(None, 0.0)
        return sum(self._mean_time(c.prompt_tokens, c.mean_output) for c in query.calls)

    def _paths_on_demand(self, query: QueryState, now: float) -> None:
        """Policies that keep no per-query state (fcfs, edf, gittins) skip the critical
        paths at events; asked for them anyway (inspection, tests), compute them now."""
        if not self._queue_policy.query_dependent:
            self._critical_paths(query, now)

    def _refresh(self, query: QueryState, now: float) -> None:
        """Something happened to ``query`` (arrival, a call ready, finished, or past an
        attained-service bucket): recompute its critical paths once, and re-key its waiting
        calls. Keys change only here, never per decision, so a queue of thousands of calls
        picks the next one in O(log n). Policies whose keys ignore the query skip both."""
        if not self._queue_policy.query_dependent:
            return
        if query.run is not None:
            self._critical_paths(query, now)
        policy = self._queue_policy
        seen: set[str] = set()
        key = None
        for c in list(query.calls):
            if c.state == CallState.WAITING and c.instance is not None:
                if policy.per_query:  # one key for the query, placed once per instance
                    if c.instance in seen:
                        continue
                    seen.add(c.instance)
                    if key is None:
                        key = policy.rank(c, now, self)
                self.queues[c.instance].rekey(c, now, self, key)

    # quantile levels of the optimistic and pessimistic paths (a symmetric 80% band)
    PATH_QUANTILES = (0.1, 0.9)

    def _critical_paths(self, query: QueryState, now: float) -> None:
        """Downstream critical path of every unfinished stage, and (key ``None``) of the
        whole remaining workflow, by one DP over a cached topological order: a stage the
        scheduler saw finish counts as done even before the runtime marks it, a running
        stage counts its expected remainder. The same pass gives the optimistic and
        pessimistic whole paths (every LLM stage at its P10 / P90 length) and the work left."""
        run = query.run
        assert run is not None  # callers compute paths only for queries with a workflow
        graph = run.graph
        shape = len(graph)  # the graph only grows, and only by new nodes (expansions)
        if query.topo is None or query.topo[0] != shape:
            import networkx as nx

            order = list(nx.topological_sort(graph))
            query.topo = (shape, [(n, run.node(n), list(graph.successors(n)))
                                  for n in reversed(order)])
        _, reverse_order = query.topo
        oh, pf, df = self._mean_coefs()
        calls = {c.node_id: c for c in query.calls}
        done = query.done_nodes
        pending, running, llm = run.PENDING, run.RUNNING, NodeKind.LLM
        rem: dict[str, tuple[float, float, float]] = {}
        after: dict[str | None, float] = {}
        after_lo: dict[str, float] = {}
        after_hi: dict[str, float] = {}
        total = total_lo = total_hi = work = 0.0
        for n, node, succ in reverse_order:
            state = run.state(n)
            if (state != pending and state != running) or n in done:
                continue
            if node.kind == llm:
                prompt, (mean, lo, hi) = self._stage_lengths(query, node, calls.get(n))
                base = oh + prompt * pf
                t, t_lo, t_hi = base + mean * df, base + lo * df, base + hi * df
                work += t
            else:
                t = t_lo = t_hi = self._tool_time(query, node)
            if state == running:
                started = run.started_at(n)
                if started is not None:
                    elapsed = now - started
                    t = max(0.0, t - elapsed)
                    t_lo = max(0.0, t_lo - elapsed)
                    t_hi = max(0.0, t_hi - elapsed)
            rem[n] = (t, t_lo, t_hi)
            best = best_lo = best_hi = 0.0
            for child in succ:
                r = rem.get(child)
                if r is not None:
                    v = r[0] + after[child]
                    if v > best:
                        best = v
                    v = r[1] + after_lo[child]
                    if v > best_lo:
                        best_lo = v
                    v = r[2] + after_hi[child]
                    if v > best_hi:
                        best_hi = v
            after[n], after_lo[n], after_hi[n] = best, best_lo, best_hi
            if t + best > total:
                total = t + best
            if t_lo + best_lo > total_lo:
                total_lo = t_lo + best_lo
            if t_hi + best_hi > total_hi:
                total_hi = t_hi + best_hi
        after[None] = total
        query.path_cache = after
        query.path_lo, query.path_hi, query.work_left = total_lo, total_hi, work

    def _tool_time(self, query: QueryState, node: Node) -> float:
        truth = self.length_model.true_lengths(query.id, node.id)
        if truth is not None and truth.duration_s is not None:
            return truth.duration_s
        return max(0.0, float(node.expected_s))

    def _stage_lengths(self, query: QueryState, node: Node, call: ScheduledCall | None
                       ) -> tuple[float, tuple[float, float, float]]:
        """(prompt tokens, (mean, P10, P90) output tokens) of an LLM stage: its call's
        when it has one, else what ``_future_lengths`` expects."""
        if call is not None:
            if call.length_summary is None:
                call.length_summary = _length_summary(call.output)
            return call.prompt_tokens, call.length_summary
        truth = self.length_model.true_lengths(query.id, node.id)
        if truth is not None:  # the oracle: this stage's real sizes
            o = float(truth.output_tokens)
            return truth.prompt_tokens, (o, o, o)
        prompt, dist = self._future_lengths(query, node)
        per_query = self._stage_summary.setdefault(query.id, {})
        summary = per_query.get(node.stage)
        if summary is None or summary[0] is not dist:
            summary = per_query[node.stage] = (dist, _length_summary(dist))
        return prompt, summary[1]

    def call_cost(self, call: ScheduledCall) -> Distribution:
        if call.cost is None:
            call.cost = cost_distribution(call.prompt_tokens, call.output)
        return call.cost

    def remaining_cost(self, query: QueryState) -> Distribution:
        """Distribution of the summed cost of the query's unfinished LLM stages.

        Built by Monte Carlo (a fixed number of joint samples, seeded by the query id so runs
        are reproducible) rather than by convolving ~20 distributions, and cached until the
        workflow or one of its calls changes."""
        version = (query.run.version if query.run is not None else None, query.calls_version)
        if query.remaining_cost is not None and query.remaining_cost_version == version:
            return query.remaining_cost
        by_node = {c.node_id: c for c in query.calls}
        parts: list[Distribution] = []
        if query.run is not None:
            for node in query.run.unfinished():
                if node.kind != NodeKind.LLM:
                    continue
                call = by_node.get(node.id)
                if call is not None:
                    parts.append(self._remaining_call_cost(call))
                else:
                    parts.append(cost_distribution(*self._future_lengths(query, node)))
        else:
            parts = [self._remaining_call_cost(c) for c in query.calls]
        total = _sum_by_sampling(parts, query.id)
        query.remaining_cost, query.remaining_cost_version = total, version
        return total

    # ============================================================================ internals
    def _live(self, call: ScheduledCall) -> bool:
        """Whether a runtime's report on ``call`` still concerns the coordinator: the call is
        running and its query is still known (a cancelled query's calls may report late)."""
        return call.state == CallState.RUNNING and self.queries.get(call.query.id) is call.query

    def _remaining_call_cost(self, call: ScheduledCall) -> Distribution:
        cost = self.call_cost(call)
        if call.attained_tokens <= 0:
            return cost
        from agentflow.scheduler.distribution import kv_cost

        attained = kv_cost(call.prompt_tokens, call.attained_tokens)
        if cost.survival(attained) <= 0:
            return Distribution.point(0.0)
        return cost.conditional_above(attained).shift(-attained)

    def _bucket(self, tokens: int) -> int:
        """Geometric buckets of attained output tokens (1, 2, 4, 8, ...)."""
        return int(tokens).bit_length()

    def _dispatch(self, call: ScheduledCall, now: float, *,
                  reason_if_none: str = "no instance is up") -> list[Decision]:
        candidates = [n for n in self.up_instances if n not in call.excluded] \
            or self.up_instances
        if not candidates:
            call.state = CallState.FAILED
            call.query.calls.discard(call)
            return [FailCall(call, f"no instance can run the call: {reason_if_none}")]
        instance = self.dispatch.choose(call, candidates, now, self)
        if self.prefix_index is not None:
            self.prefix_index.record(instance, call.prefix_hashes)
        queue = self.queues[instance]
        queue.enqueue(call, now, self)
        return self._admit(queue, now)

    def _admit(self, queue: InstanceQueue, now: float) -> list[Decision]:
        return [StartCall(c, queue.name, c.priority)
                for c in queue.admit(now, self, self._kv_tokens)]

    def _kv_tokens(self, call: ScheduledCall) -> int:
        """KV-cache tokens a call may hold on its instance: prompt + ``_output_reserve``."""
        return int(call.tokens_on(call.instance) + self._output_reserve(call))

    @staticmethod
    def _output_reserve(call: ScheduledCall) -> float:
        """Output tokens to hold KV for: the 90th percentile of the predicted length, given
        what the call has written so far (``attained_tokens``) — once past that percentile,
        the 90th percentile of the lengths above it, and once past every length the
        prediction allows, the next progress report (twice what it has written)."""
        output, written = call.output, call.attained_tokens
        if written <= 0:
            return output.quantile(0.9)
        if output.survival(written) > 0:
            return max(output.conditional_above(written).quantile(0.9), written)
        return 2 * written

    def _future_lengths(self, query: QueryState, node: Node) -> tuple[int, Distribution]:
        """Prompt tokens and output distribution of an LLM stage that has no call yet, from
        what serving knows: the length model (the oracle knows the truth), the node's
        ``max_tokens``, and its prompt size from the pipeline's hint, else the stage's
        calls so far, else ``DEFAULT_PROMPT_TOKENS``."""
        truth = self.length_model.true_lengths(query.id, node.id)
        if truth is not None:
            return truth.prompt_tokens, Distribution.point(truth.output_tokens)
        prompt = node.hints.get("prompt_tokens")
        if prompt is None:
            seen = self._stage_prompts.get(node.stage)
            prompt = seen[0] if seen is not None else DEFAULT_PROMPT_TOKENS
        prompt = int(prompt)
        return prompt, self._predict_stage(query, node.stage, prompt, node.hints.get("max_tokens"))

    def _predict_stage(self, query: QueryState, stage: str, prompt_tokens: int | None = None,
                       max_tokens: int | None = None) -> Distribution:
        per_query = self._stage_prediction.setdefault(query.id, {})
        dist = per_query.get(stage)
        if dist is None:
            dist = per_query[stage] = self.length_model.predict(
                stage, query.key_text, prompt_tokens, max_tokens=max_tokens)
        return dist

    def _mean_time(self, prompt_tokens: float, output_tokens: float) -> float:
        """A stage's time averaged over the cluster's up instances (HexGen-Flow's budget
        estimate, since the stage's instance is not chosen yet)."""
        oh, pf, df = self._mean_coefs()
        return oh + prompt_tokens * pf + output_tokens * df

    def _mean_coefs(self) -> tuple[float, float, float]:
        """The time models are linear in tokens, so their average over the up instances (all
        when none is up) is the mean of their coefficients (``_coef_vectors``), refreshed
        when a model learns or an instance goes up or down."""
        coef = self._mean_coef
        key = self._models_epoch
        if coef is None or coef[0] != key:
            up = [q.up for q in self.queues.values()]
            vectors: tuple[np.ndarray, ...] = self._coef_vectors()
            if any(up):
                vectors = tuple(v[up] for v in vectors)
            k = len(vectors[0])
            coef = self._mean_coef = (key, *(sum(v.tolist()) / k for v in vectors))
        return coef[1], coef[2], coef[3]

    def _retry_after(self, now: float) -> float:
        """Seconds until the least loaded instance would drain its queue (>= 1)."""
        work = self.work_vector(now)
        loads = [float(work[self._index[n]]) for n in self.up_instances] or [5.0]
        return max(1.0, min(loads))


def _observed(method: Callable[..., Any]) -> Callable[..., Any]:
    """Tell the coordinator's observers when ``method`` (an event) starts and returns."""
    @functools.wraps(method)
    def event(self: Coordinator, *args: Any, **kwargs: Any) -> Any:
        if not self._observers:
            return method(self, *args, **kwargs)
        for observer in self._observers:
            observer.event_started(method.__name__)
        result = None
        try:
            result = method(self, *args, **kwargs)
            return result
        finally:
            # Event methods return decisions, or (call(s), decisions), or no decision at all.
            if isinstance(result, tuple) and result and isinstance(result[-1], list):
                result = result[-1]
            decisions = result if isinstance(result, list) else []
            for observer in self._observers:
                observer.event_finished(method.__name__, decisions)
    return event


for _event in Coordinator.EVENTS:
    setattr(Coordinator, _event, _observed(getattr(Coordinator, _event)))


_COST_SAMPLES = 256

class _TimeModels(dict[str, InstanceTimeModel]):
    """The coordinator's time models by instance; replacing one (tests, calibration) marks the
    cached cluster-wide coefficients stale, as learning does."""

    def __init__(self, owner: Coordinator, models: dict[str, InstanceTimeModel]):
        super().__init__(models)
        self._owner = owner

    def __setitem__(self, name: str, model: InstanceTimeModel) -> None:
        super().__setitem__(name, model)
        owner = self.__dict__.get("_owner")  # absent while copy.deepcopy rebuilds the dict
        if owner is not None and hasattr(owner, "_models_epoch"):
            owner._models_epoch += 1


_QUANTILE_LEVELS = np.array(Coordinator.PATH_QUANTILES) - 1e-12  # as Distribution.quantile


def _length_summary(dist: Distribution) -> tuple[float, float, float]:
    """(mean, P10, P90) of a length distribution (``Distribution.quantile``'s lower quantile,
    in one search)."""
    values = dist.values
    idx = np.minimum(np.searchsorted(dist._cdf_array(), _QUANTILE_LEVELS, side="left"),
                     values.size - 1)
    return float(dist.mean()), float(values[idx[0]]), float(values[idx[1]])


def _sum_by_sampling(parts: list[Distribution], seed_text: str) -> Distribution:
    if not parts:
        return Distribution.point(0.0)
    if len(parts) == 1:
        return parts[0]
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    total = np.zeros(_COST_SAMPLES)
    for part in parts:
        total += part.sample(rng, _COST_SAMPLES)
    return Distribution.from_samples(total)
