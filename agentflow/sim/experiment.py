"""Experiments: one workload, several policies, side by side — and goodput search."""

from __future__ import annotations

import zlib
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
from agentflow.sim.workload import TenantSpec, TraceQuery, arrival_times

# What deadline each query is given (``Workload.deadlines``):
# * ``fixed`` (default): what serving gets — one ``slo_seconds`` per pipeline, the same for
#   every query of it: ``slo_scale`` x the pipeline's reference latency (``reference_s``);
# * ``idle-scaled``: ``slo_scale`` x the query's own idle latency (HexGen-Flow's per-query
#   SLO). It is derived from the query's true size, which no serving scheduler knows — an
#   option for comparison with the papers, not the default.
DEADLINES = ("fixed", "idle-scaled")
DEFAULT_DEADLINE = "fixed"


@dataclass
class Workload:
    queries: list[TraceQuery]
    arrivals: list[float]
    idle_latency_s: list[float]
    # Each query's pipeline's reference latency: the mean idle latency of that pipeline's
    # queries in the whole trace (``reference_latencies``) — a property of the pipeline on
    # this cluster, the same for every query of it, never the query's own size.
    reference_s: list[float]
    # Shared-cluster runs (``build_tenant_workload``): who sent each query, its SLO class and
    # the deadline its tenant gives it (None: its class's default). None for one-tenant runs.
    tenants: list[str] | None = None
    classes: list[str | None] | None = None
    tenant_slo_s: list[float | None] | None = None
    tenant_weights: dict[str, float] | None = None  # share weights other than 1, by tenant

    def deadlines(self, slo_scale: float, deadline: str = DEFAULT_DEADLINE
                  ) -> list[float | None]:
        """Seconds after arrival each query is given (see ``DEADLINES``); a tenant's own
        deadline where the workload has tenants (None: the class decides)."""
        if self.tenant_slo_s is not None:
            return list(self.tenant_slo_s)
        if deadline == "fixed":
            return [slo_scale * t for t in self.reference_s]
        if deadline == "idle-scaled":
            return [slo_scale * t for t in self.idle_latency_s]
        raise ValueError(f"unknown deadline {deadline!r}; choose from {', '.join(DEADLINES)}")


def pipeline_of(query: TraceQuery) -> str:
    """The pipeline a recorded query ran (one per trace unless its records say)."""
    return str(query.meta.get("kind") or query.meta.get("pipeline") or "")


def reference_latencies(trace: list[TraceQuery], idle: IdleLatency) -> dict[str, float]:
    """Mean idle latency per pipeline over every query of ``trace``.

    Why this reference: serving gives a query one ``slo_seconds`` chosen for its pipeline,
    before anything about the query is known; an operator picks it from how long the
    pipeline takes on the cluster when it is not loaded. The mean over the whole trace (not
    the queries drawn for one run) is that number, and it is the same for every query of the
    pipeline — short queries get slack, long ones little, as in serving."""
    groups: dict[str, list[float]] = {}
    for q in trace:
        groups.setdefault(pipeline_of(q), []).append(idle.query_s(q))
    return {k: float(np.mean(v)) for k, v in groups.items()}


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
    reference = reference_latencies(trace, idle)
    return Workload(queries, [float(t) for t in arrival_times(n, rate, arrival, seed=seed)],
                    [idle.query_s(q) for q in queries],
                    [reference[pipeline_of(q)] for q in queries])


def tenant_seed(seed: int, name: str) -> int:
    """A tenant's own seed, from the run's seed and the tenant's name: a tenant draws the
    same queries at the same times whoever else shares the cluster, so "alone" and "beside
    a flood" compare the same queries."""
    return int(np.random.SeedSequence([seed, zlib.crc32(name.encode())]).generate_state(1)[0])


def build_tenant_workload(trace: list[TraceQuery], cluster: SimClusterConfig,
                          tenants: Sequence[TenantSpec], *, n: int, arrival: str = "poisson",
                          seed: int = 0, idle: IdleLatency | None = None) -> Workload:
    """``n`` queries per tenant (or the tenant's own ``queries``), each tenant drawing from
    ``trace`` with its own arrivals at its own rate (``tenant_seed``), merged in arrival
    order (ties: tenant order, then the tenant's own order)."""
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"tenant names must be unique: {names}")
    if not tenants:
        raise ValueError("no tenants")
    idle = idle or IdleLatency(cluster)
    rows: list[tuple[float, int, int, TraceQuery, float, float, TenantSpec]] = []
    for ti, spec in enumerate(tenants):
        part = build_workload(trace, cluster, n=spec.queries or n, rate=spec.rate,
                              arrival=arrival, seed=tenant_seed(seed, spec.name), idle=idle)
        rows += [(t, ti, i, q, il, ref, spec) for i, (q, t, il, ref) in enumerate(
            zip(part.queries, part.arrivals, part.idle_latency_s, part.reference_s))]
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return Workload([r[3] for r in rows], [r[0] for r in rows], [r[4] for r in rows],
                    [r[5] for r in rows], tenants=[r[6].name for r in rows],
                    classes=[r[6].slo_class for r in rows],
                    tenant_slo_s=[r[6].slo_s for r in rows],
                    tenant_weights={t.name: t.weight for t in tenants if t.weight != 1.0})


def run_policy(cluster: SimClusterConfig, workload: Workload, policy: str, *,
               slo_scale: float = 2.0, alpha: float | None = None, alpha_tuner: Any = None,
               embedder: str = "hashing", cached_prefix: float | str = 0.0,
               faults: Sequence[Fault] = (), deadline: str = DEFAULT_DEADLINE,
               **scheduler: Any) -> SimResult:
    """``deadline``: how each query's deadline is set (``DEADLINES``); ``scheduler``: more
    ``Simulation`` settings (admission, SLO classes)."""
    sim = Simulation(cluster, policy, alpha=alpha, alpha_tuner=alpha_tuner, embedder=embedder,
                     cached_prefix=cached_prefix, faults=faults, **scheduler)
    if workload.tenant_weights:
        sim.coordinator.fairness.set_weights(workload.tenant_weights)
    return sim.run(workload.queries, workload.arrivals,
                   workload.deadlines(slo_scale, deadline), workload.idle_latency_s,
                   tenants=workload.tenants, classes=workload.classes)


def goodput(cluster: SimClusterConfig, trace: list[TraceQuery], policy: str, *, n: int,
            slo_scale: float, target: float = GOODPUT_TARGET, arrival: str = "poisson",
            seed: int = 0,
            low: float = 0.001, high: float | None = None, iterations: int = 7,
            idle: IdleLatency | None = None, cached_prefix: float = 0.0,
            deadline: str = DEFAULT_DEADLINE, **scheduler: Any) -> float:
    """The highest rate (queries/s) at which at least ``target`` of queries meet
    ``slo_scale`` x their idle latency — found by doubling then bisection. The criterion is
    the report's (``agentflow.metrics``); ``deadline`` is what the scheduler is told;
    ``scheduler``: more ``Simulation`` settings (e.g. sharded coordinators)."""
    idle = idle or IdleLatency(cluster, cached_prefix=cached_prefix)

    def ok(rate: float) -> bool:
        wl = build_workload(trace, cluster, n=n, rate=rate, arrival=arrival, seed=seed,
                            idle=idle)
        result = run_policy(cluster, wl, policy, slo_scale=slo_scale,
                            cached_prefix=cached_prefix, deadline=deadline, **scheduler)
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


class NoLoadLevel(RuntimeError):
    """No rate the load search may try doubles vllm's P95 with this many queries: the run
    is too short to load the cluster (e.g. short queries on a large cluster)."""


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
            raise NoLoadLevel(f"vllm's P95 never doubled with {n} queries on "
                               f"{cluster.name}: use more queries for the search")
        low, high = high, high * 2
    for _ in range(iterations):
        mid = (low + high) / 2
        low, high = (low, mid) if p95(mid) >= target else (mid, high)
    return high
