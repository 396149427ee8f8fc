"""A query's run as a shard in another process sees it (``RunMirror``), and the snapshots
that travel with each call to keep it current.

A remote shard needs the query's DAG for its critical paths, so each call carries a
``dag_snapshot`` of the run and the shard keeps a ``RunMirror`` of it: the nodes and edges
seen so far, each node's state and how long ago it started (no clock is shared between
processes, so times travel as seconds ago). The mirror is as fresh as the last call: a tool
step finishing between two calls is seen at the next one.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from agentflow.workflow.graph import Node, NodeKind, WorkflowRun
from agentflow.workflow.query import Query


def dag_snapshot(run: WorkflowRun, now: float) -> dict[str, Any]:
    """What a remote shard needs of ``run`` for critical paths: nodes (id, stage, kind,
    expected seconds, hints), edges, each node's state, and how long ago started ones
    started (seconds: no clock is shared between processes)."""
    graph = run.graph
    nodes = []
    started: dict[str, float] = {}
    for n in graph.nodes:
        node = run.node(n)
        nodes.append((node.id, node.stage, node.kind.value, node.expected_s, dict(node.hints)))
        at = run.started_at(n)
        if at is not None:
            started[n] = now - at
    return {"nodes": nodes, "edges": list(graph.edges),
            "state": {n: run.state(n) for n in graph.nodes}, "started_ago": started}


def query_snapshot(query: Query, now: float) -> dict[str, Any]:
    """The query's identity and deadline, its arrival as seconds ago."""
    return {"id": query.id, "question": query.question, "db_id": query.db_id,
            "arrival_ago": now - query.arrival, "slo_s": query.slo_s,
            "slo_class": query.slo_class, "tenant": query.tenant, "pipeline": query.pipeline}


def query_from(spec: dict[str, Any], now: float) -> Query:
    return Query(question=spec["question"], db_id=spec["db_id"],
                 arrival=now - spec["arrival_ago"], slo_s=spec["slo_s"],
                 slo_class=spec["slo_class"], tenant=spec["tenant"],
                 pipeline=spec["pipeline"], id=spec["id"])


async def _remote_stage(ctx: Any) -> Any:  # pragma: no cover - a mirror is never executed
    raise RuntimeError("a mirrored stage runs in its front end, not in the shard")


class RunMirror:
    """A shard's copy of a query's run, as of its last ``dag_snapshot``: what the
    coordinator reads of a ``WorkflowRun`` (graph, node, state, started_at, version,
    unfinished), nothing it executes."""

    PENDING, RUNNING, DONE = WorkflowRun.PENDING, WorkflowRun.RUNNING, WorkflowRun.DONE

    def __init__(self, query: Query):
        self.query = query
        self.graph: nx.DiGraph = nx.DiGraph()
        self.version = 0
        self._state: dict[str, str] = {}
        self._started_at: dict[str, float] = {}

    def update(self, snap: dict[str, Any], now: float) -> None:
        changed = False
        for node_id, stage, kind, expected_s, hints in snap["nodes"]:
            if node_id not in self.graph:
                self.graph.add_node(node_id, node=Node(node_id, stage, NodeKind(kind),
                                                       _remote_stage, expected_s=expected_s,
                                                       hints=hints))
                changed = True
        for a, b in snap["edges"]:
            if not self.graph.has_edge(a, b):
                self.graph.add_edge(a, b)
                changed = True
        if snap["state"] != self._state:
            self._state = dict(snap["state"])
            changed = True
        for node_id, ago in snap["started_ago"].items():
            self._started_at.setdefault(node_id, now - ago)
        if changed:
            self.version += 1

    def node(self, node_id: str) -> Node:
        node: Node = self.graph.nodes[node_id]["node"]
        return node

    def state(self, node_id: str) -> str:
        return self._state.get(node_id, self.PENDING)

    def started_at(self, node_id: str) -> float | None:
        return self._started_at.get(node_id)

    def unfinished(self) -> list[Node]:
        return [self.node(n) for n in self.graph.nodes
                if self.state(n) in (self.PENDING, self.RUNNING)]
