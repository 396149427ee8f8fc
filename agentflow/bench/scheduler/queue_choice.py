"""Where the queue order acts: flowsage against marginal_delay+fcfs per engine-side depth, with
how many admissions had a choice to make.

    agentflow bench queue_choice [--clusters paper-4gpu,hetero-8] [--pending 1,2,4,off]
        [--policies flowsage,marginal_delay+fcfs] [--load 1.5] [--queries 120] [--seed 1]
        [--l1 paper-4gpu=0.21,...] [--json OUT]

Why: under ``marginal_delay`` almost every call is admitted to an instance the moment it is
ready, so the agentflow queue rarely holds two calls to order (issue 38: 18 of 2,460
admissions) and ``marginal_delay+fcfs`` tied flowsage. What is left to order is inside the
engine — its own waiting queue and the sequence it preempts — which the coordinator now
tells each call's queue rank (``scheduler.classes.engine_priority``), and how much waits
there rather than in agentflow's queue, which the instance's ``max_pending_prefill`` bounds
(admitted calls without a first token). This runs the same workload (trace1, Poisson at
``--load`` x L1, the policy suite's load level; ``--l1`` reuses known L1 rates, else they
are searched) at each depth, per policy, and prints P95, the flowsage / md+fcfs ratio and
the admissions made while two or more calls waited (``InstanceQueue.admitted_with_choice``)
— per GPU kind too, since the best depth may differ by how fast an instance drains its
prompts. Ratios side by side in one run; CPU-heavy: keep ``--queries`` small on a shared box.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.scheduler.policy_suite import cluster_named, find_l1, workloads
from agentflow.sim.cluster import SimClusterConfig
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import build_workload
from agentflow.sim.slo import IdleLatency


def parse_depths(text: str) -> list[int | None]:
    """``1,2,off`` -> [1, 2, None] (off: no bound, every free slot admits at once)."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "off":
            out.append(None)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"--pending: {part!r} is not a depth >= 1 or off")
    return out


def with_depth(cluster: SimClusterConfig, depth: int | None) -> SimClusterConfig:
    """The cluster with every instance's ``max_pending_prefill`` set to ``depth``."""
    return cluster.model_copy(update={"instances": [
        i.model_copy(update={"max_pending_prefill": depth}) for i in cluster.instances]})


def run_depth(cluster: SimClusterConfig, wl: Any, policy: str) -> dict[str, Any]:
    """One policy at one depth: P95 and mean latency, SLO attainment and the admissions with
    a choice, in all and per GPU kind."""
    sim = Simulation(cluster, policy)
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
    lat = [r.latency_s for r in result.records if r.status == "done" and r.latency_s]
    met = [r for r in result.records if r.slo_s is not None]
    by_kind: dict[str, list[int]] = {}
    for queue in sim.coordinator.queues.values():
        kind = queue.spec.gpu or "cpu"
        row = by_kind.setdefault(kind, [0, 0])
        row[0] += queue.admitted_with_choice
        row[1] += queue._admitted
    return {"p95": float(np.percentile(lat, 95)), "mean": float(np.mean(lat)),
            "done": len(lat), "queries": len(result.records),
            "slo": (sum(1 for r in met if r.latency_s is not None and r.slo_s is not None
                        and r.latency_s <= r.slo_s) / len(met)) if met else None,
            "choice": sum(v[0] for v in by_kind.values()),
            "admissions": sum(v[1] for v in by_kind.values()), "by_kind": by_kind}


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--clusters", "paper-4gpu", "--pending", "2,off",
                               "--queries", "40")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clusters", default="paper-4gpu,hetero-8")
    p.add_argument("--pending", type=parse_depths, default=parse_depths("1,2,4,off"),
                   help="engine-side depths: max_pending_prefill values, or off")
    p.add_argument("--policies", default="flowsage,marginal_delay+fcfs")
    p.add_argument("--load", type=float, default=1.5, help="x L1 (the policy suite's 1.5)")
    p.add_argument("--queries", type=int, default=120)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--l1", default="", help="CLUSTER=RATE,... known L1 rates (else searched)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    known = {k: float(v) for k, v in (x.split("=") for x in args.l1.split(",") if x)}
    policies = args.policies.split(",")
    trace = workloads()["trace1"]
    out: dict[str, Any] = {}
    for name in args.clusters.split(","):
        base = cluster_named(name)
        idle = IdleLatency(base)
        l1 = known.get(name)
        if l1 is None:
            l1 = find_l1(trace, base, idle, max(60, 8 * len(base.expanded())), args.seed)
        rate = args.load * l1
        wl = build_workload(trace, base, n=args.queries, rate=rate, seed=args.seed, idle=idle)
        print(f"{name}: L1 {l1:.4g} q/s, rate {rate:.4g}, {args.queries} queries", flush=True)
        for depth in args.pending:
            cell: dict[str, Any] = {}
            for policy in policies:
                t0 = time.perf_counter()
                cell[policy] = run_depth(with_depth(base, depth), wl, policy)
                f = cell[policy]
                kinds = " ".join(f"{k}:{c}/{n}" for k, (c, n) in sorted(f["by_kind"].items()))
                print(f"  pending={depth if depth is not None else 'off':<4} {policy:<22} "
                      f"p95={f['p95']:7.2f} mean={f['mean']:6.2f} done={f['done']}/"
                      f"{f['queries']} choice={f['choice']}/{f['admissions']} [{kinds}] "
                      f"({time.perf_counter() - t0:.0f}s)", flush=True)
            if len(policies) > 1:
                ref = cell[policies[1]]["p95"]
                print(f"  pending={depth if depth is not None else 'off':<4} "
                      f"{policies[0]} / {policies[1]} P95: {cell[policies[0]]['p95'] / ref:.3f}",
                      flush=True)
            out[f"{name}/{depth if depth is not None else 'off'}"] = cell
        out[f"{name}/l1"] = l1
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
