"""The head-to-head: every scheduling preset on the shared HexGen-Flow traces, paper-4gpu.

    agentflow bench head_to_head [--queries 300] [--out artifacts/head_to_head] [--ray ADDR]

For each trace, the load levels are found, not chosen: the lowest rate (on a doubling then
bisection search) at which the ``vllm`` preset's P95 is at least twice its idle-cluster P95
is level 1; levels 2 and 3 are 1.25x and 1.5x that rate. At each level every policy runs on
the same seeded arrivals. Workload-balanced presets (hexgen-flow, flowsage, oracle) tune
alpha online as HexGen-Flow does (forked replays of the last ``--window`` seconds). Goodput
is each policy's highest rate with >= 90% of queries within ``--slo-scale`` x idle latency.
Writes ``report.md`` (tables and ratios), ``results.json`` and PNG plots to ``--out``.
Nothing here is tuned to these traces; the constants are the simulator's defaults.
With ``--ray`` (an address, or ``local``) the policies of each level and the goodput searches
run as Ray tasks (agentflow.distributed.grid): the same numbers, sooner on a cluster.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.distributed.grid import run_grid
from agentflow.metrics import scale_key
from agentflow.sim.alpha import OnlineAlphaTuner
from agentflow.sim.cluster import load_cluster
from agentflow.sim.experiment import build_workload, goodput, loaded_rate, run_policy
from agentflow.sim.plots import plot_attainment, plot_p95_vs_rate
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import load_hexgen

POLICIES = ("vllm", "hexgen-flow", "sagesched", "llf", "flowsage", "oracle")
TUNED = ("hexgen-flow", "flowsage", "oracle")
TRACES = HEXGEN_TRACES


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "60", "--no-goodput")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", nargs="*", default=[str(TRACES / "trace1.json"),
                                                   str(TRACES / "trace2.json")])
    p.add_argument("--cluster", default="paper-4gpu")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--slo-scale", type=float, default=2.0)
    p.add_argument("--window", type=float, default=600.0, help="alpha-tuning window (s)")
    p.add_argument("--no-goodput", action="store_true")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run each level's policies and the goodput searches as Ray tasks")
    p.add_argument("--out", type=Path, default=Path("artifacts/head_to_head"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(args.cluster)
    idle = IdleLatency(cluster)
    results: dict = {"config": vars(args) | {"out": str(args.out)}, "traces": {}}
    for trace_path in args.traces:
        trace = load_hexgen(trace_path)
        name = Path(trace_path).stem
        base = find_level(cluster, trace, args, idle)
        levels = [base, base * 1.25, base * 1.5]
        entry: dict = {"idle_p95": base_idle_p95(cluster, trace, args, idle), "levels": {}}
        for rate in levels:
            wl = build_workload(trace, cluster, n=args.queries, rate=rate, seed=args.seed,
                                idle=idle)
            def show(i: int, summary: dict, rate: float = rate, name: str = name) -> None:
                print(f"{name} rate={rate:.4f} {POLICIES[i]:<12} p95={summary['p95']:.1f}s "
                      f"slo@{args.slo_scale:g}={summary['slo_attainment'][scale_key(args.slo_scale)]:.2f}"
                      f" ({summary['sim_wall_s']}s)", flush=True)
            summaries = run_grid(policy_run, POLICIES,
                                 context=(cluster, wl, args.slo_scale, args.window),
                                 ray=args.ray, on_result=show)
            per_policy = dict(zip(POLICIES, summaries))
            entry["levels"][f"{rate:.5f}"] = per_policy
            plot_attainment(per_policy, args.out / f"{name}-attainment-{rate:.4f}.png",
                            title=f"{name}, {rate:.4f} q/s")
        series = {pol: [(float(r), lv[pol]["p95"]) for r, lv in entry["levels"].items()]
                  for pol in POLICIES}
        plot_p95_vs_rate(series, args.out / f"{name}-p95-vs-rate.png", title=name)
        if not args.no_goodput:
            found = run_grid(goodput_search, POLICIES, ray=args.ray, context=(
                cluster, trace, min(args.queries, 200), args.slo_scale, args.seed, idle,
                base / 8), on_result=lambda i, qps, name=name: print(
                    f"{name} goodput {POLICIES[i]}: {qps:.4f} q/s", flush=True))
            entry["goodput"] = dict(zip(POLICIES, found))
        results["traces"][name] = entry
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (args.out / "report.md").write_text(report(results, args))
    print((args.out / "report.md").read_text())


def policy_run(policy: str, context: tuple) -> dict:
    """One policy at one load level (a grid cell: the same here or as a Ray task)."""
    cluster, wl, slo_scale, window = context
    start = time.perf_counter()
    tuner = (OnlineAlphaTuner(cluster, every_s=window, window_s=window, slo_scale=slo_scale)
             if policy in TUNED else None)
    summary = run_policy(cluster, wl, policy, slo_scale=slo_scale, alpha_tuner=tuner).summary()
    summary["sim_wall_s"] = round(time.perf_counter() - start, 2)
    return summary


def goodput_search(policy: str, context: tuple) -> float:
    """One policy's goodput (a grid cell)."""
    cluster, trace, n, slo_scale, seed, idle, low = context
    return goodput(cluster, trace, policy, n=n, slo_scale=slo_scale, seed=seed, idle=idle,
                   low=low)


def base_idle_p95(cluster, trace, args, idle) -> float:
    wl = build_workload(trace, cluster, n=args.queries, rate=1e-4, seed=args.seed, idle=idle)
    return run_policy(cluster, wl, "vllm", slo_scale=args.slo_scale).summary()["p95"]


def find_level(cluster, trace, args, idle) -> float:
    """Lowest rate at which vllm's P95 >= 2 x its idle P95 (doubling, then bisection)."""
    return loaded_rate(cluster, trace, idle, n=args.queries, seed=args.seed, idle_rate=1e-4,
                       low=0.002, high=0.004, iterations=6, slo_scale=args.slo_scale)


def report(results: dict, args) -> str:
    s = scale_key(args.slo_scale)
    lines = ["# Head-to-head on the shared HexGen-Flow traces", "",
             f"Cluster `{args.cluster}`, {args.queries} queries per run, seed {args.seed}, "
             f"deadlines = {args.slo_scale:g} x idle latency; alpha tuned online for "
             f"{', '.join(TUNED)}. Command: `agentflow bench head_to_head`.", ""]
    for name, entry in results["traces"].items():
        lines += [f"## {name} (idle-cluster P95 of vllm: {entry['idle_p95']:.1f} s)", "",
                  "| rate q/s | policy | P95 s | P95 vllm/policy | mean s | SLO@" + s +
                  " | SLO@1.0 | SLO@5.0 |", "|---|---|---|---|---|---|---|---|"]
        for rate, per in entry["levels"].items():
            v = per["vllm"]["p95"]
            for pol, m in per.items():
                lines.append(f"| {float(rate):.4f} | {pol} | {m['p95']:.1f} | {v / m['p95']:.2f}x"
                             f" | {m['mean']:.1f} | {m['slo_attainment'][s]:.2f} | "
                             f"{m['slo_attainment']['1']:.2f} | {m['slo_attainment']['5']:.2f} |")
        if "goodput" in entry:
            g = entry["goodput"]
            lines += ["", f"Goodput (>= 90% within {args.slo_scale:g} x idle latency):", "",
                      "| policy | goodput q/s | vs vllm |", "|---|---|---|"]
            for pol, val in g.items():
                ratio = val / g["vllm"] if g["vllm"] > 0 else float("inf")
                lines.append(f"| {pol} | {val:.4f} | {ratio:.2f}x |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
