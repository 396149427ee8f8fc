"""A grid of simulations serially and as Ray tasks, side by side: same numbers, wall-time ratio.

    agentflow bench ray_grid [--ray local|auto|HOST:6379] [--queries 60] [--goodput]

The grid is ``agentflow simulate``'s: every policy (with its goodput search under
``--goodput``) on one seeded workload, each policy one cell (``agentflow.cli.simulate.
policy_cell``). It runs once serially in this process and once as Ray tasks, then checks the
two result sets are identical (everything but each cell's own wall time) and prints the
wall-time ratio. The ratio is bounded by the CPUs Ray has and by the slowest cell; on a
shared 2-core machine it says little about a real cluster, where cells spread over nodes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.cli.simulate import PolicyCellInputs, policy_cell
from agentflow.distributed.grid import run_grid_timed
from agentflow.metrics import scale_key
from agentflow.sim.cluster import load_cluster
from agentflow.sim.experiment import build_workload
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import load_trace

TRACE = HEXGEN_TRACES / \
    "trace1.json"


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "20")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--cluster", default="paper-4gpu")
    p.add_argument("--policy", default="vllm,hexgen-flow,sagesched,flowsage")
    p.add_argument("--queries", type=int, default=60)
    p.add_argument("--rate", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goodput", action="store_true")
    p.add_argument("--ray", default="local", help="local (start one here) or an address")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)

    cluster = load_cluster(args.cluster)
    trace = load_trace(args.trace, "auto")
    idle = IdleLatency(cluster)
    inputs = PolicyCellInputs(
        cluster=cluster, trace=trace, idle=idle,
        workload=build_workload(trace, cluster, n=args.queries, rate=args.rate,
                                seed=args.seed, idle=idle),
        options={"slo_scale": 2.0, "alpha": None, "tune_alpha": False, "cached_prefix": 0.0,
                 "goodput": args.goodput, "queries": args.queries, "arrival": "poisson",
                 "seed": args.seed, "deadline": "fixed"})
    policies = [s.strip() for s in args.policy.split(",") if s.strip()]
    serial = run_grid_timed(policy_cell, policies, context=inputs)
    on_ray = run_grid_timed(policy_cell, policies, context=inputs, ray=args.ray)

    def numbers(results):
        return [{k: v for k, v in r.items() if k != "sim_wall_s"} for r in results]

    same = json.dumps(numbers(serial.results), sort_keys=True) == \
        json.dumps(numbers(on_ray.results), sort_keys=True)
    print(f"grid: {len(policies)} cells ({', '.join(policies)}), {args.queries} queries each"
          f"{', with goodput search' if args.goodput else ''}; this machine: "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"{'policy':<12} {'p95 s':>8} {'SLO@2':>6} {'cell s serial':>14} {'cell s ray':>11}")
    for pol, a, b in zip(policies, serial.results, on_ray.results):
        print(f"{pol:<12} {a['p95']:>8.1f} {a['slo_attainment'][scale_key(2.0)]:>6.2f} "
              f"{a['sim_wall_s']:>14.1f} {b['sim_wall_s']:>11.1f}")
    print(f"serial: {serial.wall_s:.1f} s; {on_ray.where}: {on_ray.wall_s:.1f} s; "
          f"wall-time ratio serial/ray = {serial.wall_s / on_ray.wall_s:.2f}x; "
          f"identical results: {same}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "policies": policies, "serial_s": serial.wall_s, "ray_s": on_ray.wall_s,
            "ray": on_ray.where, "identical": same, "results": numbers(serial.results)},
            indent=2))
    if not same:
        raise SystemExit("results differ between the serial and the Ray run")


if __name__ == "__main__":
    main()
