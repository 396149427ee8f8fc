"""``fcfs``: first come, first served — the order calls became ready."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import flat

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key


class FcfsQueue(QueuePolicy):
    name = "fcfs"
    query_dependent = False

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        return flat(0, call.ready_at)
