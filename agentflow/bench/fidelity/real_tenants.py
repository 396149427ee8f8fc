"""Tenants of different SLO classes on real continuous-batching engines, and the simulator on
the same arrivals: does an interactive tenant keep its latency beside a batch flood?

    agentflow bench real_tenants --cluster examples/cluster-llama-server-2cpu.yaml \\
        --trace ../shared/traces/hexgen-flow/trace1.json [--scenarios isolation-2x] \\
        [--preemption off,auto] [--fast-lane 2|off] [--span 20] [--scale 0.02] [--l1 RATE]
        [--sim-only]

Why: issue 22's isolation and fairness figures come from the simulator (``tenant_cells.py``)
and from serving on scripted single-slot instances (``serving_classes.py``). This runs the
tenant grid's mixes with the serving scheduler (``ScheduledRouter`` over the coordinator, as
``real_policies.py``) driving real engines that batch — llama.cpp's ``llama-server``, where a
co-runner slows each decode step and a stopped call's backend request is cancelled — and the
simulator on the same cluster file, queries, arrivals and deadlines beside it.

Workload: the grid's scenarios (``policy_suite.tenant_scenarios``) at ``L1``, the rate at
which vllm's simulated P95 doubles on this cluster (found on the scaled trace unless
``--l1`` gives it); ``--span`` is the query count of a tenant at 1 x L1 (each tenant sends
``span x its multiple``, at least 20). Every LLM call is a synthetic prompt of the recorded
token count times ``--scale`` (``real_policies.scaled_trace``). Each tenant's alone scenario
runs once (with one tenant nothing can be preempted); each mixed scenario once per
``--preemption`` setting.

Output: per scenario and setting, each tenant's P95, median and answers on each side, and
the issue's ratio — the protected tenant's P95 (``interactive``, or ``light`` in
``fairness``) over its P95 alone — real and simulated. One run per cell on a 2-core machine
that may be busy: indicative, not a claim; read the real ratio next to the simulated one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.fidelity.real_policies import run_real, scaled_trace, sim_cluster
from agentflow.bench.scheduler.policy_suite import find_l1, tenant_scenarios
from agentflow.event_loop import close_loop
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS, parse_fast_lane
from agentflow.scheduler.health import HealthSettings
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import build_tenant_workload, reference_latencies
from agentflow.sim.host_calibration import (
    PromptMaker,
    close_all,
    start_backends,
    tokenizer_of,
)
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import TenantSpec, load_trace

# scenario -> (the tenant it protects, that tenant's alone scenario)
PROTECTED = {"isolation-1.5x": ("interactive", "interactive-alone"),
             "isolation-2x": ("interactive", "interactive-alone"),
             "fairness": ("light", "light-alone")}


def tenant_stats(latencies: dict[str, list[float]], sent: dict[str, int]
                 ) -> dict[str, dict[str, Any]]:
    """Per tenant: P95 and median latency of its answers, answers and queries sent."""
    out: dict[str, dict[str, Any]] = {}
    for name, n in sorted(sent.items()):
        lat = np.asarray(latencies.get(name, []))
        out[name] = {"p95_s": float(np.percentile(lat, 95)) if lat.size else None,
                     "p50_s": float(np.median(lat)) if lat.size else None,
                     "answers": int(lat.size), "queries": n}
    return out


def plan(scenarios: list[str], settings: list[str]) -> list[tuple[str, str]]:
    """(scenario, preemption) runs: each protected tenant's alone scenario once, first (with
    one tenant there is nothing to preempt), then each mixed scenario per setting."""
    runs: list[tuple[str, str]] = []
    for name in scenarios:
        if name not in PROTECTED:
            raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(PROTECTED)}")
        alone = (PROTECTED[name][1], "off")
        if alone not in runs:
            runs.append(alone)
    return runs + [(name, s) for name in scenarios for s in settings]


def ratio_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The protected tenant's P95 over its P95 alone, per mixed run and side (real, sim)."""
    rows = []
    for key, run in results.items():
        scenario, setting = key.split("/")
        if scenario not in PROTECTED:
            continue
        tenant, alone = PROTECTED[scenario]
        row: dict[str, Any] = {"scenario": scenario, "preemption": setting, "tenant": tenant}
        for side in ("real", "sim"):
            here = (run.get(side) or {}).get(tenant, {}).get("p95_s")
            base = (results.get(f"{alone}/off", {}).get(side) or {}).get(tenant, {}).get("p95_s")
            row[side] = here / base if here and base else None
        rows.append(row)
    return rows


def simulate(cluster: Any, workload: Any, policy: str, preemption: str,
             fast_lane: int | None = FAST_LANE_CALLS) -> dict[str, Any]:
    sim = Simulation(cluster, policy, preemption=preemption, fast_lane=fast_lane)
    result = sim.run(workload.queries, workload.arrivals, workload.deadlines(2.0),
                     workload.idle_latency_s, tenants=workload.tenants,
                     classes=workload.classes)
    latencies: dict[str, list[float]] = {}
    for r in result.records:
        if r.status == "done" and r.latency_s is not None:
            latencies.setdefault(r.tenant or "", []).append(r.latency_s)
    return tenant_stats(latencies, sent_by_tenant(workload))


def sent_by_tenant(workload: Any) -> dict[str, int]:
    return dict(Counter(workload.tenants or []))


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--span", "8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--scenarios", default="isolation-2x",
                    help=f"comma list of {', '.join(PROTECTED)}")
    ap.add_argument("--preemption", default="off,auto",
                    help="comma list of scheduler.preemption settings for the mixed runs")
    ap.add_argument("--fast-lane", type=parse_fast_lane, default=FAST_LANE_CALLS,
                    metavar="N|off",
                    help="scheduler.fast_lane for every run: calls, or off")
    ap.add_argument("--policy", default="flowsage")
    ap.add_argument("--span", type=int, default=20,
                    help="queries of a tenant at 1 x L1 (each sends span x its multiple, >= 20)")
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--max-prompt", type=int)
    ap.add_argument("--max-output", type=int)
    ap.add_argument("--l1", type=float, help="the load level (q/s); default: found in the "
                    "simulator on the scaled trace, as the tenant grid finds it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sim-only", action="store_true", help="skip the real engines")
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args(argv)
    if not 0 < args.scale <= 1 or args.span < 1:
        ap.error("--scale must be in (0, 1] and --span >= 1")
    try:
        runs = plan(args.scenarios.split(","), args.preemption.split(","))
    except ValueError as err:
        ap.error(str(err))
    cluster = sim_cluster(args.cluster)
    trace = scaled_trace(load_trace(args.trace), args.scale, args.max_prompt, args.max_output)
    idle = IdleLatency(cluster)
    l1 = args.l1 or find_l1(trace, cluster, idle, max(60, 8 * len(cluster.expanded())),
                            args.seed)
    slo = 2.0 * float(np.mean(list(reference_latencies(trace, idle).values())))
    scenarios: dict[str, list[TenantSpec]] = tenant_scenarios(l1, slo, args.span)
    print(f"# {args.policy} on {', '.join(n for n, _ in cluster.expanded())}; L1 {l1:.4g} q/s, "
          f"interactive SLO {slo:.1f} s, tokens x{args.scale}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    backends: dict[str, Any] = {}
    loop = asyncio.new_event_loop()
    try:
        maker = None
        if not args.sim_only:
            backends = start_backends(args.cluster)
            maker = PromptMaker(tokenizer_of(backends, None), args.seed)
        for scenario, setting in runs:
            workload = build_tenant_workload(trace, cluster, scenarios[scenario],
                                             n=args.span, seed=args.seed, idle=idle)
            entry: dict[str, Any] = {"sim": simulate(cluster, workload, args.policy, setting,
                                                     args.fast_lane)}
            if maker is not None:
                real = loop.run_until_complete(run_real(
                    args.policy, cluster, workload, workload.deadlines(2.0), backends, maker,
                    HealthSettings(), preemption=setting, fast_lane=args.fast_lane))
                entry["real"] = tenant_stats(real["by_tenant"], sent_by_tenant(workload))
                entry["real_preempted"] = real["preempted"]
                entry["real_wall_s"] = real["wall_s"]
            results[f"{scenario}/{setting}"] = entry
            print(f"{scenario:<18} {setting:<5} " + "  ".join(
                f"{side} {t}: p95 {s['p95_s'] or 0:.1f} p50 {s['p50_s'] or 0:.1f} "
                f"{s['answers']}/{s['queries']}"
                for side in ("real", "sim") for t, s in (entry.get(side) or {}).items())
                + (f"  (real: {entry['real_preempted']} calls stopped, "
                   f"{entry['real_wall_s']:.0f} s wall, load {os.getloadavg()[0]:.1f})"
                   if "real" in entry else ""), flush=True)
    finally:
        if backends:
            loop.run_until_complete(close_all(backends))
        close_loop(loop)
    print("\nprotected tenant's P95 over its P95 alone")
    rows = ratio_rows(results)
    for row in rows:
        real = f"{row['real']:.3f}" if row["real"] else "-"
        sim = f"{row['sim']:.3f}" if row["sim"] else "-"
        print(f"  {row['scenario']:<16} preemption {row['preemption']:<5} {row['tenant']:<12} "
              f"real {real:>6}  sim {sim:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "l1": l1, "runs": results,
                                               "ratios": rows}, indent=1))


if __name__ == "__main__":
    main()
