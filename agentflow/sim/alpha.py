"""Tuning HexGen-Flow's ``alpha`` by replaying recent load in forked simulations.

``tune_alpha`` runs the same window of queries under each alpha of a grid on an idle cluster
and keeps the best by P95 latency or SLO attainment. ``OnlineAlphaTuner`` re-tunes inside a
long simulation from forks of the *live* state (backlog included), fed a forecast made of the
recent arrivals — the loop a real deployment runs on its own recorded traces.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from agentflow.metrics import Outcome, attainment, scale_key
from agentflow.sim.cluster import SimClusterConfig
from agentflow.sim.driver import QueryRecord
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
    """Re-tunes the running coordinator's alpha from forks of the live simulation.

    When: after every ``every_queries`` arrivals (or, with ``every_s``, every ``every_s`` of
    virtual time) — so it fires at any load, instead of waiting for a fixed time window to
    hold enough arrivals. What: each candidate alpha is tried on a *fork* of the live state
    (``Simulation.fork``: the backlog of waiting and running calls and the workflows in
    flight) that then receives a forecast of the next arrivals — the last
    ``window_queries`` queries (or those of the last ``window_s`` seconds, if more) again,
    with their recorded spacing. The score (P95 latency, or SLO attainment at ``slo_scale``)
    covers the backlog and the forecast queries together, so an alpha that drains a backlog
    badly loses even if it would suit an empty cluster. Nothing of the real future is used.
    """

    cluster: SimClusterConfig
    every_s: float | None = None
    window_s: float | None = None
    grid: tuple[float, ...] = DEFAULT_GRID
    metric: str = "p95"
    slo_scale: float = 2.0
    policy: str = "hexgen-flow"
    every_queries: int = 25
    window_queries: int = 25
    history: list[tuple[float, float]] = field(default_factory=list)

    def attach(self, sim, queries, arrivals, slo_s, idle) -> None:
        if self.metric not in ("p95", "slo"):
            raise ValueError("metric must be 'p95' or 'slo'")
        self.policy = sim.policy
        order = sorted(range(len(arrivals)), key=lambda i: arrivals[i])
        self._queries = [queries[i] for i in order]
        self._arrivals = [float(arrivals[i]) for i in order]
        self._slo = [float(slo_s[i]) for i in order]
        self._idle = [float(idle[i]) for i in order]
        if self.every_s is not None:
            end = self._arrivals[-1] if self._arrivals else 0.0
            t = self.every_s
            while t <= end:
                sim.schedule_hook(t, self._retune)
                t += self.every_s
        else:  # hooks run after the arrival at the same time (pushed later)
            for k in range(self.every_queries - 1, len(self._arrivals), self.every_queries):
                sim.schedule_hook(self._arrivals[k], self._retune)

    def _window(self, now: float) -> list[int]:
        arrived = bisect.bisect_right(self._arrivals, now)
        count = self.window_queries
        if self.window_s is not None:
            count = max(count, arrived - bisect.bisect_left(self._arrivals, now - self.window_s))
        return list(range(max(0, arrived - count), arrived))

    def _retune(self, sim) -> None:
        if not hasattr(sim.coordinator.dispatch, "alpha"):
            return  # the policy's dispatch has no alpha (e.g. flowsage's marginal_delay)
        now = sim.clock.now()
        window = self._window(now)
        if not window and not sim.pending_queries:
            return
        scores = {alpha: self._score(sim, alpha, window, now) for alpha in self.grid}
        best = min(self.grid, key=lambda a: (scores[a], abs(a - 0.5)))
        sim.coordinator.dispatch.alpha = best
        self.history.append((now, best))

    def _score(self, sim, alpha: float, window: list[int], now: float) -> float:
        fork = sim.fork()
        fork.coordinator.dispatch.alpha = alpha
        judged = fork.in_flight
        if window:
            t0 = self._arrivals[window[0]]
            gap = ((self._arrivals[window[-1]] - t0) / (len(window) - 1)
                   if len(window) > 1 else 0.0)
            for j, i in enumerate(window):
                record = QueryRecord(id=f"forecast{j}:{self._queries[i].id}",
                                     arrival=now + gap + self._arrivals[i] - t0,
                                     slo_s=self._slo[i], idle_latency_s=self._idle[i])
                fork.add_arrival(self._queries[i], record)
                judged.append(record)
        fork.drain()
        if self.metric == "slo":
            return -(attainment([Outcome.of(r) for r in judged], self.slo_scale) or 0.0)
        latencies = [r.latency_s for r in judged if r.latency_s is not None]
        if len(latencies) < len(judged):
            return float("inf")
        return float(np.percentile(latencies, 95))
