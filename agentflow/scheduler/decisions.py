"""What the coordinator's events answer with: start a call on an instance, fail a call, stop
a running call to make room for a better class (``PreemptCall``), or (raised) refuse a query
at admission. Kept apart from the coordinator so the runtimes, the
observers and the views can name them without importing the event machinery."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.scheduler.call import ScheduledCall


@dataclass(frozen=True)
class StartCall:
    """Run ``call`` on ``instance``; ``attempt``: its run (``preemptions`` so far), so a
    start that a ``PreemptCall`` for the same run follows in one answer is known stale."""

    call: ScheduledCall
    instance: str
    priority: int
    attempt: int = 0


@dataclass(frozen=True)
class FailCall:
    call: ScheduledCall
    reason: str


@dataclass(frozen=True)
class PreemptCall:
    """Stop ``call`` on ``instance`` now (``scheduler.preemption``): the coordinator has
    already put it back in a queue, so the runtime only aborts the attempt there and drops
    whatever that attempt still reports; the call runs again from its prompt when admitted.
    ``attempt``: which run of the call is stopped (its ``preemptions`` count before this one),
    so a runtime tells that run's late reports from the redo's."""

    call: ScheduledCall
    instance: str
    attempt: int


Decision = StartCall | FailCall | PreemptCall


class QueryRejected(RuntimeError):
    """Admission refused (overload); ``retry_after_s`` estimates when to try again."""

    def __init__(self, reason: str, retry_after_s: float = 1.0):
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
