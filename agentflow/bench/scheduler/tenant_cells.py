"""A few cells of the tenant grid, with what the grid's table leaves out: each tenant's
longest wait (max latency) and its share of instance time.

    agentflow bench tenant_cells [--clusters paper-4gpu,hetero-8,mixed-qwen]
        [--scenarios isolation-2x,fairness] [--policies flowsage] [--l1-from TENANTS_JSON]
        [--weights heavy=2,light=1] [--json OUT]

Why a separate script: ``policy_suite.py --tenants`` runs every scenario and policy (about 15
minutes here) and reports P95 only; checking one change to the queue order (within-class
starvation: the batch tenant's *max* latency; tenant weights: instance seconds per tenant)
needs the same cells, the same workloads and two more numbers. The cells are the grid's own
(``policy_suite.tenant_scenarios``, trace1, span 80 queries per 1 x L1, seed 1 as
the grid's default, so its flowsage figures are the grid's to the digit). ``--l1-from``
reuses the L1 rates of an earlier grid's ``tenants.json`` (the L1 search is the slow part);
without it they are searched as the grid does.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.scheduler.policy_suite import (
    cluster_named,
    find_l1,
    tenant_scenarios,
    workloads,
)
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS, parse_fast_lane
from agentflow.sim.driver import Simulation, StageTiming
from agentflow.sim.experiment import build_tenant_workload, reference_latencies
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import TenantSpec

SPAN = 80  # queries of a tenant at 1 x L1, as the full grid


def tenant_figures(records: list[Any], busy: dict[str, float],
                   stages: list[StageTiming] | None = None,
                   summary: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Per tenant: queries, completed, P95 and max latency, instance seconds; with
    ``stages``, where its LLM stages spent their time (mean queue and run seconds) and on
    which instances."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({r.tenant for r in records if r.tenant is not None}):
        mine = [r for r in records if r.tenant == name]
        lat = [r.latency_s for r in mine if r.status == "done" and r.latency_s is not None]
        out[name] = {"queries": len(mine), "completed": len(lat),
                     "p95": float(np.percentile(lat, 95)) if lat else None,
                     "max": max(lat) if lat else None,
                     "instance_s": busy.get(name, 0.0)}
        if summary is not None:  # the grid's own throughput figure (answers per second)
            out[name]["qps"] = summary["tenants"][name]["throughput_qps"]
            out[name]["preempted_calls"] = summary["tenants"][name].get("preempted_calls")
        if stages is not None:
            ids = {r.id for r in mine}
            llm = [st for st in stages if st.kind == "llm" and st.query_id in ids]
            if llm:
                out[name]["queue_s"] = float(np.mean([st.queue_s for st in llm]))
                out[name]["run_s"] = float(np.mean([st.run_s for st in llm]))
                where: dict[str, int] = {}
                for st in llm:
                    where[str(st.instance)] = where.get(str(st.instance), 0) + 1
                out[name]["instances"] = dict(sorted(where.items()))
    return out


def run_cell(cluster_name: str, scenario: list[TenantSpec], policy: str, seed: int,
             quantum_s: float | None = None, detail: bool = False,
             preemption: str | None = None, lag_cap_quanta: float | None = None,
             fast_lane: int | None = FAST_LANE_CALLS) -> dict[str, dict[str, Any]]:
    cluster = cluster_named(cluster_name)
    idle = IdleLatency(cluster)
    wl = build_tenant_workload(workloads()["trace1"], cluster, scenario, n=SPAN, seed=seed,
                               idle=idle)
    stages: list[StageTiming] = []
    sim = Simulation(cluster, policy, on_stage=stages.append,  # as run_policy builds it
                     preemption=preemption, fast_lane=fast_lane)
    if wl.tenant_weights:
        sim.coordinator.fairness.set_weights(wl.tenant_weights)
    if quantum_s is not None:
        sim.coordinator.fairness.quantum_s = quantum_s
    if lag_cap_quanta is not None:
        sim.coordinator.fairness.lag_cap_quanta = lag_cap_quanta
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s,
                     tenants=wl.tenants, classes=wl.classes)
    owner = {r.id: r.tenant for r in result.records}
    busy: dict[str, float] = {}
    for st in stages:
        name = owner.get(st.query_id)
        if st.kind == "llm" and name is not None:
            busy[name] = busy.get(name, 0.0) + st.run_s
    return tenant_figures(result.records, busy, stages if detail else None, result.summary())


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--clusters", "paper-4gpu", "--scenarios", "isolation-2x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clusters", default="paper-4gpu,hetero-8,mixed-qwen")
    p.add_argument("--scenarios", default="isolation-1.5x,isolation-2x,fairness,light-alone")
    p.add_argument("--policies", default="flowsage")
    p.add_argument("--l1-from", type=Path, help="an earlier grid's tenants.json (its L1s)")
    p.add_argument("--weights", default="",
                   help="NAME=WEIGHT,... tenant weights to put on the scenarios' tenants")
    p.add_argument("--quantum", type=float, help="fairness quantum_s (default: the module's)")
    p.add_argument("--lag-cap", type=float,
                   help="fairness lag_cap_quanta (default: the module's; 0: start-time FQ)")
    p.add_argument("--detail", action="store_true",
                   help="also each tenant's mean queue / run seconds per LLM stage, instances")
    p.add_argument("--fast-lane", type=parse_fast_lane, default=FAST_LANE_CALLS,
                   metavar="N|off",
                   help="scheduler.fast_lane: calls an outranked tenant may run on the "
                        f"fastest instance, or off (default {FAST_LANE_CALLS})")
    p.add_argument("--preemption", default="auto",
                   help="scheduler.preemption: auto (the default: fair under flowsage) | off "
                        "| class | fair")
    p.add_argument("--seed", type=int, default=1)  # policy_suite.py's default
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    weights = {k: float(v) for k, v in (w.split("=") for w in args.weights.split(",") if w)}
    known = json.loads(args.l1_from.read_text())["l1"] if args.l1_from else {}
    trace = workloads()["trace1"]
    out: dict[str, Any] = {}
    for name in args.clusters.split(","):
        cluster = cluster_named(name)
        idle = IdleLatency(cluster)
        l1 = known.get(f"trace1/{name}") or find_l1(
            trace, cluster, idle, max(60, 8 * len(cluster.expanded())), args.seed)
        slo = 2.0 * float(np.mean(list(reference_latencies(trace, idle).values())))
        scen = tenant_scenarios(l1, slo, SPAN)
        for sname in args.scenarios.split(","):
            tenants = scen[sname]
            if weights:
                tenants = [TenantSpec(t.name, t.rate, t.slo_s, t.slo_class, t.queries,
                                      weight=weights.get(t.name, 1.0)) for t in tenants]
            for policy in args.policies.split(","):
                t0 = time.perf_counter()
                figs = run_cell(name, tenants, policy, args.seed, args.quantum, args.detail,
                                args.preemption, args.lag_cap, args.fast_lane)
                out[f"{name}/{sname}/{policy}"] = figs
                print(f"{name:<11} {sname:<15} {policy:<10} " + "  ".join(
                    f"{t}: p95={f['p95']:.1f} max={f['max']:.1f} "
                    f"done={f['completed']}/{f['queries']} qps={f['qps']:.4g} "
                    f"inst_s={f['instance_s']:.0f}"
                    + (f" queue={f['queue_s']:.2f} run={f['run_s']:.2f} {f['instances']}"
                       if "queue_s" in f else "")
                    for t, f in figs.items()) + f" ({time.perf_counter() - t0:.0f}s)",
                    flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
