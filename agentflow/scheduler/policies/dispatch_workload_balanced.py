"""``workload_balanced``: HexGen-Flow's global dispatch.

    score_i = alpha * t(s, ref) / t(s, i) - (1 - alpha) * W_i / W_ref

``ref`` is the instance that would run the call fastest and ``W_i`` the live outstanding work
on ``i`` (it falls as calls finish). ``alpha = 1`` always picks the fastest hardware,
``alpha = 0`` the emptiest queue. When the reference instance is idle (``W_ref = 0``) the
loads are normalised by the call's own time on it instead, so the score stays finite and
still prefers the less loaded of two instances.
"""

from __future__ import annotations

from agentflow.scheduler.policies.base import DispatchPolicy


class WorkloadBalancedDispatch(DispatchPolicy):
    name = "workload_balanced"

    def __init__(self, alpha: float = 0.5):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha

    def scores(self, call, instances, now, view) -> dict[str, float]:
        times = {i: view.expected_s(call, i) for i in instances}
        ref = min(instances, key=lambda i: (times[i], i))
        loads = {i: view.outstanding_work(i, now) for i in instances}
        w_ref = loads[ref] if loads[ref] > 0 else max(times[ref], 1e-9)
        return {i: self.alpha * times[ref] / max(times[i], 1e-9)
                - (1 - self.alpha) * loads[i] / w_ref for i in instances}

    def choose(self, call, instances, now, view) -> str:
        scores = self.scores(call, instances, now, view)
        return max(instances, key=lambda i: (scores[i], -instances.index(i)))
