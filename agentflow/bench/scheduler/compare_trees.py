"""The head-to-head cells on two source trees side by side: what a change did to each policy.

    git archive BASE | tar -x -C /tmp/before && git archive HEAD | tar -x -C /tmp/after
    agentflow bench compare_trees /tmp/before /tmp/after [--queries 100]

Each tree runs in its own process (its own ``agentflow``) on the same cells: both shared
HexGen-Flow traces on ``paper-4gpu``, the load levels of ``head_to_head.py`` (the lowest rate
at which ``vllm``'s P95 is 2x its idle P95, then x1.25 and x1.5), seeded arrivals, deadlines
2x idle latency. Alpha stays at its default (no online tuning, no goodput search: those make
``head_to_head.py`` take about an hour on a small host). Prints P95 and SLO attainment per
cell and the geometric mean of vllm/policy P95 ratios per policy, for each tree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from agentflow.bench.paths import HEXGEN_TRACES

TRACES = HEXGEN_TRACES

_CELLS = r'''
import importlib.util, json, sys
from pathlib import Path
tree, traces = Path(sys.argv[1]), sys.argv[2].split(",")
n, seed = int(sys.argv[3]), int(sys.argv[4])
spec = importlib.util.spec_from_file_location("h2h", tree / "benchmarks" / "head_to_head.py")
h2h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h2h)
from argparse import Namespace
from agentflow.sim.cluster import load_cluster
from agentflow.sim.experiment import build_workload, run_policy
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import load_hexgen
args = Namespace(queries=n, seed=seed, slo_scale=2.0, cluster="paper-4gpu")
cluster = load_cluster("paper-4gpu"); idle = IdleLatency(cluster)
out = {}
for path in traces:
    trace = load_hexgen(path); name = Path(path).stem
    base = h2h.find_level(cluster, trace, args, idle)
    for level, rate in (("L1", base), ("L2", base * 1.25), ("L3", base * 1.5)):
        wl = build_workload(trace, cluster, n=n, rate=rate, seed=seed, idle=idle)
        for policy in h2h.POLICIES:
            s = run_policy(cluster, wl, policy, slo_scale=2.0).summary()
            att = s["slo_attainment"]
            out[f"{name} {level} {policy}"] = {"rate": rate, "p95": s["p95"],
                                               "slo2": att.get("2", att.get("2.0"))}
            print(name, level, policy, round(s["p95"], 1), file=sys.stderr, flush=True)
print(json.dumps(out))
'''


def cells(tree: Path, traces: list[str], queries: int, seed: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _CELLS, str(tree), ",".join(traces),
                           str(queries), str(seed)], env=env, cwd=tree, check=True,
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "30")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trees", nargs=2, type=Path, help="two source trees: before, after")
    p.add_argument("--traces", nargs="*", default=[str(TRACES / "trace1.json"),
                                                   str(TRACES / "trace2.json")])
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    before, after = (cells(t.resolve(), args.traces, args.queries, args.seed)
                     for t in args.trees)
    policies = list(dict.fromkeys(k.rsplit(" ", 1)[1] for k in before))
    keys = sorted({k.rsplit(" ", 1)[0] for k in before})
    print("| cell (rate q/s) | " + " | ".join(policies) + " |")
    print("|---|" + "---|" * len(policies))
    for cell in keys:
        row = [f"{before[f'{cell} {q}']['p95']:.0f} → {after[f'{cell} {q}']['p95']:.0f} "
               f"({before[f'{cell} {q}']['slo2']:.2f} → {after[f'{cell} {q}']['slo2']:.2f})"
               for q in policies]
        print(f"| {cell} ({before[f'{cell} vllm']['rate']:.4f}) | " + " | ".join(row) + " |")
    print("\ngeometric mean of P95 vllm/policy: " + ", ".join(
        f"{q} {gm(before, keys, q):.3f} → {gm(after, keys, q):.3f}" for q in policies[1:]))


def gm(res: dict, keys: list[str], policy: str) -> float:
    logs = [math.log(res[f"{c} vllm"]["p95"] / res[f"{c} {policy}"]["p95"]) for c in keys]
    return math.exp(sum(logs) / len(logs))


if __name__ == "__main__":
    main()
