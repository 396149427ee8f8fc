"""Cost of one scheduling decision (dispatch + queue) as the waiting queue grows.

    agentflow bench scheduler_overhead [--sizes 10,1000,10000] [--repeat 200]
        [--clusters hetero-64,hetero-1024,hetero-4096 | --cluster FILE ...] [--no-learn]
        [--check] [--clock wall|cpu]

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
O(n) reference scan (slow; for verification, not timing).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import networkx as nx

from agentflow.scheduler import PRESETS, Coordinator, InstanceSpec
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
            check: bool = False, timer=time.perf_counter, learn: bool = True) -> list[float]:
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
        call, decisions = c.on_call_ready(q, stage="revise", node_id=f"{q}.6",
                                          prompt_tokens=900)
        running += [d.call for d in decisions]
        done = running.pop(0)
        times = {"ttft_s": TTFT_S, "total_s": TOTAL_S} if learn else {}
        running += [d.call for d in c.on_call_done(done, output_tokens=80, **times)]
        if i >= WARMUP:  # the first rounds fill cold per-query caches once
            costs.append((timer() - start) / 2)  # two decisions per round
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
    args = p.parse_args(argv)
    timer = time.process_time if args.clock == "cpu" else time.perf_counter
    sizes = [int(s) for s in args.sizes.split(",")]
    clusters = args.cluster or args.clusters.split(",")
    policies = args.policies.split(",")
    p99s: dict[tuple[str, str], float] = {}
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
                cells.append(f"{med:>11.0f} / {p99:<10.0f}")
            print(f"{policy:<20}" + "".join(f"{c:>24}" for c in cells), flush=True)
    if len(clusters) > 1:
        print(f"\ngrowth of the p99 at {sizes[-1]} waiting, {names[clusters[0]]} -> "
              + " -> ".join(names[c] for c in clusters[1:]))
        for policy in policies:
            base = p99s[clusters[0], policy]
            print(f"{policy:<20}" + "".join(f"{p99s[c, policy] / base:>10.2f}x"
                                            for c in clusters[1:]))

if __name__ == "__main__":
    main()
