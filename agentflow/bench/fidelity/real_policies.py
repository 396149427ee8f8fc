"""Policies side by side on real engines and in the simulator, on the same arrivals.

    agentflow bench real_policies --cluster examples/cluster-llama-server-2cpu.yaml \\
        --trace ../shared/traces/hexgen-flow/trace1.json --rates 0.1 0.2 \\
        [--policy flowsage --policy sagesched --policy vllm] [--queries 30] [--scale 0.02]

Why: every policy ratio the project reports comes from the simulator; this runs the same
comparison with the real scheduler (``ScheduledRouter`` over the coordinator, the serving
path) driving real continuous-batching engines, and next to it the simulator on the same
cluster file, queries, arrivals and deadlines, so a ratio can be checked where it is made.

Workload: ``--queries`` queries of the trace (seeded draw, ``agentflow.sim.experiment``),
Poisson arrivals at each ``--rate``. Each query's DAG grows as its pipeline grew it
(``agentflow.sim.replay.GrowingDag``: the scheduler sees a stage only once serving would).
Every LLM call is a synthetic prompt of the recorded token count (times ``--scale``, rounded,
at least 1; then capped by ``--max-prompt``/``--max-output``) with ``max_tokens`` = the
recorded output and end of text ignored, so both sides do the same work; prompts are fresh
per policy run, so no run reuses another's prompt cache. Tool steps sleep their recorded
duration times ``--scale``. Deadlines: one fixed SLO per pipeline, ``--slo-scale`` x its
mean idle latency in the simulator (the simulator's default rule), the same on both sides.

Output: per rate and policy, real and simulated P95 and mean end-to-end latency, and each
policy's ratio to ``--base`` (default: the last ``--policy``, vllm) on each side. Policies
run one after another on the real engines, in the order given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.fidelity.probe import probe
from agentflow.bench.fidelity.real_vs_sim import (
    scaled,
    sim_engines,
)
from agentflow.event_loop import close_loop
from agentflow.llm.base import SamplingParams
from agentflow.scheduler import QueryRejected
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS
from agentflow.scheduler.health import HealthSettings
from agentflow.scheduler.serving import ScheduledRouter
from agentflow.scheduler.setup import build_coordinator
from agentflow.sim.cluster import SimClusterConfig, load_cluster
from agentflow.sim.experiment import Workload, build_workload, run_policy
from agentflow.sim.host_calibration import (
    PromptMaker,
    close_all,
    cpu_seconds,
    engine_limits,
    start_backends,
    tokenizer_of,
)
from agentflow.sim.replay import GrowingDag
from agentflow.sim.workload import TraceNode, TraceQuery, load_trace
from agentflow.workflow.clock import MonotonicClock
from agentflow.workflow.executor import execute
from agentflow.workflow.graph import Node, NodeKind, WorkflowRun
from agentflow.workflow.query import Query, QueryStatus

DEFAULT_POLICIES = ("flowsage", "sagesched", "vllm")


def scaled_trace(trace: list[TraceQuery], scale: float, max_prompt: int | None,
                 max_output: int | None) -> list[TraceQuery]:
    """The trace with every call's token counts (and tool durations) scaled, as both sides
    run it."""
    out = []
    for q in trace:
        nodes = [replace(n, prompt_tokens=scaled(n.prompt_tokens, scale, max_prompt),
                         output_tokens=scaled(n.output_tokens, scale, max_output),
                         max_tokens=None if n.max_tokens is None else
                         scaled(n.max_tokens, scale, max_output))
                 if n.kind == "llm" else replace(n, duration_s=n.duration_s * scale)
                 for n in q.nodes]
        out.append(replace(q, nodes=nodes))
    return out


def sim_cluster(path: str) -> SimClusterConfig:
    """The cluster file with each engine's limits as its backend really has them."""
    cluster = load_cluster(path)
    return cluster.model_copy(update={"instances": [engine_limits(i)
                                                    for i in cluster.instances]})


def latency_stats(latencies: list[float]) -> dict[str, float]:
    a = np.asarray(latencies)
    return {"p95_s": float(np.percentile(a, 95)), "mean_s": float(a.mean()),
            "n": int(a.size)}


# ---------------------------------------------------------------------------------- real
async def run_real(policy: str, cluster: SimClusterConfig, workload: Workload,
                   deadlines: list[float | None], backends: dict[str, Any],
                   maker: PromptMaker, health: HealthSettings | None = None,
                   preemption: str | None = None,
                   fast_lane: int | None = FAST_LANE_CALLS) -> dict[str, Any]:
    """One policy on the real engines: the serving router and coordinator, queries started
    at their arrival offsets, each query's graph grown as it was recorded. A workload with
    tenants (``build_tenant_workload``) sends each query with its tenant and SLO class, as
    serving does for an API key, and the result also holds each tenant's latencies
    (``by_tenant``); ``preemption``: ``scheduler.preemption`` (None: off); ``fast_lane``:
    ``scheduler.fast_lane`` (None: off)."""
    clock = MonotonicClock()
    coordinator = build_coordinator([cfg for _, cfg in cluster.expanded()], clock=clock,
                                    policy=policy, preemption=preemption,
                                    fast_lane=fast_lane)
    router = ScheduledRouter(coordinator, backends, health=health)
    timeouts: list[dict[str, Any]] = []

    def heard(request: Any, instance: str, err: Exception) -> None:
        """Why calls were cut: the limit, the instance's speed factor, the query's slack."""
        if "no answer within" not in str(err):
            return
        query = coordinator.queries.get(request.query_id)
        deadline = getattr(query, "deadline", None)
        timeouts.append({"t": clock.now() - t0, "instance": instance, "error": str(err),
                         "speed_factor": router.deadlines.speed_factor(instance),
                         "query_late": deadline is not None and clock.now() > deadline})

    router.attempt_listeners.append(heard)
    # Fresh prompts for this run, made before the clock starts.
    prompts = [{n.id: maker.make(n.prompt_tokens) for n in q.nodes if n.kind == "llm"}
               for q in workload.queries]
    latencies: list[float] = []
    by_tenant: dict[str, list[float]] = {}
    failed: list[str] = []
    t0 = clock.now()

    def make_node(qi: int, holder: dict[str, GrowingDag]):
        def node_of(n: TraceNode) -> Node:
            async def llm_stage(ctx: Any) -> Any:
                res = await ctx.llm(prompts[qi][n.id], SamplingParams(
                    max_tokens=n.output_tokens, temperature=0.0))
                if res.completion_tokens != n.output_tokens:
                    raise RuntimeError(f"{n.id}: {res.completion_tokens} tokens, asked for "
                                       f"{n.output_tokens} (ignore_eos not honoured?)")
                grow(ctx, n.id)
                return res.completion_tokens

            async def tool_stage(ctx: Any) -> Any:
                await asyncio.sleep(n.duration_s)
                grow(ctx, n.id)
                return None

            def grow(ctx: Any, node_id: str) -> None:
                exp = holder["dag"].expansion_after(node_id)
                if exp is not None:
                    ctx.expand(exp.nodes, exp.edges)

            if n.kind == "llm":
                hints = {} if n.max_tokens is None else {"max_tokens": n.max_tokens}
                return Node(n.id, n.stage, NodeKind.LLM, llm_stage, hints=hints)
            return Node(n.id, n.stage, NodeKind.TOOL, tool_stage, expected_s=n.duration_s)
        return node_of

    async def one(qi: int) -> None:
        await asyncio.sleep(max(0.0, workload.arrivals[qi] - (clock.now() - t0)))
        trace = workload.queries[qi]
        holder: dict[str, GrowingDag] = {}
        dag = holder["dag"] = GrowingDag(trace, make_node(qi, holder))
        tenant = workload.tenants[qi] if workload.tenants else None
        slo_class = workload.classes[qi] if workload.classes else None
        query = Query(question=trace.question, db_id="", arrival=clock.now(),
                      slo_s=deadlines[qi], id=f"{qi}:{trace.id}", tenant=tenant,
                      slo_class=slo_class)
        run = WorkflowRun(query, dag.initial_graph())
        try:
            router.start_query(query, run)
        except QueryRejected as err:
            failed.append(f"{query.id}: rejected ({err.reason})")
            return
        try:
            await execute(run, router, env=None)
        finally:
            router.end_query(query)
        if query.status != QueryStatus.DONE or query.finished is None:
            failed.append(f"{query.id}: {query.status.value} ({query.error})")
            return
        latency = query.finished - query.arrival
        latencies.append(latency)
        by_tenant.setdefault(tenant or "", []).append(latency)

    wall = time.perf_counter()
    cpu0 = {n: cpu_seconds(b) for n, b in backends.items()}
    await asyncio.gather(*(one(i) for i in range(len(workload.queries))))
    wall = time.perf_counter() - wall
    # CPU seconds each server used over the run's wall time: how much of its core it got
    # (and needed) while the policy ran, so runs under different machine load can be told
    # apart.
    core_use = {}
    for n, b in backends.items():
        used, start = cpu_seconds(b), cpu0[n]
        if used is not None and start is not None:
            core_use[n] = round((used - start) / wall, 3)
    retried = sum(v for (kind, _), v in router.counts.items() if kind == "retried")
    for t in timeouts[:12]:
        print(f"    timeout at {t['t']:.1f} s on {t['instance']}: {t['error']}; speed factor "
              f"{t['speed_factor']:.2f}, query past its deadline: {t['query_late']}")
    return {**latency_stats(latencies), "by_tenant": by_tenant,
            "preempted": sum(router.preempted.values()), "failed": failed, "retried": retried,
            "timeouts": len(timeouts), "timeout_details": timeouts,
            "wall_s": wall, "core_use": core_use}


# ---------------------------------------------------------------------------------- main
def ratios(rows: dict[str, dict[str, Any]], base: str) -> dict[str, dict[str, float]]:
    b = rows[base]
    return {p: {"p95": r["p95_s"] / b["p95_s"], "mean": r["mean_s"] / b["mean_s"]}
            for p, r in rows.items()}


def print_rate(rate: float, real: dict[str, Any] | None, sim: dict[str, Any], base: str
               ) -> None:
    s_ratio = ratios(sim, base)
    r_ratio = ratios(real, base) if real else None
    print(f"## rate {rate}/s  (ratios to {base}; real | sim)")
    print(f"{'policy':>10} {'real P95':>9} {'real mean':>9} {'sim P95':>8} {'sim mean':>8} "
          f"{'P95 ratio':>17} {'mean ratio':>17}")
    for p, s in sim.items():
        r = real[p] if real else None
        rp = f"{r['p95_s']:9.1f} {r['mean_s']:9.1f}" if r else f"{'-':>9} {'-':>9}"
        rr = r_ratio[p] if r_ratio else None
        p95 = f"{rr['p95']:.3f} | " if rr else "  - | "
        mean = f"{rr['mean']:.3f} | " if rr else "  - | "
        print(f"{p:>10} {rp} {s['p95_s']:8.1f} {s['mean_s']:8.1f} "
              f"{p95 + format(s_ratio[p]['p95'], '.3f'):>17} "
              f"{mean + format(s_ratio[p]['mean'], '.3f'):>17}"
              + (f"  ({len(r['failed'])} failed, {r['retried']} retried, "
                 f"{r.get('timeouts', 0)} deadline timeouts, "
                 f"{r['wall_s']:.0f} s wall)" if r else ""))


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "8")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", required=True)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--rates", type=float, nargs="+", required=True)
    ap.add_argument("--policy", action="append", dest="policies",
                    help="repeatable; the last one is the ratios' base (default: "
                    f"{' '.join(DEFAULT_POLICIES)})")
    ap.add_argument("--base", help="the policy ratios are taken to (default: the last "
                    "--policy); policies run in the order given, so reversing it shows how "
                    "much the machine's load drifting between runs moves a ratio")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--scale", type=float, default=0.02)
    ap.add_argument("--max-prompt", type=int)
    ap.add_argument("--max-output", type=int)
    ap.add_argument("--slo-scale", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sim-only", action="store_true", help="skip the real engines")
    ap.add_argument("--deadline-speed-quantile", default="0.9",
                    help="scheduler.health.deadline_speed_quantile for the real runs "
                    "('off': call deadlines priced at the time model's mean speed alone)")
    ap.add_argument("--tokenizer", help="as in real_vs_sim.py")
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args(argv)
    policies = args.policies or list(DEFAULT_POLICIES)
    base = args.base or policies[-1]
    if base not in policies:
        ap.error(f"--base {base} is not among the policies")
    if not 0 < args.scale <= 1 or args.queries < 1:
        ap.error("--scale must be in (0, 1] and --queries >= 1")
    cluster = sim_cluster(args.cluster)
    trace = scaled_trace(load_trace(args.trace), args.scale, args.max_prompt, args.max_output)
    print(f"# {args.queries} queries of {args.trace}, tokens x{args.scale} (caps: prompt "
          f"{args.max_prompt}, output {args.max_output}), SLO {args.slo_scale} x the "
          f"pipeline's idle latency, policies {', '.join(policies)}, instances "
          f"{', '.join(n for n, _ in cluster.expanded())}")
    results: dict[str, Any] = {"args": vars(args), "rates": {}}
    backends: dict[str, Any] = {}
    loop = asyncio.new_event_loop()
    try:
        maker = None
        q = args.deadline_speed_quantile
        health = HealthSettings(deadline_speed_quantile=None if q == "off" else float(q))
        if not args.sim_only:
            backends = start_backends(args.cluster)
            maker = PromptMaker(tokenizer_of(backends, args.tokenizer), args.seed)

        def fresh(name: str) -> Any:
            return sim_engines(args.cluster)[name]
        for rate in args.rates:
            w = build_workload(trace, cluster, n=args.queries, rate=rate, seed=args.seed)
            deadlines = w.deadlines(args.slo_scale)
            calls = sum(q.llm_calls for q in w.queries)
            print(f"# rate {rate}/s: {calls} LLM calls, arrivals over {w.arrivals[-1]:.0f} s, "
                  f"SLO {np.mean(deadlines):.1f} s", flush=True)
            sim = {}
            for p in policies:
                res = run_policy(cluster, w, p, slo_scale=args.slo_scale)
                sim[p] = latency_stats([r.latency_s for r in res.records
                                        if r.latency_s is not None])
            real = None
            if maker is not None:
                real = {}
                for p in policies:
                    # How fast each engine is against its profile right before the run
                    # (real_vs_sim's probes; the VM's speed drifts): a policy ratio between runs
                    # on a machine that moved is read next to these.
                    before = loop.run_until_complete(probe(backends, maker.make, fresh))
                    real[p] = loop.run_until_complete(run_real(p, cluster, w, deadlines,
                                                               backends, maker, health))
                    real[p]["probe_before"] = before
                    print(f"  real {p}: P95 {real[p]['p95_s']:.1f} s, mean "
                          f"{real[p]['mean_s']:.1f} s, {real[p]['wall_s']:.0f} s wall, "
                          f"core use {real[p]['core_use']}, load average "
                          f"{os.getloadavg()[0]:.1f}, probes real/sim before "
                          + ", ".join(f"{n} {f:.3f}" for n, f in before.items()), flush=True)
                after = loop.run_until_complete(probe(backends, maker.make, fresh))
                print("  probes real/sim after the last run: "
                      + ", ".join(f"{n} {f:.3f}" for n, f in after.items()), flush=True)
            print_rate(rate, real, sim, base)
            results["rates"][str(rate)] = {"real": real, "sim": sim}
    finally:
        if backends:
            loop.run_until_complete(close_all(backends))
        close_loop(loop)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
