"""``fcfs``: first come, first served — the order calls became ready."""

from __future__ import annotations

from agentflow.scheduler.policies.base import QueuePolicy


class FcfsQueue(QueuePolicy):
    name = "fcfs"

    def key(self, call, now, view) -> tuple:
        return (call.ready_at,)
