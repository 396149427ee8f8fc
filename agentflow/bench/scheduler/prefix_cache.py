"""Prefix caching and cache-aware dispatch on agentflow traces that carry prompt text.

1. ``--record DIR``: record traces by running the real pipelines (chess, macsql, single) on
   the demo database with the scripted backend — NOT a model: the prompts are the pipelines'
   real prompts with the real schema text, the answers are scripted (gold SQL, short), so
   output lengths are short and say nothing about a model's. Traces land in DIR/traces/.
2. Every policy with the cache off (``--cached-prefix 0``) and on (``auto``) on the same
   arrivals, at a loaded rate: 1.5 x L1, L1 = the lowest rate where vllm's P95 is at least
   2 x its idle P95 (as ``policy_suite.py``; nothing is fitted to a trace). Prints P95 / mean
   / SLO attainment at 2 x idle, and the engines' prefix hit rate.
3. ``--speed N``: simulator wall and CPU seconds for N queries with the cache modelled.

    agentflow bench prefix_cache --record artifacts/prefix/rec
    agentflow bench prefix_cache --traces 'artifacts/prefix/rec/traces/*.jsonl' --speed 1000
"""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

from agentflow.bench.scheduler.policy_suite import find_l1
from agentflow.metrics import scale_key
from agentflow.sim.cluster import load_cluster
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import build_workload
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import load_agentflow

POLICIES = "marginal_delay+fcfs,cache_aware+fcfs,flowsage,cache_aware+flowsage"


def record(out: Path, seed: int) -> None:
    from agentflow.config import AgentFlowConfig
    from agentflow.datasets import load_dataset
    from agentflow.evaluation import run_eval
    from agentflow.llm.scripted import ScriptedBackend

    gold = {e.question: e.gold_sql for e in load_dataset("demo").examples}
    questions = sorted(gold, key=len, reverse=True)

    def script(request) -> str:  # the gold SQL of the question the prompt is about
        sql = next((gold[q] for q in questions if q in request.prompt), "SELECT 1")
        if request.stage in ("generate_sql", "generate_candidate", "revise", "refine"):
            return sql
        if request.stage == "decomposer":
            return " the question\n-- SQL:\n" + sql
        return {"extract_keywords": "stores, books", "selector": " stores, books"}.get(
            request.stage, " yes")

    run_eval("demo", out=out, pipelines="chess,macsql,single", policies="vllm", seed=seed,
             config=AgentFlowConfig(fewshot=None), progress=False, plots=False,
             backends=lambda p, pol: {"scripted-0": ScriptedBackend(script, latency_s=0.002)})
    print(f"recorded: {', '.join(sorted(glob.glob(str(out / 'traces' / '*.jsonl'))))}")


def simulate(cluster, wl, policy: str, mode, slo_scale: float):
    sim = Simulation(cluster, policy, cached_prefix=mode)
    start, cpu = time.perf_counter(), time.process_time()
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(slo_scale), wl.idle_latency_s)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    looked = sum(e.prefix_lookup_tokens for e in sim.instances.values())
    hit = sum(e.prefix_hit_tokens for e in sim.instances.values())
    return result.summary(), hit / looked if looked else 0.0, wall, cpu, result.events


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "60")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", type=Path, help="record traces into this directory and stop")
    ap.add_argument("--traces", help="glob of agentflow JSONL traces (mixed into one workload)")
    ap.add_argument("--cluster", default="paper-4gpu")
    ap.add_argument("--policies", default=POLICIES)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--load", type=float, default=1.5, help="rate as a multiple of L1")
    ap.add_argument("--rate", type=float, help="fixed rate instead of the L1 search")
    ap.add_argument("--cache-l1", action="store_true",
                    help="search L1 with the prefix cache modelled (loads the cached system)")
    ap.add_argument("--slo-scale", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--speed", type=int, default=0, help="also time this many queries")
    args = ap.parse_args(argv)
    if args.record:
        record(args.record, args.seed)
        return
    paths = sorted(glob.glob(args.traces or ""))
    if not paths:
        ap.error("--traces matched no file (record some with --record DIR)")
    trace = [q for p in paths for q in load_agentflow(p)]
    with_text = sum(n.prompt_text is not None for q in trace for n in q.nodes if n.kind == "llm")
    calls = sum(n.kind == "llm" for q in trace for n in q.nodes)
    print(f"{len(trace)} queries from {len(paths)} traces; {with_text}/{calls} calls carry text")
    cluster = load_cluster(args.cluster)
    idle = IdleLatency(cluster)  # cold: the same deadlines with the cache on and off
    if args.rate:
        rate = args.rate
    else:
        t0 = time.perf_counter()
        l1 = find_l1(trace, cluster, idle, n=min(args.queries, 200), seed=args.seed,
                     cached_prefix="auto" if args.cache_l1 else 0.0)
        rate = args.load * l1
        searched_s = time.perf_counter() - t0
        print(f"L1{' (cache on)' if args.cache_l1 else ''} = {l1:.3g} q/s "
              f"(search {searched_s:.0f} s); rate = {args.load:g} x L1 = {rate:.3g} q/s")
    wl = build_workload(trace, cluster, n=args.queries, rate=rate, seed=args.seed, idle=idle)
    key = scale_key(args.slo_scale)
    print(f"\n{args.cluster}, {args.queries} queries at {rate:.3g} q/s (Poisson, seed "
          f"{args.seed}), deadlines {args.slo_scale:g} x idle")
    print(f"{'policy':26} {'cache':5} {'P95 s':>8} {'mean s':>8} {'SLO':>6} {'hit':>6} "
          f"{'P95 on/off':>10} {'mean on/off':>11}")
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        rows = {}
        for mode in (0.0, "auto"):
            s, hit, wall, cpu, _ = simulate(cluster, wl, policy, mode, args.slo_scale)
            rows[mode] = s
            label = "on" if mode == "auto" else "off"
            off = rows[0.0]
            ratio = (f"{s['p95'] / off['p95']:10.3f} {s['mean'] / off['mean']:11.3f}"
                     if mode == "auto" else "")
            print(f"{policy:26} {label:5} {s['p95']:8.2f} {s['mean']:8.2f} "
                  f"{s['slo_attainment'][key]:6.2f} {hit:6.1%} {ratio}")
    if args.speed:
        wl = build_workload(trace, cluster, n=args.speed, rate=rate, seed=args.seed, idle=idle)
        for policy in ("vllm", "cache_aware+flowsage"):
            for mode in (0.0, "auto"):
                _, hit, wall, cpu, events = simulate(cluster, wl, policy, mode, args.slo_scale)
                print(f"speed: {args.speed} queries, {policy}, cache "
                      f"{'on' if mode == 'auto' else 'off'}: {wall:.1f} s wall, {cpu:.1f} s "
                      f"CPU, {events} events, hit rate {hit:.1%}")


if __name__ == "__main__":
    main()
