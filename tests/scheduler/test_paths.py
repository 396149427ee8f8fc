"""The scheduler's own critical paths (``scheduler.paths``), checked by hand: the one the
deadline budgets read, priced from tool estimates and predicted LLM lengths.

The coordinator of ``tests/scheduler/utils.py`` has one instance at 1 s per output token and
no prefill or overhead cost, so an LLM stage of N predicted tokens takes N seconds."""

from __future__ import annotations

import networkx as nx
import pytest

from agentflow.scheduler.distribution import Distribution
from agentflow.workflow import Node, NodeKind, Query, WorkflowRun
from tests.scheduler.utils import coordinator, llm


def tool(node_id: str, expected_s: float) -> Node:
    async def run(ctx):
        return None
    return Node(id=node_id, stage=node_id, kind=NodeKind.TOOL, run=run, expected_s=expected_s)


def run_of(nodes: list[Node], edges: list[tuple[str, str]]) -> WorkflowRun:
    g = nx.DiGraph()
    for n in nodes:
        g.add_node(n.id, node=n)
    g.add_edges_from(edges)
    return WorkflowRun(Query("q", "db", arrival=0.0, id="q"), g)


def test_remaining_path_is_the_longest_chain_and_a_running_stage_counts_its_remainder() -> None:
    #   a(2) -> b(3) -> c(1)
    #   a(2) -> d(5) -> c(1)
    run = run_of([tool("a", 2), tool("b", 3), tool("c", 1), tool("d", 5)],
                 [("a", "b"), ("b", "c"), ("a", "d"), ("d", "c")])
    c = coordinator("least_loaded+fcfs", {})  # fcfs: paths computed when asked
    query = c.on_query_arrival("q", deadline=None, run=run)
    assert c.remaining_s(query, 0.0) == 8
    assert query.path_cache["a"] == 6 and query.path_cache["b"] == 1
    run.mark_started("a", 0.0)
    assert c.remaining_s(query, 1.5) == pytest.approx(6.5)  # a has 0.5 s left
    run.mark_done("a", 2.0)
    run.mark_started("d", 2.0)
    run.mark_started("b", 2.0)
    run.mark_done("b", 5.0)
    assert c.remaining_s(query, 5.0) == pytest.approx(3.0)  # d: 2 s left, then c


def test_llm_stages_are_priced_by_predicted_length_with_a_p10_p90_band() -> None:
    # gen: 2 or 20 tokens (even odds): mean 11 s, P10 2 s, P90 20 s; then a 1 s tool step.
    lengths = {"gen": Distribution(values=[2.0, 20.0], probs=[0.5, 0.5])}
    run = run_of([llm("gen.0", "gen"), tool("exec", 1)], [("gen.0", "exec")])
    c = coordinator("least_loaded+flowsage", lengths)  # keeps paths current at events
    query = c.on_query_arrival("q", deadline=100.0, run=run)
    assert query.path_cache[None] == pytest.approx(12.0)
    assert (query.path_lo, query.path_hi, query.work_left) == pytest.approx((3.0, 21.0, 11.0))
    # the remaining cost is that of the stage's length distribution: O^2/2 with no prompt
    assert c.remaining_cost(query).mean() == pytest.approx((2 ** 2 / 2 + 20 ** 2 / 2) / 2)


def test_pruned_order_gives_the_paths_of_a_full_pass_as_stages_finish_and_the_graph_grows(
) -> None:
    """The DP drops finished stages from its cached order; a fresh order (every stage
    walked) must give the same floats at every step of a run that also grows."""
    import random

    from agentflow.workflow.graph import Expansion

    rng = random.Random(7)
    nodes = [tool(f"n{i}", rng.uniform(0.1, 5.0)) for i in range(12)]
    edges = [(f"n{i}", f"n{j}") for i in range(12) for j in range(i + 1, 12)
             if rng.random() < 0.3]
    run = run_of(nodes, edges)
    c = coordinator("least_loaded+fcfs", {})
    query = c.on_query_arrival("q", deadline=None, run=run)
    fresh = c.on_query_arrival("q2", deadline=None, run=run)  # same run, order rebuilt
    now, grown, checked = 0.0, 0, 0
    while not run.finished:
        now += rng.uniform(0.1, 1.0)
        c._critical_paths(query, now)
        fresh.topo = None
        c._critical_paths(fresh, now)
        assert query.path_cache == fresh.path_cache
        assert (query.path_lo, query.path_hi, query.work_left) == \
            (fresh.path_lo, fresh.path_hi, fresh.work_left)
        checked += 1
        running = run.running
        ready = [n.id for n in run.ready()]
        if running and (not ready or rng.random() < 0.5):
            done = rng.choice(running)
            expansion = None
            if grown < 3 and rng.random() < 0.5:  # a stage adds two after it
                a, b = tool(f"x{grown}a", rng.uniform(0.1, 3)), tool(f"x{grown}b", 1.0)
                expansion = Expansion(nodes=[a, b], edges=[(done, a.id), (a.id, b.id)])
                grown += 1
            run.mark_done(done, now, expansion=expansion)
        elif ready:
            run.mark_started(rng.choice(ready), now)
    assert grown > 0 and checked > 20
    c._critical_paths(query, now)
    assert query.path_cache == {None: 0.0}
    assert query.topo is not None and query.topo[1] == []  # everything pruned at the end
