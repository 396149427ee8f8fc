"""``WorkflowRun.finished`` is kept as a count of the nodes pending or running: it must say
what a walk over every node's state says after any sequence of starts, finishes, failures,
expansions and cancellations."""

from __future__ import annotations

import random

import networkx as nx

from agentflow.workflow import Expansion, Node, NodeKind, Query, WorkflowRun


async def _noop(ctx):  # pragma: no cover - never run
    return None


def _node(node_id: str) -> Node:
    return Node(node_id, "s", NodeKind.LLM, _noop)


def _walk(run: WorkflowRun) -> bool:
    return all(run.state(n) in (run.DONE, run.FAILED, run.CANCELLED) for n in run.graph)


def test_finished_follows_every_change_of_state() -> None:
    rng = random.Random(5)
    checked = finished = 0
    for trial in range(300):
        g = nx.DiGraph()
        n = rng.randint(1, 6)
        for i in range(n):
            g.add_node(f"n{i}", node=_node(f"n{i}"))
        g.add_edges_from((f"n{i}", f"n{j}") for i in range(n) for j in range(i + 1, n)
                         if rng.random() < 0.3)
        run = WorkflowRun(Query(question="q", db_id="", arrival=0.0, id=f"q{trial}"), g)
        added, t = 0, 0.0
        for _ in range(30):
            t += 1.0
            assert run.finished == _walk(run)
            checked += 1
            ready, running = run.ready(), run.running
            move = rng.random()
            if move < 0.05 and run.finished is False:
                run.cancel_pending(t)
            elif running and move < 0.55:
                done = rng.choice(running)
                if rng.random() < 0.15:
                    run.mark_failed(done, t, "boom")
                else:
                    grow = None
                    if rng.random() < 0.3:  # a revision round: new nodes after this one
                        ids = [f"x{added + k}" for k in range(rng.randint(1, 2))]
                        added += len(ids)
                        grow = Expansion(nodes=[_node(i) for i in ids],
                                         edges=[(done, i) for i in ids])
                    run.mark_done(done, t, expansion=grow)
            elif ready:
                run.mark_started(rng.choice(ready).id, t)
            if run.finished:
                finished += 1
                break
        assert run.finished == _walk(run)
    assert checked > 2500 and finished > 100
