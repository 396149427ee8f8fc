"""``workload_balanced``: HexGen-Flow's global dispatch.

    score_i = alpha * t(s, ref) / t(s, i) - (1 - alpha) * W_i / W_ref

``ref`` is the instance that would run the call fastest and ``W_i`` the live outstanding work
on ``i`` (it falls as calls finish). ``alpha = 1`` always picks the fastest hardware,
``alpha = 0`` the emptiest queue. When the reference instance is idle (``W_ref = 0``) the
loads are normalised by the call's own time on it instead, so the score stays finite and
still prefers the less loaded of two instances.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from agentflow.scheduler.policies.base import DispatchPolicy
from agentflow.scheduler.policies.lexmin import lexmin

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView


class WorkloadBalancedDispatch(DispatchPolicy):
    name = "workload_balanced"

    def __init__(self, alpha: float = 0.5):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha

    def scores(self, call: ScheduledCall, instances: list[str], now: float,
               view: SchedulerView) -> dict[str, float]:
        return dict(zip(instances, self._scores(call, instances, now, view).tolist()))

    def _scores(self, call: ScheduledCall, instances: list[str], now: float,
                view: SchedulerView) -> np.ndarray:
        loads, times, names = view.dispatch_view(call, instances, now)
        ref = lexmin((names, times))
        w_ref = loads[ref] if loads[ref] > 0 else max(times[ref], 1e-9)
        scores: np.ndarray = (self.alpha * times[ref] / np.maximum(times, 1e-9)
                              - (1 - self.alpha) * loads / w_ref)
        return scores

    def choose(self, call: ScheduledCall, instances: list[str], now: float,
               view: SchedulerView) -> str:
        return instances[int(np.argmax(self._scores(call, instances, now, view)))]
