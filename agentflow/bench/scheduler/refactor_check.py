"""Does a refactor of the scheduler change any simulated result? Run this before and after,
then compare the two output folders byte for byte.

    agentflow bench refactor_check OUT            # write OUT/*.json
    agentflow bench refactor_check OUT --compare BEFORE   # ... and diff against BEFORE

Why both kinds of output: ``agentflow simulate --json`` is what users read (aggregates), and
the per-stage timings of ``Simulation(on_stage=...)`` catch a change that happens to leave
the aggregates alone (two calls swapped in one queue). Small runs (tens of queries) on two
traces, two clusters (a cluster file and a named mixed one), every preset, a few
``DISPATCH+QUEUE`` pairs, an instance fault, alpha tuning, and the ablation queues of
``agentflow bench flowsage_ablations`` on that script's code path (``run_policy``). Floats are
written with ``repr``, so "the same bytes" means the same to the last digit.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.sim.cluster import load_cluster
from agentflow.sim.driver import Simulation, StageTiming
from agentflow.sim.experiment import build_workload, run_policy
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import load_hexgen

ROOT = Path(__file__).resolve().parents[3]
TRACES = HEXGEN_TRACES

PRESETS = ("flowsage", "sagesched", "hexgen-flow", "llf", "vllm", "oracle")
PAIRS = ("least_loaded+edf", "earliest_finish+gittins", "cache_aware+fcfs",
         "workload_balanced+flowsage", "least_loaded+urgency")
ABLATIONS = ("least_loaded+flowsage_v1", "least_loaded+query_gittins",
             "marginal_delay+query_srpt", "marginal_delay+flowsage_call",
             "marginal_delay+flowsage_laxity")
CLUSTERS = {"4gpu-file": str(ROOT / "examples" / "cluster-4gpu.yaml"),
            "mixed-qwen": "mixed-qwen"}
QUERIES = 30
RATE = 0.2
SEED = 1


def register_ablations() -> None:
    """The ablation queues, as ``flowsage_ablations.py`` gets them (a no-op on a tree where
    they are still built into the product's registry)."""
    try:
        from agentflow.bench.scheduler.ablation_queues import register_ablation_queues
    except ImportError:
        return
    register_ablation_queues()


def cli_runs(out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs: dict[str, list[str]] = {}
    for trace in ("trace1", "trace2"):
        for cname, cluster in CLUSTERS.items():
            runs[f"cli_{trace}_{cname}"] = [
                "--trace", str(TRACES / f"{trace}.json"), "--cluster", cluster,
                "--policy", ",".join(PRESETS + PAIRS), "--queries", str(QUERIES),
                "--rate", str(RATE), "--seed", str(SEED)]
    trace1 = str(TRACES / "trace1.json")
    runs["cli_trace1_mixed-qwen_fault_gamma_idle"] = [
        "--trace", trace1, "--cluster", "mixed-qwen", "--policy", ",".join(PRESETS),
        "--queries", str(QUERIES), "--rate", str(RATE), "--seed", str(SEED),
        "--arrival", "gamma:3", "--deadline", "idle-scaled", "--slo-scale", "1.5",
        "--fault", "down:h200-0@60", "--fault", "up:h200-0@200"]
    runs["cli_trace2_paper_tune_alpha"] = [
        "--trace", str(TRACES / "trace2.json"), "--cluster", "paper-4gpu",
        "--policy", "hexgen-flow", "--queries", str(QUERIES), "--rate", str(RATE),
        "--seed", str(SEED), "--tune-alpha"]
    for name, args in runs.items():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "agentflow", "simulate", *args,
                        "--json", str(out / f"{name}.json")],
                       check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        print(f"{name}: {time.perf_counter() - t0:.1f}s", flush=True)


def stage_row(s: StageTiming) -> list[Any]:
    return [s.query_id, s.node_id, s.stage, s.kind, list(s.parents), repr(s.start),
            repr(s.end), repr(s.queue_s), repr(s.run_s), s.instance, s.prompt_tokens,
            s.output_tokens]


def api_runs(out: Path) -> None:
    traces = {t: load_hexgen(TRACES / f"{t}.json") for t in ("trace1", "trace2")}
    for cname, cluster_ref in CLUSTERS.items():
        cluster = load_cluster(cluster_ref)
        idle = IdleLatency(cluster)
        for tname, trace in traces.items():
            t0 = time.perf_counter()
            wl = build_workload(trace, cluster, n=QUERIES, rate=RATE, seed=SEED, idle=idle)
            doc: dict[str, Any] = {}
            for policy in ("flowsage", "oracle", "hexgen-flow", "sagesched") + ABLATIONS:
                if policy in ABLATIONS:  # flowsage_ablations.py's path
                    result = run_policy(cluster, wl, policy, slo_scale=2.0)
                    stages: list[list[Any]] = []
                else:
                    seen: list[StageTiming] = []
                    sim = Simulation(cluster, policy, on_stage=seen.append)
                    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0),
                                     wl.idle_latency_s)
                    stages = [stage_row(s) for s in seen]
                doc[policy] = {
                    "records": [[r.id, r.status, repr(r.finish), r.reason, r.calls]
                                for r in result.records],
                    "events": result.events, "stages": stages,
                    "summary": result.summary()}
            (out / f"api_{tname}_{cname}.json").write_text(
                json.dumps(doc, indent=0, sort_keys=True))
            print(f"api {tname} {cname}: {time.perf_counter() - t0:.1f}s", flush=True)


def compare(out: Path, before: Path) -> bool:
    names = sorted({p.name for p in out.glob("*.json")} | {p.name for p in before.glob("*.json")})
    same = True
    for name in names:
        a, b = out / name, before / name
        ok = a.exists() and b.exists() and filecmp.cmp(a, b, shallow=False)
        same &= ok
        print(f"{'identical' if ok else 'DIFFERENT'}  {name}")
    print(f"{len(names)} files: {'all byte-identical' if same else 'DIFFERENCES'}")
    return same


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--compare", type=Path, help="an earlier OUT to diff against")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    register_ablations()
    cli_runs(args.out)
    api_runs(args.out)
    if args.compare is not None and not compare(args.out, args.compare):
        sys.exit(1)


if __name__ == "__main__":
    main()
