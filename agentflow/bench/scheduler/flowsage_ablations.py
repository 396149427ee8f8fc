"""Why does a policy win or lose? Dispatch x queue, flowsage's parts, oracle lengths, and which
queries make up the P95 — on a few cells of the policy suite.

    agentflow bench flowsage_ablations [--cells trace1/poisson,trace1/gamma:3]
        [--queries 120] [--policies A,B,...] [--out artifacts/ablations]

Each cell: ``paper-4gpu``, deadlines 2x idle, rate 1.5 x L1 (the policy suite's level,
read from its cached results when present, else searched the same way). For each policy it
prints P95, mean, SLO attainment and the make-up of the slowest 5% of queries: their mean
LLM calls, mean idle latency relative to the workload's, and how many of them missed the
deadline by more than 2x. ``--makeup`` adds where the LLM calls' time went: the share spent
waiting (coordinator and engine queues) and the *stretch* — run time on the loaded cluster over
the same call's run time when the workload arrives so slowly that no two queries overlap (same
policy), and how many calls the engines preempted (a running call is re-ranked or evicted only
through preemption). A stretch well above 1 with a small wait share means the latency is made
in the engines' batches (prefill stalls), which dispatch decides, not queue order.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from agentflow.bench.scheduler.ablation_queues import register_ablation_queues
from agentflow.bench.scheduler.policy_suite import find_l1, workloads
from agentflow.metrics import scale_key
from agentflow.sim.cluster import load_cluster
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import Workload, build_workload, run_policy
from agentflow.sim.slo import IdleLatency

DISPATCH = ("round_robin", "least_loaded", "workload_balanced", "earliest_finish",
            "marginal_delay")
QUEUES = ("fcfs", "edf", "llf", "urgency", "gittins", "flowsage_v1", "query_gittins",
          "flowsage", "flowsage_call", "flowsage_laxity", "query_srpt")
DEFAULT = [f"{d}+{q}" for d in DISPATCH[1:] for q in QUEUES] + [
    "vllm", "sagesched@oracle", "least_loaded+edf@oracle", "llf@oracle", "hexgen-flow@oracle",
    "oracle", "least_loaded+flowsage@oracle"]


def tail_makeup(result, wl) -> dict:
    done = [(r, q) for r, q in zip(result.records, wl.queries) if r.latency_s is not None]
    lat = np.array([r.latency_s for r, _ in done])
    cut = np.percentile(lat, 95)
    tail = [(r, q) for r, q in done if r.latency_s >= cut]
    idle_mean = float(np.mean(wl.idle_latency_s))
    return {"tail_calls": float(np.mean([q.llm_calls for _, q in tail])),
            "tail_idle_rel": float(np.mean([r.idle_latency_s for r, _ in tail]) / idle_mean),
            "tail_missed_2x": sum(r.latency_s > 2 * r.slo_s for r, _ in tail) / len(tail)}


def time_makeup(cluster, wl, policy: str) -> dict:
    """Wait share and run stretch of the LLM calls (see the module docstring)."""
    def stages(workload):
        """The LLM stages' timings by (query, node), and the engines' preemptions."""
        seen: list = []
        sim = Simulation(cluster, policy, on_stage=seen.append)
        sim.run(workload.queries, workload.arrivals, workload.deadlines(2.0),
                workload.idle_latency_s)
        return ({(s.query_id, s.node_id): s for s in seen if s.kind == "llm"},
                sum(e.load().preemptions for e in sim.instances.values()))

    alone = Workload(wl.queries, [i * 1e6 for i in range(len(wl.queries))], wl.idle_latency_s,
                     wl.reference_s)
    (loaded, preempted), (solo, _) = stages(wl), stages(alone)
    wait = sum(s.queue_s for s in loaded.values())
    run = sum(s.run_s for s in loaded.values())
    run_alone = sum(solo[k].run_s for k in loaded if k in solo)
    return {"wait_share": wait / (wait + run) if wait + run else 0.0,
            "stretch": run / run_alone if run_alone else float("nan"),
            "preempted": preempted}


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--cells", "trace1/poisson", "--queries", "40")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", default="trace1/poisson,trace1/gamma:3")
    p.add_argument("--queries", type=int, default=120)
    p.add_argument("--policies", default=",".join(DEFAULT))
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("artifacts/ablations"))
    p.add_argument("--makeup", action="store_true",
                   help="also report the calls' wait share and run stretch (two more runs)")
    args = p.parse_args(argv)
    register_ablation_queues()  # flowsage_v1, query_gittins, ... are not shipped queues
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "results.json"
    results = json.loads(store.read_text()) if store.exists() else {}
    suite = Path("artifacts/policy_suite/full/results.json")
    l1s = json.loads(suite.read_text())["l1"] if suite.exists() else {}
    cluster = load_cluster("paper-4gpu")
    idle = IdleLatency(cluster)
    traces = workloads()
    for cell in args.cells.split(","):
        name, arrival = cell.split("/")
        l1 = l1s.get(f"{name}/paper-4gpu") or find_l1(traces[name], cluster, idle, 60,
                                                       args.seed)
        rate = 1.5 * l1
        wl = build_workload(traces[name], cluster, n=args.queries, rate=rate, arrival=arrival,
                            seed=args.seed, idle=idle)
        per = results.setdefault(f"{cell}/{args.queries}", {})
        for policy in args.policies.split(","):
            if policy in per:
                continue
            t0 = time.perf_counter()
            res = run_policy(cluster, wl, policy, slo_scale=2.0)
            s = res.summary()
            per[policy] = {"p95": s["p95"], "mean": s["mean"],
                           "slo": s["slo_attainment"][scale_key(2.0)], **tail_makeup(res, wl)}
            if args.makeup:
                per[policy].update(time_makeup(cluster, wl, policy))
            m = per[policy]
            makeup = (f" wait={m['wait_share']:.2f} stretch={m['stretch']:.2f} "
                      f"preempted={m.get('preempted', 0)}" if "stretch" in m else "")
            print(f"{cell:<16} {policy:<36} p95={m['p95']:6.1f} mean={m['mean']:6.1f} "
                  f"slo={m['slo']:.2f} tail: calls={m['tail_calls']:.1f} "
                  f"idle={m['tail_idle_rel']:.2f}x missed2x={m['tail_missed_2x']:.2f}{makeup} "
                  f"({time.perf_counter() - t0:.1f}s)", flush=True)
            store.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
