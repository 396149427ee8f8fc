"""``fcfs``: first come, first served — the order calls became ready."""

from __future__ import annotations

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import flat


class FcfsQueue(QueuePolicy):
    name = "fcfs"
    query_dependent = False

    def rank(self, call, now, view):
        return flat(0, call.ready_at)
