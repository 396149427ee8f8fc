"""``graph.generation_order`` is ``list(nx.topological_sort(g))`` — the order a run's stage
records and the critical-path pass follow — and ``lexical_order_of`` (the replay's order,
from parent lists) is ``lexical_order`` of the same edges: the same lists on random DAGs
whose nodes and edges were added in shuffled orders, and a cycle is refused by both."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from agentflow.workflow.graph import GraphError, generation_order, lexical_order, lexical_order_of


def _random_dag(rng: random.Random) -> nx.DiGraph:
    n = rng.randint(1, 40)
    names = rng.sample([f"{c}{i}" for c in "abcxyz" for i in range(40)], n)
    edges = [(names[i], names[j]) for i in range(n) for j in range(i + 1, n)
             if rng.random() < 0.15]
    rng.shuffle(edges)
    g = nx.DiGraph()
    g.add_nodes_from(rng.sample(names, n))  # insertion order is what networkx follows
    g.add_edges_from(edges)
    return g


def test_generation_order_is_networkx_topological_sort() -> None:
    rng = random.Random(5)
    for _ in range(1500):
        g = _random_dag(rng)
        assert generation_order(g) == list(nx.topological_sort(g))


def test_lexical_order_of_lists_is_lexical_order_of_the_graph() -> None:
    rng = random.Random(6)
    for _ in range(1500):
        g = _random_dag(rng)
        succ = {n: list(g.successors(n)) for n in g}
        indegree = {n: g.in_degree(n) for n in g}
        assert lexical_order_of(succ, indegree) == lexical_order(g)


def test_a_view_goes_through_networkx() -> None:
    g = nx.DiGraph([("a", "b"), ("b", "c"), ("x", "c")])
    view = g.subgraph(["a", "b", "c"])
    assert generation_order(view) == list(nx.topological_sort(view))


def test_a_cycle_is_refused() -> None:
    cyclic = nx.DiGraph([("a", "b"), ("b", "c"), ("c", "b")])
    with pytest.raises(GraphError, match="cycle"):
        generation_order(cyclic)
    with pytest.raises(GraphError, match="cycle"):
        generation_order(cyclic.subgraph(["b", "c"]))
    with pytest.raises(GraphError, match="cycle"):
        lexical_order_of({"a": ["b"], "b": ["a"]}, {"a": 1, "b": 1})


def test_induced_order_is_networkx_topological_sort_of_the_subgraph() -> None:
    """``induced_generation_order`` against networkx on random DAGs and node subsets, small
    (iterated in the set's order) and large (in the graph's order), with unknown ids too."""
    from agentflow.workflow.graph import induced_generation_order

    rng = random.Random(11)
    small = large = 0
    for _ in range(3000):
        n = rng.randint(1, 30)
        names = rng.sample([f"{c}{i}" for c in "abcxyz" for i in range(40)], n)
        g = nx.DiGraph()
        g.add_nodes_from(names)
        g.add_edges_from((names[i], names[j]) for i in range(n) for j in range(i + 1, n)
                         if rng.random() < 0.2)
        pick = {x for x in names if rng.random() < rng.choice((0.15, 0.5, 0.9))}
        if rng.random() < 0.2:
            pick |= {"unknown"}
        if 2 * len(pick) < n:
            small += 1
        else:
            large += 1
        assert induced_generation_order(g, pick) == list(nx.topological_sort(g.subgraph(pick)))
    assert small > 500 and large > 500
