"""``graph.lexical_order``, the runtime's ready-list order, is networkx's lexicographical
topological sort: the same list on random DAGs whose nodes were added in shuffled order."""

from __future__ import annotations

import random

import networkx as nx
import pytest

from agentflow.workflow.graph import GraphError, lexical_order


def test_the_order_is_networkx_lexicographical_topological_sort() -> None:
    rng = random.Random(3)
    for _ in range(1500):
        n = rng.randint(1, 40)
        names = rng.sample([f"{c}{i}" for c in "abcxyz" for i in range(40)], n)
        g = nx.DiGraph()
        g.add_nodes_from(names)
        g.add_edges_from((names[i], names[j]) for i in range(n) for j in range(i + 1, n)
                         if rng.random() < 0.15)
        assert lexical_order(g) == list(nx.lexicographical_topological_sort(g))


def test_a_cycle_is_refused() -> None:
    with pytest.raises(GraphError, match="cycle"):
        lexical_order(nx.DiGraph([("a", "b"), ("b", "a")]))
