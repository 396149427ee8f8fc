"""``edf``: earliest query deadline first (queries without a deadline go last, FCFS)."""

from __future__ import annotations

import math

from agentflow.scheduler.policies.base import QueuePolicy


class EdfQueue(QueuePolicy):
    name = "edf"

    def key(self, call, now, view) -> tuple:
        return (call.deadline if call.deadline is not None else math.inf, call.ready_at)
