"""Light load goes to the fast GPU: a query alone on a fast + slow cluster runs its calls on
the fast instance, since with nothing contending the instance that finishes a call soonest is
the fastest one, even while it already runs that query's other calls (a parallel stage adds
a co-runner to a batch, which costs far less than moving to a GPU several times slower)."""

from __future__ import annotations

import pytest

from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.driver import Simulation, StageTiming
from agentflow.sim.workload import TraceNode, TraceQuery


def _lone_query(policy: str, gap_s: float = 0.0) -> list[StageTiming]:
    cluster = SimClusterConfig(name="fast-slow", instances=[
        SimInstanceConfig(name="fast", gpu="H200", model="Llama-3.1-8B"),
        SimInstanceConfig(name="slow", gpu="A6000", model="Llama-3.1-8B")])
    # a CHESS-like shape: link, three candidates in parallel, a revision, a selection
    query = TraceQuery(id="q", question="How many singers are there?", nodes=[
        TraceNode("a", "link", "llm", (), 3000, 80),
        TraceNode("b", "generate", "llm", ("a",), 5000, 300),
        TraceNode("c", "generate", "llm", ("a",), 5000, 300),
        TraceNode("d", "generate", "llm", ("a",), 5000, 300),
        TraceNode("e", "revise", "llm", ("b", "c", "d"), 4000, 120),
        TraceNode("f", "select", "llm", ("e",), 2000, 20)])
    seen: list[StageTiming] = []
    sim = Simulation(cluster, policy, on_stage=seen.append)
    # the same query again after the first has finished: the scheduler has learned from it
    result = sim.run([query, query], [0.0, gap_s or 120.0], [None, None], [1.0, 1.0])
    assert all(r.status == "done" for r in result.records)
    return seen


@pytest.mark.parametrize("policy", ["flowsage", "marginal_delay+fcfs"])
def test_a_lone_query_runs_every_call_on_the_fast_gpu(policy: str) -> None:
    stages = _lone_query(policy)
    assert len(stages) == 12
    assert {s.instance for s in stages} == {"fast"}
