"""The scheduler in real serving: a ``CallRouter`` that drives the coordinator from asyncio.

Each stage's LLM call waits here until the coordinator admits it to an instance, then runs on
that instance's backend with the coordinator's priority; progress, completion and failure
go back to the coordinator as events. Every call runs under a deadline derived from its
predicted time on that instance (``call_deadline``): past it, or once its token stream
stalls, the call is cancelled there and re-dispatched elsewhere, counted as a retry. What
each instance's calls did feeds its health (``health``): an instance that died, hangs or
keeps failing stops getting work and is probed with one tiny call before it gets work
again (first after ``probe_after_s``, backing off up to ``revive_after_s``; None: never).
A backend that watches its own process (a Ray actor, ``agentflow.distributed``) offers
``watch_health(listener)``: a death it notices between calls takes the instance out at once.
A query's cancellation removes its calls everywhere. A call the coordinator stops for a
better class (``scheduler.preemption``) has its backend request cancelled and waits for its
next admission; that attempt's late reports are dropped, and its query sees only the delay.
A stop, or the instance going down, wakes the attempt's watcher at once (an interrupt future
beside the backend task), however long the backend takes to end the cancelled request; an
attempt whose instance went down between its start and its task is handed back unsent.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agentflow.llm.base import (
    BackendError,
    LLMBackend,
    LLMRequest,
    LLMResult,
    ProgressCallback,
    SamplingParams,
)
from agentflow.scheduler.call import CallState, ScheduledCall
from agentflow.scheduler.call_deadline import CallDeadlines
from agentflow.scheduler.classes import ranks_by_class
from agentflow.scheduler.coordinator import (
    Coordinator,
    Decision,
    FailCall,
    PreemptCall,
    StartCall,
)
from agentflow.scheduler.health import HealthSettings, HealthState, HealthTracker, Transition
from agentflow.slo_classes import DEFAULT_CLASS
from agentflow.workflow.graph import WorkflowRun
from agentflow.workflow.query import Query
from agentflow.workflow.router import CallOutcome, LLMCall


class CallTimedOut(BackendError):
    """A call ran past its deadline (or its token stream stalled) and was cancelled on its
    instance; retryable elsewhere."""

    def __init__(self, message: str):
        super().__init__(message, retryable=True)


# Listeners hear about attempts the router gave up on (the backend raised nothing).
AttemptListener = Callable[[LLMRequest, str, BackendError], None]

class _Redispatch(Exception):
    """Internal: a running call must move because its instance went down."""


class _Stopped(Exception):
    """Internal: the attempt was stopped for a better class (``scheduler.preemption``);
    whatever its backend task does next (finish, fail, linger past its deadline) is not
    this call's outcome, and no timeout, stall or failure of the instance."""


class ScheduledRouter:
    def __init__(self, coordinator: Coordinator, backends: dict[str, LLMBackend], *,
                 revive_after_s: float | None = 30.0, health: HealthSettings | None = None):
        missing = set(coordinator.queues) - set(backends)
        if missing:
            raise ValueError(f"no backend for instances: {sorted(missing)}")
        self.coordinator = coordinator
        self.clock = coordinator.clock
        self.backends = backends
        self.revive_after_s = revive_after_s
        self.health_settings = health or HealthSettings()
        self.health = HealthTracker(list(coordinator.queues), self.health_settings,
                                    revive_after_s=revive_after_s)
        self.deadlines = CallDeadlines(coordinator, self.health_settings)
        # whether a start's priority is the queue's band-major rank (sent to vLLM as is)
        self._queue_ranked = ranks_by_class(coordinator._queue_policy)
        self._inflight: dict[ScheduledCall, asyncio.Task[LLMResult]] = {}
        self._moved: set[ScheduledCall] = set()
        # per running attempt: (its number, a future resolved the moment it is stopped or
        # its instance goes down), which its watcher waits on beside the backend's task
        self._interrupts: dict[ScheduledCall, tuple[int, asyncio.Future[None]]] = {}
        self._progress_at: dict[ScheduledCall, float] = {}
        self._probes: set[asyncio.Task[Any]] = set()
        self.down_reasons: dict[str, str] = {}
        self.attempt_listeners: list[AttemptListener] = []
        # attempts by outcome and instance since start (for /metrics): timeout, stalled,
        # error, retried (re-dispatched after any of those), preempted (stopped for a
        # better class, re-queued; not a failure)
        self.counts: Counter[tuple[str, str]] = Counter()
        # attempts stopped for a better class, by (instance, SLO class of the stopped call)
        self.preempted: Counter[tuple[str, str]] = Counter()
        for name, backend in backends.items():
            watch = getattr(backend, "watch_health", None)
            if watch is not None:
                watch(lambda reason, name=name: self._take_down(name, reason))

    # ------------------------------------------------------------------ query lifecycle
    def start_query(self, query: Query, run: WorkflowRun) -> None:
        """Register the query (raises ``QueryRejected`` when overloaded)."""
        self.coordinator.on_query_arrival(query.id, arrival=query.arrival,
                                          deadline=query.deadline, key_text=query.question,
                                          run=run, slo_class=query.slo_class,
                                          tenant=query.tenant)

    def _rank_of(self, query: Query) -> int:
        """The rank of the query's SLO class, which every call of it carries to the backend
        (vLLM's per-request priority); a class the table lacks ranks as the default one."""
        classes = self.coordinator.slo_classes
        klass = classes.get(query.slo_class or DEFAULT_CLASS) or classes.get(DEFAULT_CLASS)
        return klass.rank if klass is not None else 0

    def end_query(self, query: Query) -> None:
        self.coordinator.on_query_done(query.id)

    def cancel_query(self, query_id: str) -> None:
        running, decisions = self.coordinator.cancel_query(query_id, sent=self._sent)
        for call in running:
            task = self._inflight.get(call)
            if task is not None:
                task.cancel()
        self._apply(decisions)

    # ------------------------------------------------------------------ view
    def instance_report(self) -> dict[str, dict[str, Any]]:
        """Each instance as /v1/instances and /metrics show it: in service or not, calls
        waiting and running, health state and reason, and the counters since start.
        Plain data (it crosses the scheduler socket to the replicas, which hold no
        coordinator of their own: ``ShardServer``'s ``health`` question)."""
        out: dict[str, dict[str, Any]] = {}
        preempted: dict[str, dict[str, int]] = {}
        for (name, cls), n in list(self.preempted.items()):  # read from another thread
            preempted.setdefault(name, {})[cls] = n
        for name, h in self.health.instances.items():
            queue = self.coordinator.queues.get(name)
            out[name] = {
                "up": queue.up if queue is not None else True,
                "waiting": len(queue.waiting) if queue is not None else 0,
                "running": len(queue.running) if queue is not None else 0,
                "health": h.state.value, "reason": h.reason, "outages": h.opened,
                "probes_ok": h.probes_ok, "probes_failed": h.probes_failed,
                "timeouts": self.counts["timeout", name], "stalled": self.counts["stalled", name],
                "retried": self.counts["retried", name], "preempted": preempted.get(name, {})}
        return out

    # ------------------------------------------------------------------ calls
    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome:
        loop = asyncio.get_running_loop()
        query = call.run.query
        counts = self._count_tokens(call.request.prompt + call.request.answer_prefix)
        future: asyncio.Future[Any] = loop.create_future()
        sc, decisions = self.coordinator.on_call_ready(
            query.id, stage=call.node.stage, node_id=call.node.id,
            prompt_tokens=next(iter(counts.values())), payload=future,
            max_tokens=call.request.params.max_tokens,
            prompt_tokens_by_instance=counts if len(set(counts.values())) > 1 else None,
            prompt_text=call.request.prompt + call.request.answer_prefix)
        submitted = self.clock.now()
        rank = self._rank_of(query)
        self._apply(decisions)
        failed: list[dict[str, str]] = []  # attempts given up on, for the answer's timeline
        while True:
            try:
                instance, priority, attempt = await sc.payload
            except asyncio.CancelledError:  # started perhaps, but not sent
                self._apply(self.coordinator.on_call_cancelled(sc, sent=False))
                raise
            if attempt != sc.preemptions:
                continue  # that run was stopped before it began: wait for the next start
            started = self.clock.now()
            request = replace(call.request, priority=priority, slo_rank=rank,
                              queue_ranked=self._queue_ranked)

            def progress(tokens: int, sc: ScheduledCall = sc, attempt: int = attempt) -> None:
                if sc.preemptions != attempt:
                    return  # a stopped run still reporting
                self._progress_at[sc] = self.clock.now()
                self._apply(self.coordinator.on_call_progress(sc, tokens))
                if on_progress:
                    on_progress(tokens)

            if sc.state == CallState.CANCELLED:
                # its query was cancelled between this start and now: ``cancel_query``
                # found no task to cancel, so nothing may reach the instance
                raise asyncio.CancelledError
            if self.health.state(instance) == HealthState.DOWN:
                # it went down between this start and now (``_health`` cancels only the
                # attempts that have a task): hand the call back before it reaches the
                # instance, as one cut off there, so it runs elsewhere (a suspect
                # instance keeps its running calls, so it keeps this one too)
                self._moved_off(sc, instance, request, failed, sent=False)
                continue
            task = asyncio.ensure_future(self.backends[instance].generate(request, progress))
            self._inflight[sc] = task
            self._interrupts[sc] = (attempt, loop.create_future())
            try:  # a stopped attempt ends here whatever its task did (``_watch``): every
                # outcome below is the current attempt's
                result = await self._watch(sc, instance, task, started, attempt)
            except _Stopped:
                self._forget(sc)
                continue  # stopped for a better class: wait for the next admission
            except _Redispatch:
                self._forget(sc)
                self._moved_off(sc, instance, request, failed)
                continue
            except asyncio.CancelledError:  # this task was cancelled: its query is gone
                self._forget(sc)
                self._apply(self.coordinator.on_call_cancelled(sc))
                raise
            except CallTimedOut as err:
                self._forget(sc)
                sc.payload = loop.create_future()
                for listener in self.attempt_listeners:
                    listener(request, instance, err)
                failed.append({"instance": instance, "error": str(err)})
                self._health(self.health.on_timeout(instance, self.clock.now(), str(err)))
                self._hand_back(sc, instance, f"{instance}: {err}", retryable=True)
                continue
            except BackendError as err:
                self._forget(sc)
                sc.payload = loop.create_future()
                self.counts["error", instance] += 1
                failed.append({"instance": instance, "error": str(err)})
                self._health(self.health.on_failure(instance, self.clock.now(), str(err),
                                                    retryable=err.retryable))
                self._hand_back(sc, instance, f"{instance}: {err}", retryable=err.retryable)
                continue
            self._forget(sc)
            self._health(self.health.on_success(instance, self.clock.now()))
            self._apply(self.coordinator.on_call_done(
                sc, output_tokens=result.completion_tokens, ttft_s=result.ttft_s,
                total_s=result.total_s, cached_tokens=result.cached_prompt_tokens))
            finished = self.clock.now()
            return CallOutcome(result=result, instance=instance, submitted=submitted,
                               started=min(finished, started + result.queue_s),
                               finished=finished, priority=priority,
                               failed_attempts=tuple(failed))

    def _moved_off(self, sc: ScheduledCall, instance: str, request: LLMRequest,
                   failed: list[dict[str, str]], sent: bool = True) -> None:
        """The attempt's instance went down: the call goes back to the coordinator as a
        retryable failure there (its admission charge refunded; another instance runs it),
        and the answer's timeline shows the attempt; ``sent=False``: the request never left
        (it costs the call none of its attempts)."""
        sc.payload = asyncio.get_running_loop().create_future()
        moved = BackendError(f"instance {instance} went down: "
                             f"{self.down_reasons.get(instance, '')}")
        for listener in self.attempt_listeners:  # the answer's retries show it
            listener(request, instance, moved)
        failed.append({"instance": instance, "error": str(moved)})
        self._hand_back(sc, instance, f"instance {instance} went down", retryable=True,
                        sent=sent)

    def _hand_back(self, sc: ScheduledCall, instance: str, reason: str, *, retryable: bool,
                   sent: bool = True) -> None:
        """A failed attempt goes back to the coordinator (another instance, or the call
        fails); "retried" counts only the calls that run again."""
        decisions = self.coordinator.on_call_failed(sc, reason, retryable=retryable, sent=sent)
        if sc.state != CallState.FAILED:
            self.counts["retried", instance] += 1
        self._apply(decisions)

    def _sent(self, sc: ScheduledCall) -> bool:
        """Whether ``sc``'s current attempt reached its instance: it has a backend task of
        that attempt. A stopped attempt's entries stay until its watcher unwinds (``_forget``,
        a loop turn later), so a call preempted and started again elsewhere in that turn is
        not sent until its new task exists."""
        entry = self._interrupts.get(sc)
        return sc in self._inflight and entry is not None and entry[0] == sc.preemptions

    def _interrupt(self, sc: ScheduledCall, attempt: int | None = None) -> None:
        """Wake the watcher of ``sc``'s running attempt (``attempt``: only if it is that
        one) at once: it was stopped, or its instance went down."""
        entry = self._interrupts.get(sc)
        if entry is not None and (attempt is None or entry[0] == attempt) \
                and not entry[1].done():
            entry[1].set_result(None)

    async def _watch(self, sc: ScheduledCall, instance: str, task: asyncio.Task[LLMResult],
                     started: float, attempt: int) -> LLMResult:
        """The backend's result, or ``CallTimedOut`` once the call is past its deadline or
        its stream has stalled (the backend task is then cancelled). The limit is
        re-evaluated as the time models learn, so a call sent to an instance before anyone
        knew it hangs is caught as soon as its peers show what "late" means. ``_Stopped``
        as soon as the attempt is stopped (``_stop`` cancelled its task, which may take
        its time to end, and resolved the attempt's interrupt, which wakes this at once):
        its deadline and stream are no longer watched; ``_Redispatch`` as soon as its
        instance went down (the same interrupt). So the router's own cancels of a
        backend task never reach the caller as ``CancelledError``: that is raised only
        when this task itself is cancelled (its query is), on every Python (no
        ``Task.cancelling()``, which 3.10 lacks)."""
        stall_s = self.health_settings.stall_s
        entry = self._interrupts.get(sc)
        waits: set[asyncio.Future[Any]] = {task} if entry is None else {task, entry[1]}
        try:
            while True:
                if sc.preemptions != attempt:
                    task.add_done_callback(_swallow)
                    raise _Stopped()
                if sc in self._moved:  # its instance went down (``_health``)
                    task.add_done_callback(_swallow)
                    raise _Redispatch()
                now = self.clock.now()
                limit = self.deadlines.limit_s(sc, instance, started)
                left = started + limit - now
                last = self._progress_at.get(sc)
                if left <= 0:
                    self.counts["timeout", instance] += 1
                    raise _give_up(task, f"no answer within {limit:.2f} s (deadline from "
                                         f"its predicted time on {instance})")
                if stall_s is not None and last is not None and now - last >= stall_s:
                    self.counts["stalled", instance] += 1
                    raise _give_up(task, f"no token for {now - last:.1f} s after "
                                         f"{sc.attained_tokens} (stalled)")
                wait = min(left, max(0.05, min(1.0, limit / 8)))
                if stall_s is not None and last is not None:
                    wait = min(wait, max(0.01, last + stall_s - now))
                done, _ = await asyncio.wait(waits, timeout=wait,
                                             return_when=asyncio.FIRST_COMPLETED)
                if task in done:
                    if sc.preemptions != attempt or (task.cancelled() and sc in self._moved):
                        continue  # stopped, or cut off its dead instance: see the top
                    return task.result()
        except asyncio.CancelledError:
            task.cancel()  # the query was cancelled: stop the backend's work too
            raise

    def _forget(self, sc: ScheduledCall) -> None:
        self._inflight.pop(sc, None)
        self._interrupts.pop(sc, None)
        self._progress_at.pop(sc, None)
        self._moved.discard(sc)

    # ------------------------------------------------------------------ internals
    def _count_tokens(self, text: str) -> dict[str, int]:
        """The prompt's length on each instance, tokenised once per distinct tokenizer (the
        instances may serve different models)."""
        by_key: dict[tuple[Any, ...], int] = {}
        counts = {}
        for name, backend in self.backends.items():
            key = backend.tokenizer_key
            if key not in by_key:
                by_key[key] = backend.count_tokens(text)
            counts[name] = by_key[key]
        return counts

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, PreemptCall):
                self._stop(d)
                continue
            future = d.call.payload
            if future is None or future.done():
                continue
            if isinstance(d, StartCall):
                future.set_result((d.instance, d.priority, d.attempt))
            elif isinstance(d, FailCall):
                future.set_exception(BackendError(d.reason, retryable=False))

    def _stop(self, d: PreemptCall) -> None:
        """Cancel the stopped run's backend request (an HTTP request to vLLM or
        llama-server is aborted with it); the call's next admission resolves a fresh
        future, which ``submit`` waits on once that run has unwound."""
        sc = d.call
        sc.payload = asyncio.get_running_loop().create_future()
        self.counts["preempted", d.instance] += 1
        self.preempted[d.instance, sc.query.slo_class or DEFAULT_CLASS] += 1
        task = self._inflight.get(sc)
        if task is not None and not task.done():
            task.cancel()
        self._interrupt(sc, d.attempt)

    def _health(self, transition: Transition | None) -> None:
        """Act on a health change: out of service (waiting calls move; when down, running
        ones too), a probe scheduled, or back in service."""
        if transition is None:
            return
        name, new = transition.instance, transition.new
        if new in (HealthState.SUSPECT, HealthState.DOWN):
            self.down_reasons[name] = transition.reason
            if self.coordinator.queues[name].up:
                self._apply(self.coordinator.on_instance_down(name))
            if new == HealthState.DOWN:
                for sc, task in list(self._inflight.items()):
                    if sc.instance == name and not task.done():
                        self._moved.add(sc)
                        task.cancel()
                        self._interrupt(sc)
        elif new == HealthState.HEALTHY:
            self.down_reasons.pop(name, None)
            self._apply(self.coordinator.on_instance_up(name))
        if transition.probe_in_s is not None:
            asyncio.get_running_loop().call_later(transition.probe_in_s, self._start_probe,
                                                  name)

    def _take_down(self, instance: str, reason: str) -> None:
        """Take an instance out at once (e.g. its backend is known to be gone)."""
        self._health(self.health.on_failure(instance, self.clock.now(), reason,
                                            retryable=True))

    def _start_probe(self, instance: str) -> None:
        transition = self.health.on_probe_started(instance, self.clock.now())
        if transition is None:
            return  # already back, or a probe is under way
        task = asyncio.ensure_future(self._probe(instance))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, instance: str) -> None:
        """One tiny real call; the instance gets work again only if it answers in time."""
        request = LLMRequest(prompt="ping", params=SamplingParams(max_tokens=1),
                             stage="probe", query_id="")
        ok, reason = True, ""
        try:
            await asyncio.wait_for(self.backends[instance].generate(request),
                                   self.health_settings.probe_timeout_s)
        except asyncio.TimeoutError:
            ok, reason = False, f"no answer within {self.health_settings.probe_timeout_s:g} s"
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure keeps the instance out
            ok, reason = False, f"{type(err).__name__}: {err}"
        self._health(self.health.on_probe(instance, self.clock.now(), ok, reason))


def _give_up(task: asyncio.Task[Any], reason: str) -> CallTimedOut:
    """Cancel the backend's work on a call that is being moved; don't wait for it (a hung
    backend may take its time to notice)."""
    task.cancel()
    task.add_done_callback(_swallow)
    return CallTimedOut(f"call timed out: {reason}")


def _swallow(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
