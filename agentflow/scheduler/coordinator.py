"""The coordinator: every LLM call of every query passes through here.

Event-driven and clock-injected: the runtime (asyncio serving, or the simulator's virtual
time) reports events — a query arrived, a call became ready, made progress, finished or
failed, an instance went down — and gets back decisions: which calls to start where, with
which backend priority, and which to fail. The coordinator never sleeps and never reads wall
time, so the same object runs real serving and simulation.

This module holds the events. What policies read (``SchedulerView``) is in its bases:
``scheduler.view`` (vectorised instance state and its caches) and ``scheduler.paths``
(critical paths and remaining-cost sampling). The decision types live in
``scheduler.decisions`` and observer wrapping in ``scheduler.observer``; all are importable
from here as before.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from agentflow.scheduler.call import CallState, QueryState, ScheduledCall
from agentflow.scheduler.classes import (
    DEADLINE_ADMISSION,
    ClassLoad,
    ClassRankedQueue,
    arrival_band,
    default_deadline,
    engine_priority,
    headroom_gate,
    lowest_class,
    shed_limit,
    with_classes,
)
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.decisions import (
    Decision,
    FailCall,
    PreemptCall,
    QueryRejected,
    StartCall,
)
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.fairness import TenantShares, rekey_tenants
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS, FastLane, check_fast_lane
from agentflow.scheduler.instance import InstanceQueue
from agentflow.scheduler.lengths import LengthModel, make_length_model
from agentflow.scheduler.loadbook import LoadBook
from agentflow.scheduler.observer import CoordinatorObserver, observed
from agentflow.scheduler.paths import DEFAULT_PROMPT_TOKENS, WorkflowPaths
from agentflow.scheduler.policies import parse_policy, resolve
from agentflow.scheduler.policies.base import BatchView
from agentflow.scheduler.preemption import check_preemption, victims
from agentflow.scheduler.prefix_index import BLOCK_TOKENS, PrefixIndex, block_hashes, pseudo_tokens
from agentflow.slo_classes import DEFAULT_SLO_CLASSES, SloClass, resolve_class
from agentflow.workflow.clock import Clock
from agentflow.workflow.graph import NodeKind

__all__ = ["Coordinator", "CoordinatorObserver", "Decision", "StartCall", "FailCall",
           "PreemptCall", "QueryRejected", "BatchView"]


class Coordinator(WorkflowPaths):
    # The event methods observers see (see ``add_observer``); each is decorated ``@observed``.
    EVENTS = ("on_query_arrival", "on_call_ready", "on_call_progress", "on_call_done",
              "on_call_failed", "on_call_cancelled", "on_instance_down", "on_instance_up",
              "on_query_done", "cancel_query")

    def __init__(self, instances: list[InstanceSpec], *, clock: Clock, policy: str = "flowsage",
                 alpha: float | None = None, length_model: LengthModel | None = None,
                 max_waiting_calls: int | None = None, max_active_queries: int | None = None,
                 max_attempts: int = 3, admit_by_backlog: bool = False,
                 max_backlog_s: float | None = None,
                 slo_classes: Mapping[str, SloClass] | None = None,
                 deadline_admission: str | None = None, preemption: str | None = None,
                 fast_lane: int | None = FAST_LANE_CALLS, **queue_kwargs: Any):
        """``length_model``: the length model; None builds the one the policy name picks
        (``flowsage@oracle``; the learned length model by default). ``preemption``: ``off``
        (None), ``class`` or ``fair`` (``scheduler.preemption``; only under a queue policy
        that keeps room for better bands, flowsage: with any other, a ValueError naming it),
        or ``auto`` (``fair`` where it can act, else off; the config's default).
        ``fast_lane``: calls a tenant outranked by a present one may run on the fastest
        instance (``scheduler.fast_lane``; None: off; acts only where the gate is, under
        flowsage)."""
        if not instances:
            raise ValueError("a cluster needs at least one instance")
        names = [s.name for s in instances]
        if len(set(names)) != len(names):
            raise ValueError(f"instance names must be unique: {names}")
        self.clock = clock
        self.policy_name = policy
        self.dispatch, queue_policy = resolve(policy, alpha=alpha, **queue_kwargs)
        # class rank (and tenant shares) in front of the policy's keys (scheduler.classes)
        queue_policy = with_classes(queue_policy)
        self._queue_policy = queue_policy
        self.fairness = TenantShares(classes=lambda: self.slo_classes)  # ranks, weights
        self._fair = isinstance(queue_policy, ClassRankedQueue) and queue_policy.fair
        if deadline_admission is not None and deadline_admission not in DEADLINE_ADMISSION:
            raise ValueError(f"deadline_admission must be one of {DEADLINE_ADMISSION} or None")
        # refuse (or move to the lowest class) a query that cannot meet its deadline
        self.deadline_admission = deadline_admission
        self.loads = LoadBook(len(instances))
        self.queues = {s.name: InstanceQueue(s, queue_policy, self.loads, i)
                       for i, s in enumerate(instances)}
        self._class_load: ClassLoad | None = None
        if isinstance(queue_policy, ClassRankedQueue):  # waiting work by band, for dispatch
            self._class_load = ClassLoad(self, len(instances))
            for q in self.queues.values():
                q.class_load = self._class_load
        # the flood's cap on the fastest instance while a better tenant is present
        lane_calls = check_fast_lane(fast_lane)
        self.fast_lane = FastLane(self, lane_calls) \
            if self._fair and lane_calls is not None else None
        if self._fair:  # room kept for higher classes while they have queries in flight
            gate = headroom_gate(self)
            for q in self.queues.values():
                q.gate = gate
        # Stop running lower-class calls for a better class (scheduler.preemption). Only
        # where the headroom gate keeps a stopped call from starting again beside the call
        # it made way for: elsewhere a clear error, not a silent no-op.
        self.preemption = check_preemption(preemption, policy, fair=self._fair)
        self.preempted_calls = 0  # calls stopped so far (each also counts on the call)
        self._init_view(instances)
        for q in self.queues.values():  # how a held progress report is priced
            q.kv_at = self._kv_tokens_at
            q.kv_at_most = self._kv_tokens_at_most
        self.length_model = length_model if length_model is not None \
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
        self._init_paths()
        # Router-side approximate prefix index, kept only for dispatch policies that read it
        # (``prefix_aware``): fed with the prompt text of dispatched calls.
        self.prefix_index = None
        if getattr(self.dispatch, "prefix_aware", False):
            self.prefix_index = PrefixIndex({
                s.name: (s.kv_token_budget or 2 ** 40) // BLOCK_TOKENS for s in instances})

    # ============================================================================ events
    @observed
    def on_query_arrival(self, query_id: str, *, arrival: float | None = None,
                         deadline: float | None = None, key_text: str = "",
                         run: Any = None, slo_class: str | None = None,
                         tenant: str | None = None) -> QueryState:
        """Admit a query or raise ``QueryRejected`` (bounded queues, never unbounded growth)."""
        now = self.clock.now()
        cls = resolve_class(slo_class, self.slo_classes)
        deadline = default_deadline(cls, now, deadline)
        max_active = shed_limit(self.max_active_queries, cls, self.slo_classes)
        if max_active is not None and len(self.queries) >= max_active:
            raise QueryRejected(
                f"overloaded: {len(self.queries)} queries in progress (limit "
                f"{max_active} for {cls.name})", retry_after_s=self._retry_after(now))
        waiting = self.waiting_calls
        max_waiting = shed_limit(self.max_waiting_calls, cls, self.slo_classes)
        if max_waiting is not None and waiting >= max_waiting:
            raise QueryRejected(f"overloaded: {waiting} LLM calls waiting (limit "
                                f"{max_waiting} for {cls.name})",
                                retry_after_s=self._retry_after(now))
        if not self.up_instances:
            raise QueryRejected("no model instance is up", retry_after_s=5.0)
        if self.admit_by_backlog:
            from agentflow.scheduler.backlog import backlog_rejection

            refused = backlog_rejection(self, now, deadline, self.max_backlog_s,
                                        arrival_band(self, cls, tenant))
            if refused is not None:
                raise QueryRejected(refused[0], retry_after_s=refused[1])
        query = QueryState(id=query_id, arrival=now if arrival is None else arrival,
                           deadline=deadline, key_text=key_text, run=run,
                           slo_class=slo_class, tenant=tenant)
        if self.deadline_admission is not None:
            self._admit_by_deadline(query, now)
        self.queries[query_id] = query
        if self._fair:
            rekey_tenants(self, self.fairness.arrive(query, now), now)
        self._refresh(query, now)
        return query

    def _admit_by_deadline(self, query: QueryState, now: float) -> None:
        """Refuse, or move to the lowest class, a query that would miss its deadline
        (``scheduler.backlog.deadline_verdict``)."""
        from agentflow.scheduler.backlog import DeadlineRejected, deadline_verdict

        verdict = deadline_verdict(self, query, now)
        if verdict is None:
            return
        self._forget_query(query.id)  # the predictions its paths cached
        assert query.deadline is not None  # only a query with a deadline can miss it
        if self.deadline_admission == "reject":
            raise DeadlineRejected(verdict[0], verdict[1], query.deadline - now)
        lowest = lowest_class(self.slo_classes)
        query.slo_class, query.deadline = lowest.name, default_deadline(lowest, now, None)

    @observed
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
        self._note_prompt(stage, prompt_tokens)
        call = ScheduledCall(id=f"c{next(self._ids)}", query=query, stage=stage,
                             node_id=node_id, prompt_tokens=prompt_tokens, output=output,
                             ready_at=now, payload=payload,
                             prompt_tokens_on=prompt_tokens_by_instance, max_tokens=max_tokens)
        if prompt_text:
            call.prefix_hashes = block_hashes(prompt_text)
            call.prefix_pseudo_tokens = pseudo_tokens(prompt_text)
        query.calls.add(call)
        query.calls_version += 1
        self._refresh(query, now)
        return call, self._dispatch(call, now)

    @observed
    def on_call_progress(self, call: ScheduledCall, output_tokens: int) -> list[Decision]:
        """Streaming progress: attained service feeds Gittins ranks and outstanding work; a
        first token frees a pending-prefill slot, so more calls may be admitted."""
        query = call.query
        if call.state != CallState.RUNNING or self.queries.get(query.id) is not query:
            return []  # not ``_live``
        attained = call.attained_tokens
        first = attained == 0 and output_tokens > 0
        # crossed a geometric bucket of attained output tokens (1, 2, 4, 8, ...)?
        crossed = int(attained).bit_length() != int(output_tokens).bit_length()
        if output_tokens > attained:
            call.attained_tokens = attained = output_tokens
        if crossed:
            # one put-off test for both events (``_defer_paths``, as ``on_call_done``'s)
            stamp = self._paths_stamp(query)  # before this report's own bump
            query.calls_version += 1  # re-rank at bucket boundaries, not every token
            now = self.clock.now()
            if not (self._queue_policy.query_dependent and query.run is not None
                    and self._defer_paths(query, now, stamp)):
                self._refresh(query, now)
            if call.instance is not None:
                # held, priced when its instance's KV is read (``InstanceQueue.note_progress``)
                self.queues[call.instance].note_progress(call, attained)
        if first and call.instance is not None and call.state == CallState.RUNNING:
            queue = self.queues[call.instance]
            queue.first_token(call)
            if queue.spec.max_pending_prefill is not None:
                return self._admit(queue, self.clock.now())
        return []

    @observed
    def on_call_done(self, call: ScheduledCall, *, output_tokens: int, ttft_s: float = 0.0,
                     total_s: float = 0.0, cached_tokens: int = 0) -> list[Decision]:
        if not self._live(call):
            return []  # its query was cancelled or failed: nothing to free, nothing to learn
        now = self.clock.now()
        call.state, call.finished_at = CallState.DONE, now
        call.attained_tokens = output_tokens
        assert call.instance is not None  # a live call that finished was dispatched
        queue = self.queues[call.instance]
        stamp = self._paths_stamp(call.query)  # before this event's own bumps
        # calls beside it: the mean of what it found on admission and leaves behind
        co_runners = (call.co_runners_at_start + len(queue.running) - 1) / 2
        prefill_during = queue.prefilled_since_first_token(call)
        queue.finish(call, completed=True)
        call.query.calls.discard(call)
        call.query.calls_version += 1
        call.query.done_nodes.add(call.node_id)
        self.length_model.observe(call.stage, call.query.key_text, output_tokens,
                               call.prompt_tokens)
        self._stage_prediction.get(call.query.id, {}).pop(call.stage, None)
        if total_s > 0:
            self.time_models[call.instance].observe(
                call.tokens_on(call.instance), output_tokens, ttft_s, total_s, cached_tokens,
                co_runners=co_runners, prefill_ahead_tokens=call.prefill_ahead_at_start,
                co_runners_at_start=call.co_runners_at_start,
                prefill_during_tokens=prefill_during)
            self._model_learned(call.instance)  # its row of the view's arrays, not all
        if call.query.id in self.queries and not self._defer_done_paths(call.query, now, stamp):
            self._refresh(call.query, now)
        return self._admit(queue, now)

    @observed
    def on_call_failed(self, call: ScheduledCall, reason: str, *,
                       retryable: bool = True, sent: bool = True) -> list[Decision]:
        """A call failed on its instance: try another instance if sensible, else fail it.
        ``sent=False``: its request never reached the instance (it went down between the
        start and the send), so the attempt is not one of the call's ``max_attempts``."""
        if not self._live(call):
            return []
        now = self.clock.now()
        assert call.instance is not None  # a live call that failed was dispatched
        queue = self.queues[call.instance]
        queue.finish(call)
        decisions = self._admit(queue, now)
        call.excluded.add(queue.name)
        if sent:
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
        self._refund(call, now)  # as a stopped run: the tenant pays for the run that completes
        return decisions + self._dispatch(call, now, reason_if_none=reason)

    @observed
    def on_call_cancelled(self, call: ScheduledCall, *, sent: bool = True) -> list[Decision]:
        """The runtime gave up on a call (its query was cancelled): free its place.
        ``sent=False``: a started call whose request never left (cancelled between its start
        and its send) used no instance time, so its tenant gets the admission charge back,
        as a ``sent=False`` hand-back does."""
        now = self.clock.now()
        decisions: list[Decision] = []
        if call.instance is not None:
            queue = self.queues[call.instance]
            if call.state == CallState.WAITING:
                queue.remove(call)
            elif call.state == CallState.RUNNING:
                if not sent:
                    self._refund(call, now)
                queue.finish(call)
                decisions = self._admit(queue, now)
        call.state = CallState.CANCELLED
        call.query.calls.discard(call)
        return decisions

    @observed
    def on_instance_down(self, name: str) -> list[Decision]:
        """Mark an instance down and move its waiting calls elsewhere. Its running calls are
        the runtime's to cancel; each then comes back through ``on_call_failed``."""
        now = self.clock.now()
        queue = self.queues[name]
        queue.up = False
        self._instances_changed()
        if self.prefix_index is not None:  # its cache is lost with it
            self.prefix_index.forget_instance(name)
        decisions: list[Decision] = []
        for call in sorted(queue.waiting, key=lambda c: c.seq):
            queue.remove(call)
            decisions += self._dispatch(call, now, reason_if_none=f"instance {name} is down")
        return decisions

    @observed
    def on_instance_up(self, name: str) -> list[Decision]:
        queue = self.queues[name]
        queue.up = True
        self._instances_changed()
        return self._admit(queue, self.clock.now())

    @observed
    def on_query_done(self, query_id: str) -> None:
        query = self.queries.pop(query_id, None)
        if query is not None and self._fair:
            rekey_tenants(self, self.fairness.leave(query), self.clock.now())
        self._forget_query(query_id)

    @observed
    def cancel_query(self, query_id: str,
                     sent: Callable[[ScheduledCall], bool] | None = None
                     ) -> tuple[list[ScheduledCall], list[Decision]]:
        """Remove the query's waiting calls everywhere. Returns its running calls (for the
        runtime to abort) and the admissions their freed capacity allows. ``sent``: whether
        a running call's request has reached its instance (the runtime knows; None: every
        one has): one that has not used no instance time, so its tenant gets its admission
        charge back, before the query leaves its tenant's account."""
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
                if sent is not None and not sent(call):
                    self._refund(call, now)
                queue.finish(call)
                call.state = CallState.CANCELLED
                running.append(call)
                decisions += self._admit(queue, now)
        query.calls.clear()
        self.on_query_done(query_id)
        return running, decisions

    def add_observer(self, observer: CoordinatorObserver) -> None:
        self._observers.append(observer)

    # ============================================================================ internals
    def _refresh(self, query: QueryState, now: float) -> None:
        """Something happened to ``query`` (arrival, a call ready, finished, or past an
        attained-service bucket): recompute its critical paths once, and re-key its waiting
        calls. Keys change only here, never per decision, so a queue of thousands of calls
        picks the next one in O(log n). Policies whose keys ignore the query skip both."""
        policy = self._queue_policy
        if not policy.query_dependent:
            return
        if query.run is not None:
            self._critical_paths(query, now)
        queues, waiting = self.queues, CallState.WAITING
        if not policy.per_query:
            for c in list(query.calls):
                if c.state == waiting and c.instance is not None:
                    queues[c.instance].rekey(c, now, self)
            return
        # one key for the query, placed once per instance (ranked at the first waiting call)
        seen: set[str] = set()
        key = None
        for c in list(query.calls):
            instance = c.instance
            if instance is None or instance in seen or c.state != waiting:
                continue
            seen.add(instance)
            if key is None:
                key = policy.rank(c, now, self)
            queues[instance].rekey_query(c, now, key)

    def _defer_done_paths(self, query: QueryState, now: float, stamp: tuple[Any, ...]) -> bool:
        """Put off the paths pass a finished call asks for, as a progress report's is
        (``WorkflowPaths._defer_paths``): with no call of the query waiting in a queue,
        nothing reads its paths before the runtime readies the next stage, whose own pass
        overwrites them (10,341 of 23,971 passes in a 500-query hetero-1024 simulation).

        The one input the pass reads that the event itself moved is the length model's
        per-query predictions: ``on_call_done`` drops the finished stage's, and the pass
        predicts every future stage that has none from the length model as it is when the
        pass runs — a put-off pass would do it with a later model. So the predictions the
        pass would make are made here, now, by its own rule (each missing stage at its
        first future node in the pass's order, with that node's prompt), and the put-off
        pass finds them made: the same floats as the eager pass. The oracle length model
        (true sizes, priced per node) is left eager."""
        if not self._queue_policy.query_dependent or query.run is None:
            return False
        if type(self.length_model).true_lengths is not LengthModel.true_lengths:
            return False
        run, topo = query.run, query.topo
        if topo is None or topo[0] != len(run.graph):
            return False  # no pass on this graph yet: make it now
        if not self._defer_paths(query, now, stamp):
            return False
        predicted = self._stage_prediction.get(query.id)
        calls = {c.node_id for c in query.calls}
        done, pending, running, llm = query.done_nodes, run.PENDING, run.RUNNING, NodeKind.LLM
        prompts = self._stage_prompts
        for n, node, _ in topo[1]:  # the pass's order and its test for a future stage
            if node.kind != llm or n in calls or n in done:
                continue
            state = run.state(n)
            if state != pending and state != running:
                continue
            if predicted is not None and node.stage in predicted:
                continue
            hints = node.hints
            hinted = hints.get("prompt_tokens")
            if hinted is None:
                seen = prompts.get(node.stage)
                hinted = seen[0] if seen is not None else DEFAULT_PROMPT_TOKENS
            self._predict_stage(query, node.stage, int(hinted), hints.get("max_tokens"))
            predicted = self._stage_prediction[query.id]
        return True

    def _live(self, call: ScheduledCall) -> bool:
        """Whether a runtime's report on ``call`` still concerns the coordinator: the call is
        running and its query is still known (a cancelled query's calls may report late)."""
        return call.state == CallState.RUNNING and self.queries.get(call.query.id) is call.query

    def _dispatch(self, call: ScheduledCall, now: float, *,
                  reason_if_none: str = "no instance is up") -> list[Decision]:
        up = self.up_instances  # the cached list: the view indexes it without a lookup
        candidates = ([n for n in up if n not in call.excluded] or up) if call.excluded else up
        if not candidates:
            call.state = CallState.FAILED
            call.query.calls.discard(call)
            return [FailCall(call, f"no instance can run the call: {reason_if_none}")]
        instance = self.dispatch.choose(call, candidates, now, self)
        if self.prefix_index is not None:
            self.prefix_index.record(instance, call.prefix_hashes)
        queue = self.queues[instance]
        queue.enqueue(call, now, self)
        decisions = self._admit(queue, now)
        if call.state == CallState.WAITING and self.can_preempt():
            decisions += self._preempt(queue, victims(self, queue, call, now), now)
        return decisions

    def _refund(self, call: ScheduledCall, now: float) -> None:
        """The call's tenant gets its admission charge back (``TenantShares.refund``: the
        run was stopped, failed or never sent) and the waiting calls of tenants whose share
        flag flipped are re-keyed. Nothing is charged without fair shares, so nothing to do."""
        if self._fair:
            rekey_tenants(self, self.fairness.refund(call), now)

    def _admit(self, queue: InstanceQueue, now: float) -> list[Decision]:
        started = queue.admit(now, self, self._kv_tokens)
        if self._fair and started:  # each tenant is charged the instance time it was given
            flipped = [k for c in started
                       for k in self.fairness.charge_call(c, self.expected_s(c, queue.name))]
            rekey_tenants(self, flipped, now)
        if isinstance(self._queue_policy, ClassRankedQueue):  # the backend ranks by class too
            for c in started:
                c.priority = engine_priority(self, c, now)
        decisions: list[Decision] = [StartCall(c, queue.name, c.priority, c.preemptions)
                                       for c in started]
        if started and self.can_preempt():
            for c in started:
                if c.state == CallState.RUNNING:  # not itself stopped by an earlier one
                    decisions += self._preempt(queue, victims(self, queue, c, now), now)
        return decisions

    def can_preempt(self) -> bool:
        """Whether a preemption can happen now: it is on, and two bands could meet — two
        classes in flight (under ``fair``, two class-and-tenant pairs). With one, nothing
        is stoppable, so the victim search is skipped (a run without tenants or classes
        pays nothing for the setting)."""
        if self.preemption is None or not self._fair:
            return False
        shares = self.fairness
        if self.preemption == "fair":
            return shares.pairs_in_flight() >= 2
        return len(shares.active_classes()) >= 2

    def _preempt(self, queue: InstanceQueue, stop: list[ScheduledCall], now: float
                 ) -> list[Decision]:
        """Stop ``stop`` on ``queue`` (``scheduler.preemption``), re-queue each through
        dispatch with its sequence number (its place within its class), then admit into the
        room made. Progress is lost: the call runs again from its prompt."""
        if not stop:
            return []
        decisions: list[Decision] = []
        for victim in stop:
            self._refund(victim, now)  # it is charged again when admitted again
            queue.finish(victim)
            victim.state = CallState.WAITING
            victim.attained_tokens = 0
            victim.started_at = None
            decisions.append(PreemptCall(victim, queue.name, victim.preemptions))
            victim.preemptions += 1
            self.preempted_calls += 1
        decisions += self._admit(queue, now)
        for victim in stop:  # in no queue until dispatched, so nothing admitted one meanwhile
            victim.query.calls_version += 1  # attained service went back to 0
            decisions += self._dispatch(victim, now)
        return decisions

    def _retry_after(self, now: float) -> float:
        """Seconds until the least loaded instance would drain its queue (>= 1)."""
        names, index = self._up_set()
        least = float(self.work_vector(now)[index].min()) if names else 5.0
        return max(1.0, least)
