"""``earliest_finish``: the instance where the call is expected to finish first — its queue's
outstanding work ``W_i`` plus the call's own expected time there (the list-scheduling rule of
HEFT). ``least_loaded`` looks only at ``W_i`` and ``workload_balanced`` trades speed against
load with a tuned ``alpha``; here both are in the same unit (seconds on that instance), so no
weight is needed: a fast GPU wins until its queue is longer than the time it saves."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from agentflow.scheduler.policies.base import DispatchPolicy
from agentflow.scheduler.policies.lexmin import lexmin

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView


class EarliestFinishDispatch(DispatchPolicy):
    name = "earliest_finish"

    def finish_s(self, call: ScheduledCall, instances: list[str], now: float,
                 view: SchedulerView) -> tuple[np.ndarray, np.ndarray]:
        """(expected finish, name rank) on each of ``instances``."""
        work, times, names = view.dispatch_view(call, instances, now)
        return work + times, names

    def choose(self, call: ScheduledCall, instances: list[str], now: float,
               view: SchedulerView) -> str:
        finish, names = self.finish_s(call, instances, now, view)
        return instances[lexmin((names, finish))]
