"""The small seeded scenarios that equivalence tests replay twice (a shortcut on, then off)
and compare record by record: one place, so each such test exercises the same load shapes —
calls that wait, two tenants with preemption, an instance that goes down and comes back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentflow.sim.cluster import SimClusterConfig, load_cluster
from agentflow.sim.driver import SimResult, Simulation
from agentflow.sim.experiment import Workload, build_tenant_workload, build_workload
from agentflow.sim.faults import Fault
from agentflow.sim.workload import TenantSpec
from tests.sim.test_driver import small_trace


@dataclass(frozen=True)
class Scenario:
    cluster: SimClusterConfig
    workload: Workload
    faults: list[Fault]

    def simulation(self, policy: str) -> Simulation:
        return Simulation(self.cluster, policy, faults=self.faults)

    def run(self, sim: Simulation) -> SimResult:
        wl = self.workload
        return sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s,
                       tenants=wl.tenants, classes=wl.classes)


def small_scenario(tenants: bool, faults: bool, rate: float = 3.0) -> Scenario:
    """paper-4gpu under 60 queries of the small trace at ``rate`` (or 30 queries of two
    tenants, an interactive one beside a batch flood); ``faults``: its first instance goes
    down at 6 s and comes back at 14 s."""
    cluster, trace = load_cluster("paper-4gpu"), small_trace()
    if tenants:
        wl = build_tenant_workload(trace, cluster, [
            TenantSpec("ui", 1.5, 40.0, "interactive"), TenantSpec("eval", 3.0, None, "batch")],
            n=30, seed=2)
    else:
        wl = build_workload(trace, cluster, n=60, rate=rate, seed=2)
    names = [name for name, _ in cluster.expanded()]
    fault = [Fault(6.0, names[0], "down"), Fault(14.0, names[0], "up")] if faults else []
    return Scenario(cluster, wl, fault)


def record_rows(result: SimResult) -> list[tuple[Any, ...]]:
    """Every query's record to the last float, then the event count."""
    rows: list[tuple[Any, ...]] = [(r.id, r.status, r.finish, r.calls, r.reason, r.preemptions)
                                   for r in result.records]
    return rows + [("events", result.events)]
