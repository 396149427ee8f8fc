"""``urgency``: HexGen-Flow's local priority — the call whose expected time most exceeds its
share of the query's remaining time runs first (see ``budget_and_urgency``).

With the share ``s = t / (t + downstream)`` fixed between the query's events,
``-urgency = budget - t = s * (D - now) - t`` is a line in time of slope ``s``: calls with a
large share of their query's remaining path grow urgent faster, and the kinetic queue
re-orders them exactly when their lines cross."""

from __future__ import annotations

from agentflow.scheduler.policies.base import QueuePolicy, stage_share
from agentflow.scheduler.ranking import Segment, flat


class UrgencyQueue(QueuePolicy):
    name = "urgency"
    time_dependent = True

    def rank(self, call, now, view):
        if call.deadline is None:
            return flat(1, call.ready_at)
        t, share = stage_share(call, now, view)
        return (Segment(float("-inf"), 0, share * call.deadline - t, share),)
