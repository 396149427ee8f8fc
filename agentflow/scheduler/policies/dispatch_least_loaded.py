"""``least_loaded``: the instance with the least outstanding expected work ``W_i`` (seconds,
so a fast GPU's queue counts for less); ties go to the instance that runs the call faster."""

from __future__ import annotations

from agentflow.scheduler.policies.base import DispatchPolicy


class LeastLoadedDispatch(DispatchPolicy):
    name = "least_loaded"

    def choose(self, call, instances, now, view) -> str:
        return min(instances, key=lambda i: (view.outstanding_work(i, now),
                                             view.expected_s(call, i), i))
