"""``edf``: earliest query deadline first (queries without a deadline go last, FCFS)."""

from __future__ import annotations

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import flat


class EdfQueue(QueuePolicy):
    name = "edf"
    query_dependent = False

    def rank(self, call, now, view):
        if call.deadline is None:
            return flat(1, call.ready_at)
        return flat(0, call.deadline)
