"""A recorded query's DAG, grown during a replay the way its pipeline grew it in serving.

A trace holds the DAG as the run *ended*: every revision round, every evaluate call. Serving's
scheduler never sees that at arrival — the pipeline builds its initial graph (its shape, with
the pipeline's priors on each stage) and adds stages when a finished stage asks for them
(``Expansion`` in ``WorkflowRun.mark_done``). A replay that built the whole recorded DAG at
arrival would hand flowsage, llf and urgency the number of revision rounds each query will
need. ``GrowingDag`` hands the runtime the same two things serving's pipelines do:

* ``initial_graph()``: the nodes the pipeline built up front (``TraceNode.expanded`` false),
  wired as the recording orders them;
* ``expansion_after(node_id)``: when a stage finishes, the recorded nodes it made appear —
  those whose ``expanded_by`` is that stage, or, when the trace does not say, those whose
  parents have all finished — as an ``Expansion`` for ``WorkflowRun.mark_done``.

Ordering is kept exactly: an edge the recording routes through stages not yet shown becomes
an edge from the shown ancestor to the shown descendant (the selection step waits for the
candidates before any revision round exists, as in ``pipelines.chess``), and a node that
appears takes its place in front of those descendants. The recorded DAG still decides what
happens — how many rounds, which call sizes — the scheduler just does not see it early.
"""

from __future__ import annotations

from collections.abc import Callable

import networkx as nx

from agentflow.sim.workload import TraceNode, TraceQuery
from agentflow.workflow import Expansion, Node
from agentflow.workflow.graph import GraphError, lexical_order_of


class GrowingDag:
    def __init__(self, trace: TraceQuery, make_node: Callable[[TraceNode], Node]):
        """``make_node`` turns a recorded node into the runtime's ``Node`` when it appears
        (so estimates such as a tool stage's mean duration are taken then, not at arrival)."""
        self.make_node = make_node
        self._nodes = {n.id: n for n in trace.nodes}
        self._children: dict[str, list[str]] = {n.id: [] for n in trace.nodes}
        for n in trace.nodes:
            for p in n.parents:
                if p not in self._nodes:
                    raise ValueError(f"trace {trace.id}: node {n.id!r} has unknown parent {p!r}")
                self._children[p].append(n.id)
        try:  # networkx's lexicographical order, from the lists (once per arrival)
            self._order = lexical_order_of(
                self._children, {n.id: len(n.parents) for n in trace.nodes})
        except GraphError:
            raise ValueError(f"trace {trace.id}: the recorded DAG has a cycle") from None
        self._shown: set[str] = set()
        self._done: set[str] = set()
        # the nodes not shown yet, in ``_order`` (what ``_due`` walks at every finished stage:
        # the shown ones it would only skip), and each node's trigger, when the trace names one
        self._hidden = list(self._order)
        self._by = {n.id: n.expanded_by if n.expanded_by in self._nodes else None
                    for n in trace.nodes}
        # Which finished stages can trigger which nodes: its named trigger, else each of its
        # parents (``_due``'s first test). A finished stage that triggers no hidden node
        # shows nothing, so ``expansion_after`` answers without walking the hidden nodes
        # (most stages: 13,375 of 20,672 in a 1,000-query replay).
        self._triggers: dict[str, list[str]] = {}
        for n in trace.nodes:
            by = self._by[n.id]
            for t in ((by,) if by is not None else n.parents):
                self._triggers.setdefault(t, []).append(n.id)

    @property
    def hidden(self) -> list[str]:
        """Recorded nodes the scheduler has not been shown yet."""
        return list(self._hidden)

    def initial_graph(self) -> nx.DiGraph:
        """The graph at arrival: the pipeline's shape, plus any run-time node already due (a
        grown stage with no parents)."""
        shape = [n for n in self._order if not self._nodes[n].expanded]
        nodes, edges = self._show(shape + self._due())
        graph = nx.DiGraph()
        for node in nodes:
            graph.add_node(node.id, node=node)
        graph.add_edges_from(edges)
        return graph

    def expansion_after(self, node_id: str) -> Expansion | None:
        """What the graph gains as ``node_id`` finishes (None: nothing).

        Without a hidden node that ``node_id`` triggers, ``_due`` would find none: nothing
        else changed since the last walk (only finished stages and shown nodes move it, and
        nodes are shown only here and at arrival), so a node due now must have been due at
        that walk — and shown by it — unless it was triggered since; take the first due in
        the walk's (topological) order: its parents are all shown already."""
        self._done.add(node_id)
        if not any(n not in self._shown and self._triggered(n)
                   for n in self._triggers.get(node_id, ())):
            return None
        due = self._due()
        if not due:
            return None
        nodes, edges = self._show(due)
        return Expansion(nodes=nodes, edges=edges)

    def _triggered(self, n: str) -> bool:
        """Whether hidden node ``n``'s trigger has finished (``_due``'s first test)."""
        by = self._by[n]
        return by in self._done if by is not None else \
            self._done.issuperset(self._nodes[n].parents)

    # ------------------------------------------------------------------------------ internals
    def _due(self) -> list[str]:
        """Hidden nodes the pipeline would have added by now, in topological order: their
        trigger has finished and every recorded parent is shown (or due with them)."""
        due: list[str] = []
        new: set[str] = set()
        shown, done, nodes, by_of = self._shown, self._done, self._nodes, self._by
        for n in self._hidden:  # set methods, not a generator per node: called per stage
            parents = nodes[n].parents
            by = by_of[n]
            if not (by in done if by is not None else done.issuperset(parents)):
                continue  # not triggered
            if shown.issuperset(parents) or all(p in shown or p in new for p in parents):
                due.append(n)
                new.add(n)
        return due

    def _show(self, ids: list[str]) -> tuple[list[Node], list[tuple[str, str]]]:
        """Mark ``ids`` shown; their runtime nodes and the edges that wire them in: from each
        shown recorded parent, and to every shown node reachable through nodes still hidden
        (a shape node's hidden parents are bridged that way, from their shown ancestors)."""
        self._shown.update(ids)
        shown = self._shown
        self._hidden = [n for n in self._hidden if n not in shown]
        edges: list[tuple[str, str]] = []
        for n in ids:
            edges += [(p, n) for p in self._nodes[n].parents if p in self._shown]
            edges += [(n, d) for d in self._shown_descendants(n)]
        return [self.make_node(self._nodes[n]) for n in ids], list(dict.fromkeys(edges))

    def _shown_descendants(self, node_id: str) -> list[str]:
        """Shown nodes reachable from ``node_id`` by paths whose inner nodes are hidden."""
        found: list[str] = []
        stack, seen = list(self._children[node_id]), set()
        while stack:
            child = stack.pop()
            if child in seen:
                continue
            seen.add(child)
            if child in self._shown:
                found.append(child)
            else:
                stack.extend(self._children[child])
        return sorted(found)
