"""``edf``: earliest query deadline first (queries without a deadline go last, FCFS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import flat

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key


class EdfQueue(QueuePolicy):
    name = "edf"
    query_dependent = False

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        if call.deadline is None:
            return flat(1, call.ready_at)
        return flat(0, call.deadline)
