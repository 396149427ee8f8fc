"""``llf``: least laxity first — laxity is the query's slack, ``D - now - remaining critical
path``; the query closest to missing its deadline runs first.

The remaining path is the one computed at the query's last event, so every waiting call's
laxity falls at the same rate (slope 1) and the order changes only at events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import Segment, flat

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key


class LlfQueue(QueuePolicy):
    name = "llf"
    per_query = True

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        if call.deadline is None:
            return flat(1, call.ready_at)
        return (Segment(float("-inf"), 0, call.deadline - view.remaining_s(call.query, now),
                        1.0),)
