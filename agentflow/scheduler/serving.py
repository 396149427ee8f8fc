"""The scheduler in real serving: a ``CallRouter`` that drives the coordinator from asyncio.

Each stage's LLM call waits here until the coordinator admits it to an instance, then runs on
that instance's backend with the coordinator's priority; progress, completion and failure
go back to the coordinator as events. A backend that fails with a retryable error takes its
instance down (its other in-flight calls are re-dispatched too) until ``revive_after_s``
passes; a query's cancellation removes its calls everywhere.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from agentflow.llm.base import BackendError, LLMBackend
from agentflow.scheduler.call import ScheduledCall
from agentflow.scheduler.coordinator import Coordinator, Decision, FailCall, StartCall
from agentflow.workflow.graph import WorkflowRun
from agentflow.workflow.query import Query
from agentflow.workflow.router import CallOutcome, LLMCall


class _Redispatch(Exception):
    """Internal: a running call must move because its instance went down."""


class ScheduledRouter:
    def __init__(self, coordinator: Coordinator, backends: dict[str, LLMBackend], *,
                 revive_after_s: float | None = 30.0):
        missing = set(coordinator.queues) - set(backends)
        if missing:
            raise ValueError(f"no backend for instances: {sorted(missing)}")
        self.coordinator = coordinator
        self.clock = coordinator.clock
        self.backends = backends
        self.revive_after_s = revive_after_s
        self._inflight: dict[ScheduledCall, asyncio.Task] = {}
        self._moved: set[ScheduledCall] = set()
        self.down_reasons: dict[str, str] = {}

    # ------------------------------------------------------------------ query lifecycle
    def start_query(self, query: Query, run: WorkflowRun) -> None:
        """Register the query (raises ``QueryRejected`` when overloaded)."""
        self.coordinator.on_query_arrival(query.id, arrival=query.arrival,
                                          deadline=query.deadline, key_text=query.question,
                                          run=run)

    def end_query(self, query: Query) -> None:
        self.coordinator.on_query_done(query.id)

    def cancel_query(self, query_id: str) -> None:
        running, decisions = self.coordinator.cancel_query(query_id)
        for call in running:
            task = self._inflight.get(call)
            if task is not None:
                task.cancel()
        self._apply(decisions)

    # ------------------------------------------------------------------ calls
    async def submit(self, call: LLMCall, on_progress=None) -> CallOutcome:
        loop = asyncio.get_running_loop()
        query = call.run.query
        first = next(iter(self.backends.values()))
        prompt_tokens = first.count_tokens(call.request.prompt + call.request.answer_prefix)
        future: asyncio.Future = loop.create_future()
        sc, decisions = self.coordinator.on_call_ready(
            query.id, stage=call.node.stage, node_id=call.node.id, prompt_tokens=prompt_tokens,
            payload=future, max_tokens=call.request.params.max_tokens)
        submitted = self.clock.now()
        self._apply(decisions)
        while True:
            try:
                instance, priority = await sc.payload
            except asyncio.CancelledError:
                self._apply(self.coordinator.on_call_cancelled(sc))
                raise
            started = self.clock.now()
            request = replace(call.request, priority=priority)

            def progress(tokens: int, sc=sc) -> None:
                self._apply(self.coordinator.on_call_progress(sc, tokens))
                if on_progress:
                    on_progress(tokens)

            task = asyncio.ensure_future(self.backends[instance].generate(request, progress))
            self._inflight[sc] = task
            try:
                result = await task
            except asyncio.CancelledError:
                self._inflight.pop(sc, None)
                if sc in self._moved and not _outer_cancelled():
                    self._moved.discard(sc)
                    sc.payload = loop.create_future()
                    self._apply(self.coordinator.on_call_failed(
                        sc, f"instance {instance} went down", retryable=True))
                    continue
                self._apply(self.coordinator.on_call_cancelled(sc))
                raise
            except BackendError as err:
                self._inflight.pop(sc, None)
                sc.payload = loop.create_future()
                if err.retryable:
                    self._take_down(instance, str(err))
                self._apply(self.coordinator.on_call_failed(sc, f"{instance}: {err}",
                                                            retryable=err.retryable))
                continue
            self._inflight.pop(sc, None)
            self._apply(self.coordinator.on_call_done(
                sc, output_tokens=result.completion_tokens, ttft_s=result.ttft_s,
                total_s=result.total_s, cached_tokens=result.cached_prompt_tokens))
            finished = self.clock.now()
            return CallOutcome(result=result, instance=instance, submitted=submitted,
                               started=min(finished, started + result.queue_s),
                               finished=finished, priority=priority)

    # ------------------------------------------------------------------ internals
    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            future = d.call.payload
            if future is None or future.done():
                continue
            if isinstance(d, StartCall):
                future.set_result((d.instance, d.priority))
            elif isinstance(d, FailCall):
                future.set_exception(BackendError(d.reason, retryable=False))

    def _take_down(self, instance: str, reason: str) -> None:
        if not self.coordinator.queues[instance].up:
            return
        self.down_reasons[instance] = reason
        self._apply(self.coordinator.on_instance_down(instance))
        for sc, task in list(self._inflight.items()):
            if sc.instance == instance and not task.done():
                self._moved.add(sc)
                task.cancel()
        if self.revive_after_s is not None:
            asyncio.get_running_loop().call_later(self.revive_after_s, self._revive, instance)

    def _revive(self, instance: str) -> None:
        self.down_reasons.pop(instance, None)
        self._apply(self.coordinator.on_instance_up(instance))


def _outer_cancelled() -> bool:
    task = asyncio.current_task()
    return bool(task is not None and task.cancelling())
