"""Cost of one scheduling decision (dispatch + queue) as the waiting queue grows.

    agentflow bench scheduler_overhead [--sizes 10,1000,10000] [--repeat 200]
        [--clusters hetero-64,hetero-1024,hetero-4096 | --cluster FILE ...] [--no-learn]
        [--check] [--clock wall|cpu] [--json FILE] [--against CHECKOUT [--pairs 3]]

A cluster (a name: ``paper-4gpu``, four GPUs serving Llama-3.1-70B; ``hetero-64``, 64
Llama-3.1-8B instances on five GPU kinds; ``hetero-1024`` and ``hetero-4096``, that mix 16
and 64 times over; or a cluster file, as ``agentflow simulate --cluster`` reads) is filled
with N waiting calls from N/20 queries,
each query a 20-call CHESS-shaped workflow, so time-dependent policies (urgency, llf,
flowsage) see real critical paths. Then, repeatedly, a call of one of the queries becomes
ready (dispatch + enqueue) and one running call finishes (its query is re-keyed and the queue
picks the next call to admit), while the clock advances, so moving keys really move.
Each finished call reports its time-to-first-token and total time (0.2 s and 2 s), as
serving and the simulator do, so the instance's time model learns at every finish, as it
does in a real run (``--no-learn``: report no times, the cost of a model that never learns).
Prints median and p99 microseconds per decision for every preset plus ``least_loaded+edf``,
and, for two clusters or more, how the cost grows from the smallest to each larger one (the
ratio of p99s at the largest size).
Timed from outside the scheduler with perf_counter; the scheduler itself reads no clock.
``--check`` also asserts at every pick that the O(log n) queue chose the same call as the
O(n) reference scan (slow; for verification, not timing). ``--json FILE`` writes every
cell's median and p99 (microseconds) as JSON.

``--against CHECKOUT``: before/after on one busy machine. This file's measurement runs in
child processes, alternately on the scheduler of CHECKOUT (another checkout of the repository,
say a worktree of main: the "before") and on this one (the "after"), ``--pairs`` times, each
pair back to back, so both sides see the same load; it prints, per cell, the median over the
pairs of each side's median and p99, the median of the per-pair after/before ratios, the
pooled p99 of each side (the 99th percentile of all its pairs' rounds together: with 200
rounds a run's own p99 is its 2nd-largest round, which one slow round moves) and the
load average (``os.getloadavg``) around each run. Only the scheduler differs between the two
sides: the workload is this file's.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import networkx as nx

from agentflow.scheduler import PRESETS, Coordinator, InstanceSpec
from agentflow.scheduler.decisions import StartCall
from agentflow.scheduler.lengths.learned import LearnedLengthModel
from agentflow.sim.cluster import load_cluster
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun

WARMUP = 5
STAGES = ["extract_keywords"] + ["generate_candidate"] * 5 + ["revise"] * 6 + \
    ["generate_unit_test"] + ["evaluate"] * 7


def workflow(query_id: str, deadline: float) -> WorkflowRun:
    async def noop(ctx):
        return None
    g = nx.DiGraph()
    nodes = [Node(f"{query_id}.{i}", s, NodeKind.LLM, noop, hints={"prompt_tokens": 1500})
             for i, s in enumerate(STAGES)]
    for n in nodes:
        g.add_node(n.id, node=n)
    g.add_edge(nodes[0].id, nodes[1].id)
    for cand in nodes[1:6]:  # fan-out of candidates, each with a revision, then tests
        g.add_edge(nodes[0].id, cand.id)
    for i in range(6, 12):
        g.add_edge(nodes[1 + (i - 6) % 5].id, nodes[i].id)
        g.add_edge(nodes[i].id, nodes[12].id)
    for i in range(13, 20):
        g.add_edge(nodes[12].id, nodes[i].id)
    return WorkflowRun(Query("q", "db", arrival=0.0, slo_s=deadline, id=query_id), g)


def specs_for(cluster: str) -> list[InstanceSpec]:
    """One admission slot per instance, so nearly every call waits in a queue."""
    return [InstanceSpec(name, cfg.gpu, cfg.model, max_inflight=1,
                         weight_bits=cfg.weight_bits, kv_bits=cfg.kv_bits,
                         tensor_parallel=cfg.tensor_parallel)
            for name, cfg in load_cluster(cluster).expanded()]


# What a finished call reports when the benchmark learns (serving and the simulator send both).
TTFT_S, TOTAL_S = 0.2, 2.0


def measure(policy: str, waiting: int, repeat: int, cluster: str = "paper-4gpu",
            check: bool = False, timer=time.perf_counter, learn: bool = True,
            log: list[tuple[str, str, int]] | None = None) -> list[float]:
    """Seconds per decision of each timed round; ``log``: also collect every start the
    timed rounds decide, as (call id, instance, backend priority), so two runs (or two
    schedulers) can be compared decision for decision."""
    clock = ManualClock(0.0)
    specs = specs_for(cluster)
    c = Coordinator(specs, clock=clock, policy=policy, length_model=LearnedLengthModel())
    for q in c.queues.values():
        q.check_reference = check
    n_queries = max(1, waiting // len(STAGES))
    running = []
    made = 0
    for q in range(n_queries + 1):
        run = workflow(f"q{q}", 30.0 + q % 50)
        c.on_query_arrival(f"q{q}", deadline=30.0 + q % 50, key_text=f"question {q % 97}",
                           run=run)
        for node in [run.node(n) for n in run.graph]:
            if made >= waiting + len(specs):
                break
            call, decisions = c.on_call_ready(f"q{q}", stage=node.stage, node_id=node.id,
                                              prompt_tokens=1500)
            running += [d.call for d in decisions]
            made += 1
    # Collect what earlier measurements left behind (a 10,000-call coordinator is a large
    # object graph) before timing, so its collection does not land in this one's p99.
    gc.collect()
    costs = []
    for i in range(repeat + WARMUP):
        clock.advance(0.01)
        q = f"q{(i * 7) % (n_queries + 1)}"
        start = timer()
        # a node id of its own (a revision outside the graph): re-readying one of the
        # graph's nodes would give the query two calls of one node, and which of them the
        # critical path reads would follow the set's order, so decisions would vary run to run
        call, decisions = c.on_call_ready(q, stage="revise", node_id=f"{q}.r{i}",
                                          prompt_tokens=900)
        running += [d.call for d in decisions]
        done = running.pop(0)
        times = {"ttft_s": TTFT_S, "total_s": TOTAL_S} if learn else {}
        admitted = c.on_call_done(done, output_tokens=80, **times)
        running += [d.call for d in admitted]
        if i >= WARMUP:  # the first rounds fill cold per-query caches once
            costs.append((timer() - start) / 2)  # two decisions per round
            if log is not None:
                log += [(d.call.id, d.instance, d.priority)
                        for d in (*decisions, *admitted) if isinstance(d, StartCall)]
    return costs


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--sizes", "10,1000", "--repeat", "20",
                               "--clusters", "paper-4gpu,hetero-64")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,1000,10000")
    p.add_argument("--repeat", type=int, default=200)
    p.add_argument("--clusters", default="hetero-64,hetero-1024,hetero-4096",
                   help="comma-separated cluster names or cluster files")
    p.add_argument("--cluster", action="append", default=[], metavar="FILE",
                   help="a cluster file (or name); repeatable; replaces --clusters")
    p.add_argument("--no-learn", action="store_true",
                   help="finished calls report no times, so no time model learns")
    p.add_argument("--policies", default=",".join([*PRESETS, "least_loaded+edf"]))
    p.add_argument("--check", action="store_true")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this process's CPU time (time.process_time), which a machine "
                        "shared with other jobs does not inflate; wall: perf_counter")
    p.add_argument("--json", metavar="FILE", help="write every cell's median and p99 here")
    p.add_argument("--against", metavar="CHECKOUT",
                   help="another checkout: measure its scheduler and this one alternately")
    p.add_argument("--pairs", type=int, default=3, help="with --against: before/after pairs")
    args = p.parse_args(argv)
    if args.against:
        child = [a for a in (argv if argv is not None else sys.argv[1:])]
        compare(args.against, _without(child, ("--against", "--pairs", "--json")),
                args.pairs, args.json)
        return
    timer = time.process_time if args.clock == "cpu" else time.perf_counter
    sizes = [int(s) for s in args.sizes.split(",")]
    clusters = args.cluster or args.clusters.split(",")
    policies = args.policies.split(",")
    p99s: dict[tuple[str, str], float] = {}
    cells_out: list[dict[str, object]] = []
    names = {c: load_cluster(c).name for c in clusters}  # a file's own name, not its path
    for cluster in clusters:
        n_inst = len(specs_for(cluster))
        print(f"\ncluster {names[cluster]} ({n_inst} instances), microseconds per decision "
              f"({args.clock} clock, {'no learning' if args.no_learn else 'learning'})")
        print(f"{'policy':<20}" + "".join(f"{f'{n} waiting':>24}" for n in sizes))
        print(f"{'':<20}" + "".join(f"{'median / p99':>24}" for _ in sizes))
        for policy in policies:
            cells = []
            for n in sizes:
                costs = sorted(measure(policy, n, args.repeat, cluster, args.check, timer,
                                       learn=not args.no_learn))
                med = statistics.median(costs) * 1e6
                p99 = costs[min(len(costs) - 1, int(0.99 * len(costs)))] * 1e6
                p99s[cluster, policy] = p99  # the last (largest) size
                cells_out.append({"cluster": names[cluster], "instances": n_inst,
                                  "policy": policy, "waiting": n, "median_us": med,
                                  "p99_us": p99, "costs_us": [x * 1e6 for x in costs]})
                cells.append(f"{med:>11.0f} / {p99:<10.0f}")
            print(f"{policy:<20}" + "".join(f"{c:>24}" for c in cells), flush=True)
    if len(clusters) > 1:
        print(f"\ngrowth of the p99 at {sizes[-1]} waiting, {names[clusters[0]]} -> "
              + " -> ".join(names[c] for c in clusters[1:]))
        for policy in policies:
            base = p99s[clusters[0], policy]
            print(f"{policy:<20}" + "".join(f"{p99s[c, policy] / base:>10.2f}x"
                                            for c in clusters[1:]))
    if args.json:
        Path(args.json).write_text(json.dumps({"clock": args.clock, "cells": cells_out},
                                              indent=1))


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` less ``options`` and their values (``--opt V`` or ``--opt=V``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


def pooled_p99(runs: list[list[float]]) -> float:
    """The 99th percentile of every round of ``runs`` together (the same index rule as a
    single run's: the round at ``int(0.99 * n)`` of the sorted rounds). Why pooled: a run of
    200 rounds has its p99 at its 2nd-largest round, and single runs of one checkout spread
    +-25%; four runs pooled put it at the 8th largest of 800, which one slow round cannot
    move."""
    pooled = sorted(x for run in runs for x in run)
    return pooled[min(len(pooled) - 1, int(0.99 * len(pooled)))]


def compare(before: str, argv: list[str], pairs: int, json_out: str | None) -> None:
    """Run this file's measurement on ``before``'s scheduler and on this one, alternately
    (``--against``), and print the medians over the pairs side by side."""
    here = str(Path(__file__).resolve().parents[3])  # this checkout's root
    if not (Path(before) / "agentflow" / "scheduler").is_dir():
        raise SystemExit(f"--against {before}: not a checkout of agentflow (no "
                         f"agentflow/scheduler there)")
    runs: dict[str, list[dict[str, object]]] = {"before": [], "after": []}
    loads: list[tuple[str, float, float]] = []
    for k in range(pairs):
        for side, root in (("before", before), ("after", here)):
            out = Path(os.environ.get("TMPDIR", "/tmp")) / f"sched-overhead-{os.getpid()}.json"
            env = {**os.environ, "PYTHONPATH": root}
            load0 = os.getloadavg()[0]
            subprocess.run([sys.executable, __file__, *argv, "--json", str(out)], env=env,
                           check=True, stdout=subprocess.DEVNULL)
            loads.append((side, load0, os.getloadavg()[0]))
            runs[side].append(json.loads(out.read_text()))
            out.unlink()
            print(f"pair {k + 1}/{pairs} {side}: done (load {load0:.1f} -> "
                  f"{loads[-1][2]:.1f})", flush=True)
    keys = [(c["cluster"], c["instances"], c["policy"], c["waiting"])
            for c in runs["after"][0]["cells"]]  # type: ignore[index, attr-defined]

    def cell(run: dict[str, object], key: tuple[object, ...]) -> dict[str, float]:
        return next(c for c in run["cells"]  # type: ignore[attr-defined]
                    if (c["cluster"], c["instances"], c["policy"], c["waiting"]) == key)

    med = statistics.median
    print(f"\nmicroseconds per decision, {runs['after'][0]['clock']} clock, medians over "
          f"{pairs} before/after pairs (before: {before}; after: {here})")
    print(f"{'cluster':<14}{'inst':>6}  {'policy':<10}{'waiting':>8}  {'before med/p99':>16}  "
          f"{'after med/p99':>16}  {'ratio med/p99':>14}  {'pooled p99 (ratio)':>22}")
    table = []
    for key in keys:
        b = [cell(r, key) for r in runs["before"]]
        a = [cell(r, key) for r in runs["after"]]
        row = {"cluster": key[0], "instances": key[1], "policy": key[2], "waiting": key[3]}
        for stat in ("median_us", "p99_us"):
            row[f"before_{stat}"] = med(x[stat] for x in b)
            row[f"after_{stat}"] = med(x[stat] for x in a)
            row[f"ratio_{stat}"] = med(y[stat] / x[stat] for x, y in zip(b, a))
        for side, runs_ in (("before", b), ("after", a)):  # every pair's rounds, pooled
            row[f"{side}_pooled_p99_us"] = pooled_p99([r["costs_us"] for r in runs_])
        row["ratio_pooled_p99_us"] = row["after_pooled_p99_us"] / row["before_pooled_p99_us"]
        table.append(row)
        print(f"{key[0]!s:<14}{key[1]!s:>6}  {key[2]!s:<10}{key[3]!s:>8}  "
              f"{row['before_median_us']:>7.0f} /{row['before_p99_us']:>7.0f}  "
              f"{row['after_median_us']:>7.0f} /{row['after_p99_us']:>7.0f}  "
              f"{row['ratio_median_us']:>6.2f} /{row['ratio_p99_us']:>6.2f}  "
              f"{row['before_pooled_p99_us']:>7.0f} ->{row['after_pooled_p99_us']:>7.0f} "
              f"({row['ratio_pooled_p99_us']:.2f})")
    n_rounds = len(a[0]["costs_us"]) * pairs
    print(f"pooled p99: the 99th percentile of all {n_rounds} timed rounds of a side's "
          f"{pairs} runs (one run's p99 over {n_rounds // pairs} rounds is an order "
          f"statistic near its top, which a few slow rounds move)")
    print("load average (1 min) before -> after each run: "
          + ", ".join(f"{s} {a:.1f}->{b:.1f}" for s, a, b in loads))
    if json_out:
        Path(json_out).write_text(json.dumps({"pairs": pairs, "loads": loads,
                                              "cells": table}, indent=1))

if __name__ == "__main__":
    main()
