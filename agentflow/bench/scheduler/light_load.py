"""Does light load go to slow GPUs? An interactive tenant alone and beside a batch flood on a
heterogeneous cluster: its P95 and where its calls ran, per GPU kind.

    agentflow bench light_load [--cluster hetero-8] [--policy flowsage] [--l1 RATE]
        [--span 80] [--seeds 1] [--json OUT]

Why: a tenant alone should be served at least as fast as the same tenant beside a flood; if
alone it is slower, its calls went to slow GPUs while nothing contended, and the tenant
grid's "P95 / alone" ratios below 1 come from that rather than from isolation. The tenant
grid's own scenarios (``policy_suite.tenant_scenarios``): trace1, an ``interactive`` tenant at
0.5 x L1 with a deadline of 2 x the pipeline's mean idle latency, alone and beside a
``batch`` tenant at 1.5 x L1; L1 is searched unless ``--l1`` gives it. Printed per scenario
and seed: the interactive tenant's P95 and how many of its LLM calls ran on each GPU kind.
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
from agentflow.scheduler import savable
from agentflow.sim.driver import StageTiming
from agentflow.sim.experiment import build_tenant_workload, reference_latencies, run_policy
from agentflow.sim.slo import IdleLatency

SCENARIOS = ("interactive-alone", "isolation-1.5x")
TENANT = "interactive"


def run_scenario(cluster: Any, wl: Any, policy: str) -> dict[str, Any]:
    """The interactive tenant's P95 and its LLM calls per GPU kind."""
    kind_of = {name: cfg.gpu or "cpu" for name, cfg in cluster.expanded()}
    ran: list[tuple[str, str]] = []  # (query id, GPU kind) of each LLM stage

    def on_stage(st: StageTiming) -> None:
        if st.kind == "llm" and st.instance is not None:
            ran.append((st.query_id, kind_of.get(st.instance, "?")))

    result = run_policy(cluster, wl, policy, slo_scale=2.0, on_stage=on_stage)
    tenant_of = {r.id: r.tenant for r in result.records}
    calls: dict[str, int] = {}
    for qid, kind in ran:
        if tenant_of.get(qid) == TENANT:
            calls[kind] = calls.get(kind, 0) + 1
    lat = [r.latency_s for r in result.records
           if r.tenant == TENANT and r.status == "done" and r.latency_s is not None]
    return {"p95": float(np.percentile(lat, 95)), "done": len(lat),
            "queries": sum(1 for r in result.records if r.tenant == TENANT),
            "calls_by_kind": calls}


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--span", "30")


def main(argv: list[str] | None = None) -> int:
    savable.register()  # flowsage-savable, measured here (not a shipped policy)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cluster", default="hetero-8")
    p.add_argument("--policy", default="flowsage")
    p.add_argument("--l1", type=float, help="the cluster's L1 rate (else searched)")
    p.add_argument("--span", type=int, default=80, help="queries of a tenant at 1 x L1")
    p.add_argument("--seeds", default="1")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s]
    trace = workloads()["trace1"]
    cluster = cluster_named(args.cluster)
    idle = IdleLatency(cluster)
    l1 = args.l1 or find_l1(trace, cluster, idle, max(60, 8 * len(cluster.expanded())),
                            seeds[0])
    slo = 2.0 * float(np.mean(list(reference_latencies(trace, idle).values())))
    print(f"{args.cluster}: L1 {l1:.4g} q/s, interactive deadline {slo:.1f} s", flush=True)
    out: dict[str, Any] = {"l1": l1, "slo_s": slo, "runs": {}}
    scenarios = tenant_scenarios(l1, slo, args.span)
    for seed in seeds:
        for scen in SCENARIOS:
            t0 = time.perf_counter()
            wl = build_tenant_workload(trace, cluster, scenarios[scen], n=args.span,
                                       seed=seed, idle=idle)
            row = run_scenario(cluster, wl, args.policy)
            out["runs"][f"{scen}/s{seed}"] = row
            kinds = " ".join(f"{k}:{n}" for k, n in sorted(row["calls_by_kind"].items()))
            print(f"  seed {seed} {scen:<18} {args.policy}: interactive p95={row['p95']:.1f} s "
                  f"done={row['done']}/{row['queries']} calls [{kinds}] "
                  f"({time.perf_counter() - t0:.0f}s)", flush=True)
        alone, flood = (out["runs"][f"{s}/s{seed}"]["p95"] for s in SCENARIOS)
        print(f"  seed {seed} P95 alone / beside the flood: {alone / flood:.3f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
