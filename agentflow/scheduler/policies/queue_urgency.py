"""``urgency``: HexGen-Flow's local priority — the call whose expected time most exceeds its
share of the query's remaining time runs first (see ``budget_and_urgency``).

With the share ``s = t / (t + downstream)`` fixed between the query's events,
``-urgency = budget - t = s * (D - now) - t`` is a line in time of slope ``s``: calls with a
large share of their query's remaining path grow urgent faster, and the kinetic queue
re-orders them exactly when their lines cross."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import QueuePolicy, stage_share
from agentflow.scheduler.ranking import Segment, flat

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key


class UrgencyQueue(QueuePolicy):
    name = "urgency"

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        if call.deadline is None:
            return flat(1, call.ready_at)
        t, share = stage_share(call, now, view)
        return (Segment(float("-inf"), 0, share * call.deadline - t, share),)
