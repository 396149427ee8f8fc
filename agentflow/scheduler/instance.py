"""One instance's local queue: waiting calls in policy order, admitted up to capacity."""

from __future__ import annotations

import heapq

from agentflow.scheduler.call import CallState, ScheduledCall
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.policies.base import QueuePolicy, SchedulerView


class InstanceQueue:
    """Waiting and running calls of one instance.

    Static-key policies (fcfs, edf, gittins) keep a heap, so admission is O(log n); policies
    whose keys move with time (llf, urgency, flowsage) rank the waiting calls afresh at each
    admission, O(n), which is what keeps their budgets current.
    """

    def __init__(self, spec: InstanceSpec, policy: QueuePolicy):
        self.spec = spec
        self.policy = policy
        self.up = True
        self.waiting: set[ScheduledCall] = set()
        self.running: set[ScheduledCall] = set()
        self._heap: list[tuple[tuple, int, ScheduledCall]] = []
        self._admitted = 0
        self.kv_tokens_in_use = 0
        # Token totals of the waiting calls: with a time model linear in tokens they give the
        # queue's expected work in O(1) instead of a pass over thousands of calls.
        self.waiting_prompt_tokens = 0.0
        self.waiting_output_tokens = 0.0

    @property
    def name(self) -> str:
        return self.spec.name

    def enqueue(self, call: ScheduledCall, now: float, view: SchedulerView) -> None:
        call.instance = self.name
        call.state = CallState.WAITING
        self.waiting.add(call)
        self._account(call, +1)
        if not self.policy.time_dependent:
            heapq.heappush(self._heap, (self.policy.key(call, now, view), call.seq, call))

    def remove(self, call: ScheduledCall) -> None:
        """Forget a waiting call (cancelled or moved); heap entries are dropped lazily."""
        if call in self.waiting:
            self.waiting.discard(call)
            self._account(call, -1)

    def admit(self, now: float, view: SchedulerView, kv_tokens) -> list[ScheduledCall]:
        """Start waiting calls in queue order while capacity allows; each gets its admission
        number as the backend priority (vLLM: lower runs earlier)."""
        started: list[ScheduledCall] = []
        pending_limit = self.spec.max_pending_prefill
        while self.up and self.waiting and len(self.running) < self.spec.max_inflight:
            if pending_limit is not None and self.pending_prefill() >= pending_limit:
                break  # admit more once an admitted call produces its first token
            call = self._peek(now, view)
            need = kv_tokens(call)
            budget = self.spec.kv_token_budget
            if budget is not None and self.running and self.kv_tokens_in_use + need > budget:
                break  # wait for memory; an empty instance always admits one call
            self._pop(call)
            call.state = CallState.RUNNING
            call.started_at = now
            call.priority = self._admitted
            self._admitted += 1
            self.running.add(call)
            self.kv_tokens_in_use += need
            started.append(call)
        return started

    def pending_prefill(self) -> int:
        """Admitted calls that have not produced a token yet."""
        return sum(1 for c in self.running if c.attained_tokens == 0)

    def finish(self, call: ScheduledCall, kv_tokens: int) -> None:
        if call in self.running:
            self.running.discard(call)
            self.kv_tokens_in_use = max(0, self.kv_tokens_in_use - kv_tokens)

    def ordered_waiting(self, now: float, view: SchedulerView) -> list[ScheduledCall]:
        """Waiting calls in the order they would be admitted (for inspection and tests)."""
        return sorted(self.waiting, key=lambda c: (self.policy.key(c, now, view), c.seq))

    def _peek(self, now: float, view: SchedulerView) -> ScheduledCall:
        if self.policy.time_dependent:
            return min(self.waiting, key=lambda c: (self.policy.key(c, now, view), c.seq))
        while self._heap[0][2] not in self.waiting:
            heapq.heappop(self._heap)
        return self._heap[0][2]

    def _account(self, call: ScheduledCall, sign: int) -> None:
        self.waiting_prompt_tokens += sign * call.tokens_on(self.name)
        self.waiting_output_tokens += sign * call.mean_output

    def _pop(self, call: ScheduledCall) -> None:
        self.remove(call)
        if not self.policy.time_dependent and self._heap and self._heap[0][2] is call:
            heapq.heappop(self._heap)
