"""``WorkflowRun.ready`` drops the nodes past pending from its kept order as it walks: after
any sequence of starts, finishes, failures, expansions (new stages wired to pending ones too)
and cancellations it must give what a walk over the whole graph in lexicographical
topological order gives, node for node and in the same order."""

from __future__ import annotations

import random

import networkx as nx

from agentflow.workflow import Expansion, Node, NodeKind, Query, WorkflowRun
from agentflow.workflow.graph import lexical_order


async def _noop(ctx):  # pragma: no cover - never run
    return None


def _node(node_id: str) -> Node:
    return Node(node_id, "s", NodeKind.LLM, _noop)


def _walk(run: WorkflowRun) -> list[str]:
    """Pending nodes whose parents are all done, over every node of the graph."""
    g = run.graph
    return [n for n in lexical_order(g) if run.state(n) == run.PENDING
            and all(run.state(p) == run.DONE for p in g.predecessors(n))]


def test_ready_is_the_walk_over_the_whole_graph_after_every_change() -> None:
    rng = random.Random(9)
    checked = pruned = 0
    for trial in range(400):
        g = nx.DiGraph()
        n = rng.randint(1, 9)
        names = rng.sample([f"{c}{i}" for c in "abz" for i in range(9)], n)
        for name in names:
            g.add_node(name, node=_node(name))
        g.add_edges_from((names[i], names[j]) for i in range(n) for j in range(i + 1, n)
                         if rng.random() < 0.3)
        run = WorkflowRun(Query(question="q", db_id="", arrival=0.0, id=f"q{trial}"), g)
        added, t = 0, 0.0
        for _ in range(40):
            t += 1.0
            ready = [node.id for node in run.ready()]
            assert ready == _walk(run), (trial, t)
            checked += 1
            kept = run._order[1]
            pruned += len(kept) < run.graph.number_of_nodes()
            assert all(run.state(e[0]) == run.PENDING for e in kept)
            running = run.running
            move = rng.random()
            if move < 0.03:
                run.cancel_pending(t)
            elif running and move < 0.55:
                done = rng.choice(running)
                if rng.random() < 0.1:
                    run.mark_failed(done, t, "boom")
                else:
                    grow = None
                    if rng.random() < 0.35:  # new stages after this one, maybe before others
                        ids = [f"m{added + k}" for k in range(rng.randint(1, 3))]
                        added += len(ids)
                        edges = [(done, i) for i in ids]
                        waiting = [x for x in run.graph if run.state(x) == run.PENDING]
                        if waiting and rng.random() < 0.5:
                            edges.append((ids[-1], rng.choice(waiting)))
                        grow = Expansion(nodes=[_node(i) for i in ids], edges=edges)
                    run.mark_done(done, t, expansion=grow)
            elif ready:
                run.mark_started(rng.choice(ready), t)
            if run.finished:
                break
    assert checked > 3000 and pruned > 1000
