"""``agentflow simulate``: every listed policy on the same arrivals, on a simulated cluster."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentflow.cli import table_console
from agentflow.scheduler.length_models import PREDICTORS
from agentflow.scheduler.policies import policy_help


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="compare scheduling policies on a simulated cluster",
                       description="Replay a trace on a simulated heterogeneous cluster under "
                                   "each policy, with identical arrivals.")
    p.add_argument("--trace", required=True, help="HexGen-Flow JSON or agentflow JSONL trace")
    p.add_argument("--format", choices=["auto", "hexgen", "agentflow"], default="auto")
    p.add_argument("--cluster", default="paper-4gpu", help="a name (paper-4gpu, ...) or YAML")
    p.add_argument("--policy", default="vllm,hexgen-flow,sagesched,flowsage",
                   help="comma-separated policies; " + policy_help().replace("%", "%%"))
    p.add_argument("--predictor", default=None, choices=list(PREDICTORS),
                   help="length model for every listed policy that names none (e.g. "
                        "--predictor oracle runs each policy with true lengths)")
    p.add_argument("--rate", type=float, default=1.0, help="mean arrival rate, queries/s")
    p.add_argument("--arrival", default="poisson",
                   help="poisson | gamma:CV | steps:RATE/SECONDS,RATE/SECONDS,...")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-scale", type=float, default=2.0,
                   help="deadline given to the scheduler, as a multiple of idle latency")
    p.add_argument("--alpha", type=float, default=None, help="fixed workload_balanced alpha")
    p.add_argument("--cached-prefix", type=float, default=0.0,
                   help="fraction of each prompt served from a prefix cache (default 0: "
                        "cold prompts)")
    p.add_argument("--tune-alpha", action="store_true",
                   help="re-tune alpha online from forked simulations of the recent window")
    p.add_argument("--goodput", action="store_true",
                   help="also find each policy's goodput (>= 90%% within --slo-scale)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None, help="SLO attainment vs scale (PNG)")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    from agentflow.sim.alpha import OnlineAlphaTuner
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.experiment import build_workload, goodput, run_policy
    from agentflow.sim.slo import IdleLatency
    from agentflow.sim.workload import load_trace

    console = Console(stderr=True)
    cluster = load_cluster(args.cluster)
    trace = load_trace(args.trace, args.format)
    from agentflow.scheduler.policies import parse_policy, with_predictor

    policies = [with_predictor(p.strip(), args.predictor)
                for p in args.policy.split(",") if p.strip()]
    for policy in policies:
        parse_policy(policy)  # a bad name fails before any simulation runs
    idle = IdleLatency(cluster, cached_prefix=args.cached_prefix)
    workload = build_workload(trace, cluster, n=args.queries, rate=args.rate,
                              arrival=args.arrival, seed=args.seed, idle=idle)
    results = {}
    for policy in policies:
        start = time.perf_counter()
        tuner = OnlineAlphaTuner(cluster, slo_scale=args.slo_scale) if args.tune_alpha else None
        result = run_policy(cluster, workload, policy, slo_scale=args.slo_scale,
                            alpha=args.alpha, alpha_tuner=tuner,
                            cached_prefix=args.cached_prefix)
        summary = result.summary()
        summary["sim_wall_s"] = time.perf_counter() - start
        if result.alpha_history:
            summary["alpha_history"] = result.alpha_history
        if args.goodput:
            summary["goodput_qps"] = goodput(cluster, trace, policy, n=args.queries,
                                             slo_scale=args.slo_scale, arrival=args.arrival,
                                             seed=args.seed, idle=idle,
                                             cached_prefix=args.cached_prefix)
        results[policy] = summary
        console.print(f"  {policy}: done in {summary['sim_wall_s']:.1f}s", highlight=False)
    out = {"config": {"trace": str(args.trace), "cluster": cluster.name,
                      "rate": args.rate, "arrival": args.arrival, "queries": args.queries,
                      "seed": args.seed, "slo_scale": args.slo_scale, "alpha": args.alpha,
                      "cached_prefix": args.cached_prefix,
                      "tune_alpha": args.tune_alpha},
           "policies": results}
    print_table(table_console(140), out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        clean = json.loads(json.dumps(out))
        for s in clean["policies"].values():
            s.pop("sim_wall_s", None)  # wall time differs run to run; the rest is exact
        args.json.write_text(json.dumps(clean, indent=2, sort_keys=True))
    if args.plot:
        from agentflow.sim.plots import plot_attainment

        plot_attainment(results, args.plot, title=f"{cluster.name}, {args.rate:g} q/s "
                                                  f"({args.arrival})")
    return 0


def print_table(console: Console, out: dict) -> None:
    table = Table(title=f"{out['config']['cluster']} at {out['config']['rate']:g} q/s, "
                        f"{out['config']['queries']} queries ({out['config']['arrival']})")
    cols = ["policy", "done", "rej", "mean s", "p50 s", "p95 s", "p99 s", "q/s",
            "SLO@1", "SLO@2", "SLO@5"]
    has_goodput = any("goodput_qps" in s for s in out["policies"].values())
    if has_goodput:
        cols.append("goodput q/s")
    for c in cols:
        table.add_column(c, justify="right")
    for policy, s in out["policies"].items():
        def f(v, d=1):
            return "-" if v is None else f"{v:.{d}f}"
        row = [policy, str(s["completed"]), str(s["rejected"]), f(s["mean"]), f(s["p50"]),
               f(s["p95"]), f(s["p99"]), f(s["throughput_qps"], 3),
               f(s["slo_attainment"]["1.0"], 2), f(s["slo_attainment"]["2.0"], 2),
               f(s["slo_attainment"]["5.0"], 2)]
        if has_goodput:
            row.append(f(s.get("goodput_qps"), 3))
        table.add_row(*row)
    console.print(table)
