"""Experiments: one workload, several policies, side by side — and goodput search."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow.metrics import GOODPUT_TARGET, meets_goodput_target
from agentflow.sim.cluster import SimClusterConfig
from agentflow.sim.driver import SimResult, Simulation
from agentflow.sim.faults import Fault
from agentflow.sim.slo import IdleLatency
from agentflow.sim.summary import outcomes
from agentflow.sim.workload import TraceQuery, arrival_times


@dataclass
class Workload:
    queries: list[TraceQuery]
    arrivals: list[float]
    idle_latency_s: list[float]

    def deadlines(self, slo_scale: float) -> list[float]:
        return [slo_scale * t for t in self.idle_latency_s]


def build_workload(trace: list[TraceQuery], cluster: SimClusterConfig, *, n: int, rate: float,
                   arrival: str = "poisson", seed: int = 0,
                   idle: IdleLatency | None = None) -> Workload:
    """``n`` queries drawn from ``trace`` (seeded, with replacement once the trace runs out)
    arriving by ``arrival`` at ``rate`` queries/s."""
    if not trace:
        raise ValueError("the trace has no queries")
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(len(trace)))
    while len(order) < n:
        order += list(rng.permutation(len(trace)))
    queries = [trace[i] for i in order[:n]]
    idle = idle or IdleLatency(cluster)
    return Workload(queries, [float(t) for t in arrival_times(n, rate, arrival, seed=seed)],
                    [idle.query_s(q) for q in queries])


def run_policy(cluster: SimClusterConfig, workload: Workload, policy: str, *,
               slo_scale: float = 2.0, alpha: float | None = None, alpha_tuner: Any = None,
               embedder: str = "hashing", cached_prefix: float | str = 0.0,
               faults: Sequence[Fault] = ()) -> SimResult:
    sim = Simulation(cluster, policy, alpha=alpha, alpha_tuner=alpha_tuner, embedder=embedder,
                     cached_prefix=cached_prefix, faults=faults)
    return sim.run(workload.queries, workload.arrivals, workload.deadlines(slo_scale),
                   workload.idle_latency_s)


def goodput(cluster: SimClusterConfig, trace: list[TraceQuery], policy: str, *, n: int,
            slo_scale: float, target: float = GOODPUT_TARGET, arrival: str = "poisson",
            seed: int = 0,
            low: float = 0.001, high: float | None = None, iterations: int = 7,
            idle: IdleLatency | None = None, cached_prefix: float = 0.0) -> float:
    """The highest rate (queries/s) at which at least ``target`` of queries meet
    ``slo_scale`` x their idle latency — found by doubling then bisection."""
    idle = idle or IdleLatency(cluster, cached_prefix=cached_prefix)

    def ok(rate: float) -> bool:
        wl = build_workload(trace, cluster, n=n, rate=rate, arrival=arrival, seed=seed,
                            idle=idle)
        result = run_policy(cluster, wl, policy, slo_scale=slo_scale,
                            cached_prefix=cached_prefix)
        return meets_goodput_target(outcomes(result), slo_scale, target)

    if not ok(low):
        return 0.0
    hi = high or low * 2
    while ok(hi):
        low, hi = hi, hi * 2
        if hi > 1e4:
            return hi
    for _ in range(iterations):
        mid = (low + hi) / 2
        low, hi = (mid, hi) if ok(mid) else (low, mid)
    return low


def loaded_rate(cluster: SimClusterConfig, trace: list[TraceQuery], idle: IdleLatency, *,
                n: int, seed: int, idle_rate: float, low: float, high: float,
                iterations: int, slo_scale: float = 2.0, cached_prefix: float | str = 0.0,
                max_high: float | None = None) -> float:
    """The benchmarks' load level L1: the lowest rate at which ``vllm``'s P95 is at least
    twice its P95 at ``idle_rate`` (an idle cluster) — doubling ``(low, high)`` until
    ``high`` loads it, then ``iterations`` bisection steps; returns the loaded end. Past
    ``max_high`` the run of ``n`` queries is taken as too short to load the cluster."""
    def p95(rate: float) -> float:
        wl = build_workload(trace, cluster, n=n, rate=rate, seed=seed, idle=idle)
        return run_policy(cluster, wl, "vllm", slo_scale=slo_scale,
                          cached_prefix=cached_prefix).summary()["p95"]

    target = 2 * p95(idle_rate)
    while p95(high) < target:
        if max_high is not None and high > max_high:
            raise RuntimeError(f"vllm's P95 never doubled with {n} queries on "
                               f"{cluster.name}: use more queries for the search")
        low, high = high, high * 2
    for _ in range(iterations):
        mid = (low + high) / 2
        low, high = (low, mid) if p95(mid) >= target else (mid, high)
    return high
