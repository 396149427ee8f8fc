"""Tuning HexGen-Flow's ``alpha`` by replaying recent load in forked simulations.

``tune_alpha`` runs the same window of queries under each alpha of a grid and keeps the best
by P95 latency or SLO attainment. ``OnlineAlphaTuner`` does that periodically inside a long
simulation: every ``every_s`` of virtual time it forks the last ``window_s`` of arrivals,
tunes, and sets the running coordinator's alpha — the loop a real deployment runs on its own
recorded traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentflow.metrics import scale_key
from agentflow.sim.cluster import SimClusterConfig
from agentflow.sim.experiment import Workload, run_policy

DEFAULT_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


def tune_alpha(cluster: SimClusterConfig, workload: Workload, *, policy: str = "hexgen-flow",
               grid=DEFAULT_GRID, metric: str = "p95", slo_scale: float = 2.0
               ) -> tuple[float, dict[float, float]]:
    """The alpha with the best ``metric`` ("p95": lowest; "slo": highest attainment at
    ``slo_scale``) on ``workload``, and every alpha's score."""
    if metric not in ("p95", "slo"):
        raise ValueError("metric must be 'p95' or 'slo'")
    scores: dict[float, float] = {}
    for alpha in grid:
        s = run_policy(cluster, workload, policy, slo_scale=slo_scale, alpha=alpha).summary(
            (slo_scale,))
        if metric == "p95":
            scores[alpha] = s["p95"] if s["p95"] is not None else float("inf")
        else:
            scores[alpha] = -(s["slo_attainment"][scale_key(slo_scale)] or 0.0)
    best = min(grid, key=lambda a: (scores[a], abs(a - 0.5)))
    return best, ({a: -v for a, v in scores.items()} if metric == "slo" else scores)


@dataclass
class OnlineAlphaTuner:
    cluster: SimClusterConfig
    every_s: float = 60.0
    window_s: float = 60.0
    grid: tuple[float, ...] = DEFAULT_GRID
    metric: str = "p95"
    slo_scale: float = 2.0
    policy: str = "hexgen-flow"
    history: list[tuple[float, float]] = field(default_factory=list)

    def attach(self, sim, queries, arrivals, slo_s, idle) -> None:
        self.policy = sim.policy
        self._workload = Workload(list(queries), list(arrivals), list(idle))
        end = max(arrivals) if len(arrivals) else 0.0
        t = self.every_s
        while t <= end:
            sim.schedule_hook(t, self._retune)
            t += self.every_s

    def _retune(self, sim) -> None:
        now = sim.clock.now()
        window = self._workload.window(now - self.window_s, now)
        if len(window.queries) < 5:
            return
        best, _ = tune_alpha(self.cluster, window, policy=self.policy, grid=self.grid,
                             metric=self.metric, slo_scale=self.slo_scale)
        sim.coordinator.dispatch.alpha = best
        self.history.append((now, best))
