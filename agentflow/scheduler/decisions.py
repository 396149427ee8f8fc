"""What the coordinator's events answer with: start a call on an instance, fail a call, or
(raised) refuse a query at admission. Kept apart from the coordinator so the runtimes, the
observers and the views can name them without importing the event machinery."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.scheduler.call import ScheduledCall


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


class QueryRejected(RuntimeError):
    """Admission refused (overload); ``retry_after_s`` estimates when to try again."""

    def __init__(self, reason: str, retry_after_s: float = 1.0):
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s
