"""Cost of one scheduling decision (dispatch + queue) as the waiting queue grows.

    python benchmarks/scheduler_overhead.py [--sizes 10,100,1000,10000] [--repeat 200]

A 4-instance cluster (A100, A100, A6000, L40S serving Llama-3.1-70B) is filled with N waiting
calls from N/20 queries, each query a 20-call CHESS-shaped workflow, so time-dependent
policies (urgency, llf, flowsage) see real critical paths. Then, repeatedly, one new call
becomes ready (dispatch + enqueue) and one running call finishes (the queue picks the next
call to admit). Prints median and p99 microseconds per decision for every preset. Timed from
outside the scheduler with perf_counter; the scheduler itself reads no clock.
"""

from __future__ import annotations

import argparse
import statistics
import time

import networkx as nx

from agentflow.scheduler import Coordinator, InstanceSpec, PRESETS
from agentflow.scheduler.predictor import LengthPredictor
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


def measure(policy: str, waiting: int, repeat: int) -> list[float]:
    clock = ManualClock(0.0)
    specs = [InstanceSpec("a100-0", "A100-80G", "Llama-3.1-70B", max_inflight=1),
             InstanceSpec("a100-1", "A100-80G", "Llama-3.1-70B", max_inflight=1),
             InstanceSpec("a6000", "A6000", "Llama-3.1-70B", max_inflight=1),
             InstanceSpec("l40s", "L40S", "Llama-3.1-70B", max_inflight=1)]
    c = Coordinator(specs, clock=clock, policy=policy, predictor=LengthPredictor())
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
    costs = []
    for i in range(repeat + WARMUP):
        clock.advance(0.01)
        start = time.perf_counter()
        call, decisions = c.on_call_ready("q0", stage="revise", node_id="q0.6", prompt_tokens=900)
        running += [d.call for d in decisions]
        done = running.pop(0)
        running += [d.call for d in c.on_call_done(done, output_tokens=80)]
        if i >= WARMUP:  # the first rounds fill cold per-query caches once
            costs.append((time.perf_counter() - start) / 2)  # two decisions per round
    return costs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,100,1000,10000")
    p.add_argument("--repeat", type=int, default=200)
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'policy':<12}" + "".join(f"{f'{n} waiting':>24}" for n in sizes))
    print(f"{'':<12}" + "".join(f"{'median / p99 (us)':>24}" for _ in sizes))
    for policy in PRESETS:
        cells = []
        for n in sizes:
            costs = sorted(measure(policy, n, args.repeat if n <= 1000 else args.repeat // 4))
            med = statistics.median(costs) * 1e6
            p99 = costs[min(len(costs) - 1, int(0.99 * len(costs)))] * 1e6
            cells.append(f"{med:>11.0f} / {p99:<10.0f}")
        print(f"{policy:<12}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    main()
