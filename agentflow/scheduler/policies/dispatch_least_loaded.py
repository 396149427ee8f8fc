"""``least_loaded``: the instance with the least outstanding expected work ``W_i`` (seconds,
so a fast GPU's queue counts for less); ties go to the instance that runs the call faster,
then to the first name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import DispatchPolicy
from agentflow.scheduler.policies.lexmin import lexmin

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView


class LeastLoadedDispatch(DispatchPolicy):
    name = "least_loaded"

    def choose(self, call: ScheduledCall, instances: list[str], now: float,
               view: SchedulerView) -> str:
        work, times, names = view.dispatch_view(call, instances, now)
        return instances[lexmin((names, times, work))]
