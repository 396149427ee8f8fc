"""``llf``: least laxity first — laxity is the query's slack, ``D - now - remaining critical
path``; the query closest to missing its deadline runs first."""

from __future__ import annotations

import math

from agentflow.scheduler.policies.base import QueuePolicy


class LlfQueue(QueuePolicy):
    name = "llf"
    time_dependent = True

    def key(self, call, now, view) -> tuple:
        if call.deadline is None:
            return (math.inf, call.ready_at)
        return (call.deadline - now - view.remaining_s(call.query, now), call.ready_at)
