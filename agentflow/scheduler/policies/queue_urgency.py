"""``urgency``: HexGen-Flow's local priority — the call whose expected time most exceeds its
share of the query's remaining time runs first (see ``budget_and_urgency``)."""

from __future__ import annotations

import math

from agentflow.scheduler.policies.base import QueuePolicy, budget_and_urgency


class UrgencyQueue(QueuePolicy):
    name = "urgency"
    time_dependent = True

    def key(self, call, now, view) -> tuple:
        bu = budget_and_urgency(call, now, view)
        if bu is None:
            return (math.inf, call.ready_at)
        return (-bu[1], call.ready_at)
