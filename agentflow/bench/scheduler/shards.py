"""Sharded coordinators: what K = 1, 2, 4, 8 shards cost in latency and buy in decisions/s.

    agentflow bench shards [--cluster hetero-64] [--scale 1] [--shards 1,2,4,8]
        [--routes p2c,hash] [--sets trace2,mix-bursty] [--queries 800] [--rate 10]
        [--seed 0] [--summary-s 0.5] [--search-goodput] [--json FILE]

Every (K, routing rule) runs the same arrivals under flowsage, with K coordinators over a
stratified split of the cluster (``agentflow.scheduler.shards``); K = 1 runs behind the same
facade, so every row is timed the same way. Arrival sets, chosen to be unlike the trace the
policies were tuned on (HexGen-Flow trace1):

- ``trace2``: HexGen-Flow's other trace, Poisson arrivals at ``--rate``;
- ``mix-bursty``: both traces' queries mixed, gamma arrivals with CV 2 (bursts) at ``--rate``.
- ``trace1``: the tuning trace itself, Poisson, for comparison.

Printed per set and row: completed queries, P50 and P95 latency and P95 over K = 1's (same
rule for K = 1 is moot: one shard), the share of queries done within their deadline and
that goodput (answers within deadline per second of arrivals) over K = 1's, the decisions
(coordinator events) the busiest shard handled and its CPU seconds for them, and decisions
per CPU-second of the busiest shard: what K shards in K processes sustain, and its ratio
to K = 1. CPU time (``time.process_time``) per shard, measured side by side in one run.
``--search-goodput`` also finds each row's goodput rate (the highest Poisson rate at which
90% of queries finish within 2 x their idle latency; ``agentflow.sim.experiment.goodput``;
slow). ``--scale N`` repeats every instance entry N times (and multiplies ``--rate``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from agentflow.bench.paths import SHARED

QUICK_ARGS: tuple[str, ...] = ("--queries", "200", "--shards", "1,4", "--sets", "trace2",
                               "--routes", "p2c")
SETS = {"trace2": (("trace2",), "poisson"), "mix-bursty": (("trace1", "trace2"), "gamma:2"),
        "trace1": (("trace1",), "poisson")}


def _trace(names: tuple[str, ...]) -> list[Any]:
    from agentflow.sim.workload import load_trace

    out = []
    for name in names:
        path = SHARED / "traces" / "hexgen-flow" / f"{name}.json"
        if not path.is_file():
            raise SystemExit(f"shared trace not found: {path}")
        out += load_trace(path, "auto")
    return out


def scaled(cluster: Any, scale: int) -> Any:
    """``cluster`` with every instance entry's count multiplied by ``scale``."""
    from agentflow.sim.cluster import SimClusterConfig

    if scale == 1:
        return cluster
    return SimClusterConfig(name=f"{cluster.name}x{scale}", instances=[
        inst.model_copy(update={"count": inst.count * scale}) for inst in cluster.instances])


def run_row(cluster: Any, workload: Any, k: int, route: str, slo_scale: float,
            summary_s: float = 0.5) -> dict[str, Any]:
    from agentflow.scheduler import shards
    from agentflow.sim.driver import Simulation

    sim = Simulation(cluster, "flowsage", coordinators=k, shard_route=route,
                     shard_summary_s=summary_s)
    wall = time.perf_counter()
    result = sim.run(workload.queries, workload.arrivals, workload.deadlines(slo_scale),
                     workload.idle_latency_s)
    wall = time.perf_counter() - wall
    summary = result.summary()
    coordinator: shards.ShardedCoordinator = sim.coordinator
    figures = coordinator.decision_figures()
    met = sum(r.status == "done" and r.latency_s is not None and r.slo_s is not None
              and r.latency_s <= r.slo_s + 1e-9 for r in result.records)
    span = max(workload.arrivals) - min(workload.arrivals) or 1.0
    busiest = max(range(k), key=lambda i: figures["busy_s"][i])
    return {"k": k, "route": route, "completed": summary["completed"],
            "queries": summary["queries"], "p50": summary["p50"], "p95": summary["p95"],
            "p99": summary["p99"], "in_slo": met / len(result.records),
            "goodput_qps": met / span, "events": figures["events"],
            "busy_s": figures["busy_s"], "routed": figures["routed"],
            "busiest_events": figures["events"][busiest],
            "busiest_s": figures["busy_s"][busiest],
            "decisions_per_s": figures["events_per_s"], "sim_wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentflow bench shards",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", default="hetero-64")
    p.add_argument("--scale", type=int, default=1, help="repeat each instance entry N times")
    p.add_argument("--shards", default="1,2,4,8")
    p.add_argument("--routes", default="p2c,hash")
    p.add_argument("--sets", default="trace2,mix-bursty")
    p.add_argument("--queries", type=int, default=800)
    p.add_argument("--rate", type=float, default=10.0,
                   help="queries/s on the unscaled cluster (x --scale)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--summary-s", type=float, default=0.5,
                   help="longest age of the shards' load summaries the router reads")
    p.add_argument("--slo-scale", type=float, default=2.0)
    p.add_argument("--search-goodput", action="store_true")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    from agentflow.scheduler.shards import ROUTES, check_shards
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.experiment import build_workload, goodput
    from agentflow.sim.slo import IdleLatency

    cluster = scaled(load_cluster(args.cluster), args.scale)
    n_inst = len(cluster.expanded())
    ks = [int(x) for x in args.shards.split(",")]
    for k in ks:
        check_shards(k, n_inst)
    routes = [r for r in args.routes.split(",") if r]
    for r in routes:
        if r not in ROUTES:
            p.error(f"unknown route {r!r}; choose from {', '.join(ROUTES)}")
    rate = args.rate * args.scale
    idle = IdleLatency(cluster)
    out: dict[str, Any] = {"cluster": cluster.name, "instances": n_inst, "rate": rate,
                           "queries": args.queries, "seed": args.seed, "sets": {}}
    for set_name in args.sets.split(","):
        if set_name not in SETS:
            p.error(f"unknown set {set_name!r}; choose from {', '.join(SETS)}")
        names, arrival = SETS[set_name]
        trace = _trace(names)
        wl = build_workload(trace, cluster, n=args.queries, rate=rate, arrival=arrival,
                            seed=args.seed, idle=idle)
        rows = []
        for k in ks:
            for route in (routes[:1] if k == 1 else routes):
                row = run_row(cluster, wl, k, route, args.slo_scale, args.summary_s)
                if args.search_goodput:
                    row["goodput_search_qps"] = goodput(
                        cluster, trace, "flowsage", n=args.queries, slo_scale=args.slo_scale,
                        seed=args.seed, idle=idle, low=rate / 8, iterations=5,
                        coordinators=k, shard_route=route)
                rows.append(row)
                print(f"  {set_name} K={k} {route}: done in {row['sim_wall_s']}s", flush=True)
        out["sets"][set_name] = rows
        print_set(set_name, arrival, rows, n_inst, rate, args.queries)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def print_set(name: str, arrival: str, rows: list[dict[str, Any]], n_inst: int, rate: float,
              queries: int) -> None:
    base = rows[0]
    print(f"\n{name}: {queries} queries, {arrival} at {rate:g} q/s, {n_inst} instances, "
          "flowsage")
    head = (f"{'K':>2} {'route':>5} {'done':>9} {'p50 s':>7} {'p95 s':>7} {'p95/K1':>7} "
            f"{'in SLO':>7} {'gput/K1':>7} {'ev(max)':>8} {'cpu s':>7} {'dec/s':>8} "
            f"{'x K1':>5}")
    if "goodput_search_qps" in base:
        head += f" {'goodput':>8} {'/K1':>5}"
    print(head)
    for r in rows:
        line = (f"{r['k']:>2} {r['route']:>5} {r['completed']:>4}/{r['queries']:<4} "
                f"{r['p50']:>7.1f} {r['p95']:>7.1f} {r['p95'] / base['p95']:>7.3f} "
                f"{r['in_slo']:>7.3f} {r['goodput_qps'] / base['goodput_qps']:>7.3f} "
                f"{r['busiest_events']:>8} {r['busiest_s']:>7.2f} "
                f"{r['decisions_per_s']:>8.0f} "
                f"{r['decisions_per_s'] / base['decisions_per_s']:>5.2f}")
        if "goodput_search_qps" in r:
            g, g1 = r["goodput_search_qps"], base["goodput_search_qps"]
            line += f" {g:>8.2f} {g / g1 if g1 else float('nan'):>5.2f}"
        print(line)


if __name__ == "__main__":
    raise SystemExit(main())
