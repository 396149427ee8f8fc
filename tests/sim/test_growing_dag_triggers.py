"""``GrowingDag.expansion_after`` answers "nothing" without walking the hidden nodes when the
stage that finished triggers no hidden node. The short way must show exactly what the walk
shows: every expansion (its nodes and edges) equal to what ``_due`` / ``_show`` give a twin
at every stage, over the demo trace's queries and random DAGs with named and unnamed
triggers, stages finishing in random orders."""

from __future__ import annotations

import random

from agentflow.datasets.demo import TRACE_FILE
from agentflow.sim.replay import GrowingDag
from agentflow.sim.workload import TraceNode, TraceQuery, load_trace
from agentflow.workflow import Expansion, Node, NodeKind


async def _noop(ctx):  # pragma: no cover - never run
    return None


def _node(n: TraceNode) -> Node:
    return Node(n.id, n.stage, NodeKind.LLM if n.kind == "llm" else NodeKind.TOOL, _noop)


def _random_query(rng: random.Random, k: int) -> TraceQuery:
    nodes = []
    for i in range(rng.randint(2, 14)):
        parents = tuple(f"n{j}" for j in range(i) if rng.random() < 0.3)
        grown = i > 0 and rng.random() < 0.5
        by = None
        if grown and rng.random() < 0.6 and i > 0:
            by = f"n{rng.randrange(i)}"
        nodes.append(TraceNode(id=f"n{i}", stage="s", kind="llm", parents=parents,
                               prompt_tokens=1, output_tokens=1, expanded=grown,
                               expanded_by=by))
    return TraceQuery(id=f"r{k}", question="q", nodes=nodes)


def _walk(dag: GrowingDag, node_id: str) -> Expansion | None:
    """``expansion_after`` as it was: the walk over the hidden nodes at every stage."""
    dag._done.add(node_id)
    due = dag._due()
    if not due:
        return None
    nodes, edges = dag._show(due)
    return Expansion(nodes=nodes, edges=edges)


def _replay(q: TraceQuery, rng: random.Random) -> tuple[int, int]:
    short, walked = GrowingDag(q, _node), GrowingDag(q, _node)
    g1, g2 = short.initial_graph(), walked.initial_graph()
    assert list(g1.nodes) == list(g2.nodes) and list(g1.edges) == list(g2.edges)
    visible, done, skipped, grew = set(g1.nodes), set(), 0, 0
    parents = {n.id: set() for n in q.nodes}
    for u, v in g1.edges:
        parents[v].add(u)
    while True:
        ready = sorted(n for n in visible - done if parents[n] <= done)
        if not ready:
            break
        finished = rng.choice(ready)
        done.add(finished)
        a, b = short.expansion_after(finished), _walk(walked, finished)
        skipped += a is None and not any(
            n not in short._shown and short._triggered(n)
            for n in short._triggers.get(finished, ()))
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert [n.id for n in a.nodes] == [n.id for n in b.nodes]
            assert a.edges == b.edges
            grew += 1
            visible |= {n.id for n in a.nodes}
            for u, v in a.edges:
                parents[v].add(u)
    assert short.hidden == walked.hidden
    return skipped, grew


def test_the_short_way_shows_what_the_walk_shows() -> None:
    rng = random.Random(7)
    queries = load_trace(TRACE_FILE) + [_random_query(rng, k) for k in range(400)]
    skipped = grew = 0
    for q in queries:
        for _ in range(3):
            s, g = _replay(q, rng)
            skipped += s
            grew += g
    assert skipped > 500 and grew > 200
