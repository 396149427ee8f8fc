"""A query's pipeline as a DAG of stages, and the bookkeeping of running it.

``WorkflowRun`` is a pure state machine over a networkx DiGraph: which nodes are ready, which
are running or done, when each started, and how the graph grew at run time — what the
scheduler reads to price the remaining critical path (``agentflow.scheduler.paths``). It
never awaits, sleeps or reads a clock of its own — times are passed in — so the asyncio
executor and a virtual-time simulator drive the very same object.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import networkx as nx

from agentflow.workflow.query import Query, StageRecord


class NodeKind(str, Enum):
    LLM = "llm"
    TOOL = "tool"


# A stage's coroutine; its argument is the node's ``workflow.context.StageContext`` (typed Any
# here: the context is built from a run and its nodes, so it stands above this module).
StageFn = Callable[[Any], Awaitable[Any]]


@dataclass
class Node:
    """One stage instance. ``stage`` is its type (shared by, e.g., all candidate generators),
    ``id`` is unique in the run. ``expected_s`` is what the scheduler's critical path counts
    for a tool step (LLM stages are priced from predicted lengths instead)."""

    id: str
    stage: str
    kind: NodeKind
    run: StageFn
    expected_s: float = 1.0
    # Free-form facts for estimators: e.g. expected prompt/output tokens of an LLM stage.
    hints: dict[str, Any] = field(default_factory=dict)


@dataclass
class Expansion:
    """Graph growth requested by a finished stage: new nodes and the edges that wire them in.

    Edges may point from the finished node (or other finished/new nodes) to new nodes, and from
    new nodes to nodes that have not started yet — that is how a revision round is inserted
    before the selection step."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[tuple[str, str]] = field(default_factory=list)


class GraphError(ValueError):
    """An invalid pipeline graph or expansion (cycle, unknown node, rewiring a started node)."""


class WorkflowRun:
    """The DAG of one query and where each node stands."""

    # one name a line: mypyc compiles no tuple assignment in a class body
    PENDING = "pending"
    RUNNING = "running"
    DONE = "ok"
    FAILED = "error"
    CANCELLED = "cancelled"

    def __init__(self, query: Query, graph: nx.DiGraph):
        for node_id, data in graph.nodes(data=True):
            if not isinstance(data.get("node"), Node) or data["node"].id != node_id:
                raise GraphError(f"graph node {node_id!r} must carry node=Node(id={node_id!r})")
        try:  # the records in networkx's topological order, which is also the cycle check
            order = generation_order(graph)
        except GraphError:
            raise GraphError(f"pipeline graph has a cycle: {nx.find_cycle(graph)}") from None
        self.query = query
        self.graph = graph
        self.outputs: dict[str, Any] = {}
        self.version = 0  # bumped on every change, so schedulers can cache derived values
        self._state: dict[str, str] = {n: self.PENDING for n in graph.nodes}
        # nodes pending or running: ``finished`` is this reaching 0 (the simulator asks at
        # every finished stage; a walk over the states was ~0.6% of a fleet replay)
        self._open = len(self._state)
        self._started_at: dict[str, float] = {}
        # ``_lexical_order``'s cache: (graph shape, (id, node, parents) in its order)
        self._order: tuple[Any, ...] | None = None
        for node_id in order:
            self._add_record(node_id)

    # ----------------------------------------------------------------------------- queries
    def node(self, node_id: str) -> Node:
        return self.graph.nodes[node_id]["node"]

    def state(self, node_id: str) -> str:
        return self._state[node_id]

    def ready(self) -> list[Node]:
        """Pending nodes whose parents have all finished, in a stable (topological) order."""
        state, pending, done = self._state, self.PENDING, self.DONE
        ready = []
        for n, node, parents in self._lexical_order():
            if state[n] == pending:
                for p in parents:  # all(...) without a generator per pending node
                    if state[p] != done:
                        break
                else:
                    ready.append(node)
        return ready

    def _lexical_order(self) -> list[tuple[str, Node, list[str]]]:
        """(id, node, parents) in lexicographical topological order. Kept until the graph
        grows (a graph only grows, by expansion, so its node and edge counts say when): the
        simulator asks for the ready nodes at every finished stage."""
        g = self.graph
        shape = _shape(g)
        cached = self._order
        if cached is None or cached[0] != shape:
            cached = self._keep_order(lexical_order(g))
        return cached[1]

    def _keep_order(self, order: list[str]) -> tuple[Any, ...]:
        g = self.graph
        if type(g) is nx.DiGraph:  # its own dicts: what the views below read, without them
            nodes, pred = g._node, g._pred
        else:
            nodes, pred = g.nodes, g.pred
        kept = self._order = (_shape(g), [(n, nodes[n]["node"], list(pred[n])) for n in order])
        return kept

    @property
    def finished(self) -> bool:
        """Every node done, failed or cancelled."""
        return self._open == 0

    @property
    def running(self) -> list[str]:
        return [n for n, s in self._state.items() if s == self.RUNNING]

    def started_at(self, node_id: str) -> float | None:
        """When a stage started (None if it has not)."""
        return self._started_at.get(node_id)

    def unfinished(self) -> list[Node]:
        """Nodes pending or running (what a query still has to do)."""
        return [self.node(n) for n in self._unfinished()]

    # ----------------------------------------------------------------------------- events
    def mark_started(self, node_id: str, now: float) -> None:
        self._require(node_id, self.PENDING)
        self.version += 1
        self._state[node_id] = self.RUNNING
        self._started_at[node_id] = now
        record = self.query.stage(node_id)
        record.status, record.start = "running", now

    def mark_done(self, node_id: str, now: float, output: Any = None,
                  expansion: Expansion | None = None, summary: str = "") -> None:
        self._require(node_id, self.RUNNING)
        self.version += 1
        if expansion is not None:
            self._expand(expansion, by=node_id)
        self._state[node_id] = self.DONE
        self._open -= 1
        self.outputs[node_id] = output
        record = self.query.stage(node_id)
        record.status, record.end, record.summary = "ok", now, summary or record.summary

    def mark_failed(self, node_id: str, now: float, error: str) -> None:
        self.version += 1
        if self._state.get(node_id) in (self.PENDING, self.RUNNING):
            self._open -= 1
        self._state[node_id] = self.FAILED
        record = self.query.stage(node_id)
        record.status, record.end, record.error = "error", now, error

    def cancel_pending(self, now: float) -> None:
        """Stop everything not yet finished (query failed, cancelled or timed out)."""
        self.version += 1
        for node_id, state in self._state.items():
            if state in (self.PENDING, self.RUNNING):
                self._state[node_id] = self.CANCELLED
                self._open -= 1
                record = self.query.stage(node_id)
                record.status = "cancelled"
                if state == self.RUNNING:
                    record.end = now

    # ----------------------------------------------------------------------------- internals
    def _unfinished(self) -> Iterable[str]:
        return (n for n, s in self._state.items() if s in (self.PENDING, self.RUNNING))

    def _require(self, node_id: str, state: str) -> None:
        if node_id not in self._state:
            raise GraphError(f"unknown node {node_id!r}")
        if self._state[node_id] != state:
            raise GraphError(f"node {node_id!r} is {self._state[node_id]}, expected {state}")

    def _expand(self, expansion: Expansion, *, by: str) -> None:
        for node in expansion.nodes:
            if node.id in self.graph:
                raise GraphError(f"expansion reuses node id {node.id!r}")
        new_ids = {n.id for n in expansion.nodes}
        for src, dst in expansion.edges:
            for end in (src, dst):
                if end not in self.graph and end not in new_ids:
                    raise GraphError(f"expansion edge {src!r} -> {dst!r}: unknown {end!r}")
            if dst not in new_ids and self._state.get(dst) != self.PENDING:
                raise GraphError(f"expansion cannot add a parent to {dst!r}: it already started")
        for node in expansion.nodes:
            self.graph.add_node(node.id, node=node)
            self._state[node.id] = self.PENDING
            self._open += 1
        self.graph.add_edges_from(expansion.edges)
        try:  # the cycle check is the ready list's order, kept for ``_lexical_order``
            self._keep_order(lexical_order(self.graph))
        except GraphError:
            raise GraphError("expansion would create a cycle") from None
        # one new stage (the common case: a revision round) needs no subgraph view; with
        # more, networkx's order over the view is kept as it was
        added = [expansion.nodes[0].id] if len(new_ids) == 1 else \
            induced_generation_order(self.graph, new_ids)
        for node_id in added:
            self._add_record(node_id, expanded_by=by)
        # keep recorded parents in step with the graph (once per node an edge ends at)
        for dst in dict.fromkeys(dst for _src, dst in expansion.edges):
            self.query.stage(dst).parents = sorted(self.graph.predecessors(dst))

    def _add_record(self, node_id: str, expanded_by: str | None = None) -> None:
        node = self.node(node_id)
        self.query.timeline.append(StageRecord(
            node_id=node_id, stage=node.stage, kind=node.kind.value,
            parents=sorted(self.graph.predecessors(node_id)), expanded_by=expanded_by))


def lexical_order(g: nx.DiGraph) -> list[Any]:
    """``nx.lexicographical_topological_sort(g)`` (no key): Kahn's algorithm taking the
    smallest ready node id first, which fixes the order uniquely, so the same list; without
    networkx's per-call dispatch and generator layers (a simulated query's graph grows at
    most of its stages, and its ready list is read at each)."""
    if type(g) is nx.DiGraph:  # its own dicts, in the order its views iterate them
        pred = g._pred
        return lexical_order_of(g._succ, {n: len(pred[n]) for n in g._node})
    pred = g.pred
    return lexical_order_of(g.succ, {n: len(pred[n]) for n in g})


def _shape(g: nx.DiGraph) -> tuple[int, int]:
    """(nodes, edges) of a graph: what changes when it grows. A plain DiGraph's edges are
    its successor lists' lengths summed (``number_of_edges`` sums every node's in and out
    degree through networkx's degree view, at every ``ready``)."""
    if type(g) is nx.DiGraph:
        return len(g._node), sum(map(len, g._succ.values()))
    return g.number_of_nodes(), g.number_of_edges()


def lexical_order_of(succ: Mapping[Any, Iterable[Any]], indegree: dict[Any, int]
                     ) -> list[Any]:
    """``lexical_order`` of the DAG given as successor lists and in-degrees (every node a
    key of ``indegree``; a repeated edge counts in both), with no graph object built: the
    order is unique, so the same list as ``lexical_order`` of the same edges. ``indegree``
    is consumed."""
    import heapq

    ready = [n for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for child in succ[n]:
            left = indegree[child] - 1
            indegree[child] = left
            if left == 0:
                heapq.heappush(ready, child)
    if len(order) != len(indegree):
        raise GraphError("pipeline graph has a cycle")
    return order


def induced_generation_order(g: nx.DiGraph, nodes: set[Any]) -> list[Any]:
    """``list(nx.topological_sort(g.subgraph(nodes)))``, the same list, without building the
    subgraph view (an expansion orders its new stages so; ~15% of ``_expand`` through the
    views). The view's order is reproduced as networkx 3 makes it: its node set is
    ``set(n for n in nodes if n in g)`` (``show_nodes(g.nbunch_iter(nodes))``), iterated in
    that set's own order when it is under half the graph and in the graph's order otherwise
    (``FilterAtlas.__iter__``); children in each successor dict's order; generations of
    Kahn's algorithm as ``nx.topological_generations``. A graph view or multigraph goes
    through networkx itself."""
    if type(g) is not nx.DiGraph:
        return list(nx.topological_sort(g.subgraph(nodes)))
    atlas, succ, pred = g._node, g._succ, g._pred
    shown = set(n for n in nodes if n in g._adj)
    if 2 * len(shown) < len(atlas):
        view = [n for n in shown if n in atlas]
    else:
        view = [n for n in atlas if n in shown]
    indegree: dict[Any, int] = {}
    zero: list[Any] = []
    for n in view:
        d = sum(1 for p in pred[n] if p in shown)
        if d:
            indegree[n] = d
        else:
            zero.append(n)
    order: list[Any] = []
    while zero:
        generation, zero = zero, []
        for n in generation:
            for child in succ[n]:
                if child not in shown:
                    continue
                left = indegree[child] - 1
                if left:
                    indegree[child] = left
                else:
                    zero.append(child)
                    del indegree[child]
        order += generation
    if indegree:
        raise GraphError("pipeline graph has a cycle")
    return order


def generation_order(g: nx.DiGraph) -> list[Any]:
    """``list(nx.topological_sort(g))``, the same list, without networkx's generator and
    view layers (an arrival builds a run, and a critical-path pass re-orders a graph that
    grew): generations of Kahn's algorithm, each in the order nodes were added, children in
    the order their edges were. A cycle raises ``GraphError``. Graph views and multigraphs
    iterate differently: they go through networkx itself."""
    if type(g) is not nx.DiGraph:
        try:
            return list(nx.topological_sort(g))
        except (nx.NetworkXUnfeasible, nx.NetworkXError):  # a cycle, or not directed
            raise GraphError("pipeline graph has a cycle") from None
    succ, pred = g._succ, g._pred
    indegree = {}
    zero = []
    for n in g._node:
        d = len(pred[n])
        if d:
            indegree[n] = d
        else:
            zero.append(n)
    order: list[Any] = []
    while zero:
        generation, zero = zero, []
        for n in generation:
            for child in succ[n]:
                left = indegree[child] - 1
                if left:
                    indegree[child] = left
                else:
                    zero.append(child)
                    del indegree[child]
        order += generation
    if indegree:
        raise GraphError("pipeline graph has a cycle")
    return order


def chain(*nodes: Node) -> nx.DiGraph:
    """A graph of ``nodes`` run one after another (helper for simple pipelines)."""
    graph = nx.DiGraph()
    for node in nodes:
        graph.add_node(node.id, node=node)
    graph.add_edges_from((a.id, b.id) for a, b in zip(nodes, nodes[1:]))
    return graph
