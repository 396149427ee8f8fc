"""Per-query SLOs: a multiple of the query's latency alone on an idle cluster.

As HexGen-Flow defines it, each LLM stage's idle time is averaged over the cluster's GPU
types (the query could land on any of them), tool steps take their recorded time, and the
query's idle latency is the longest path through its DAG.
"""

from __future__ import annotations

import math

import networkx as nx

from agentflow.config import InstanceConfig
from agentflow.sim.cluster import SimClusterConfig
from agentflow.sim.engine import engine_for
from agentflow.sim.workload import TraceQuery


class IdleLatency:
    def __init__(self, cluster: SimClusterConfig, cached_prefix: float | str = 0.0):
        # "auto" (modelled prefix caching): idle latency stays cold, so deadlines are the
        # same with the cache on and off and the comparison is fair.
        self.cached_prefix = 0.0 if cached_prefix == "auto" else cached_prefix
        by_gpu: dict[str | None, tuple[str, InstanceConfig]] = {}
        for name, cfg in cluster.expanded():
            by_gpu.setdefault(cfg.gpu, (name, cfg))
        self._factories = [lambda n=n, c=c: engine_for(n, c) for n, c in by_gpu.values()]
        self._cache: dict[tuple[int, int], float] = {}

    def call_s(self, prompt_tokens: int, output_tokens: int) -> float:
        key = (prompt_tokens, output_tokens)
        if key not in self._cache:
            cached = int(self.cached_prefix * prompt_tokens)
            self._cache[key] = sum(_alone(f(), prompt_tokens, output_tokens, cached)
                                   for f in self._factories) / len(self._factories)
        return self._cache[key]

    def query_s(self, query: TraceQuery) -> float:
        graph = nx.DiGraph()
        for node in query.nodes:
            weight = (self.call_s(node.prompt_tokens, node.output_tokens)
                      if node.kind == "llm" else node.duration_s)
            graph.add_node(node.id, weight=weight)
            graph.add_edges_from((p, node.id) for p in node.parents)
        # longest path with node weights: DP over the topological order
        best: dict[str, float] = {}
        for node_id in nx.topological_sort(graph):
            best[node_id] = graph.nodes[node_id]["weight"] + max(
                (best[p] for p in graph.predecessors(node_id)), default=0.0)
        return max(best.values(), default=0.0)


def _alone(engine, prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
    engine.add("probe", prompt_tokens, max(1, output_tokens), 0, 0.0,
               cached_tokens=cached_tokens)
    t = 0.0
    for _ in range(10_000_000):
        nxt = engine.next_event_time()
        if nxt is None:
            break
        t = nxt
        for ev in engine.step_until(t):
            if ev.kind == "finished":
                return ev.time
    return t if t > 0 else math.nan
