"""Builders for the scheduler tests: a fixed-length model, a coordinator whose time model
makes every number checkable by hand (1 s per output token on ``fast``, 2 s on ``slow``, no
prefill cost), tiny workflow runs."""

from __future__ import annotations

import networkx as nx

from agentflow.scheduler import Coordinator, InstanceSpec
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.lengths import LengthModel
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun


class FixedLengths(LengthModel):
    """Test double for the length model: a fixed output length per stage."""

    def __init__(self, lengths: dict[str, float | Distribution]):
        self.lengths = lengths

    def predict(self, stage, key_text="", input_tokens=None, *, max_tokens=None):
        value = self.lengths[stage]
        return value if isinstance(value, Distribution) else Distribution.point(value)

    def observe(self, stage, key_text, output_tokens, input_tokens=None):
        pass


def coordinator(policy: str, lengths: dict, *, slow: bool = False, alpha=None, max_inflight=1,
                **kw) -> Coordinator:
    specs = [InstanceSpec("fast", max_inflight=max_inflight)]
    if slow:
        specs.append(InstanceSpec("slow", max_inflight=max_inflight))
    c = Coordinator(specs, clock=ManualClock(0.0), policy=policy, alpha=alpha,
                    length_model=FixedLengths(lengths), **kw)
    c.time_models["fast"] = InstanceTimeModel(prefill_s_per_token=0.0, decode_s_per_token=1.0)
    if slow:
        c.time_models["slow"] = InstanceTimeModel(prefill_s_per_token=0.0, decode_s_per_token=2.0)
    return c


def llm(node_id: str, stage: str) -> Node:
    async def run(ctx):
        return None
    return Node(node_id, stage, NodeKind.LLM, run, hints={"prompt_tokens": 0})


def chain_run(query_id: str, deadline: float, stages: list[str]) -> WorkflowRun:
    g = nx.DiGraph()
    nodes = [llm(f"{query_id}.{i}", s) for i, s in enumerate(stages)]
    for n in nodes:
        g.add_node(n.id, node=n)
    g.add_edges_from((a.id, b.id) for a, b in zip(nodes, nodes[1:]))
    return WorkflowRun(Query("q", "db", arrival=0.0, slo_s=deadline, id=query_id), g)


def occupy(c: Coordinator, instance: str = "fast", tokens: float = 100) -> None:
    """Fill ``instance`` with one long call so later calls wait in its queue."""
    c.length_model.lengths.setdefault("blocker", tokens)
    c.on_query_arrival("blocker", deadline=None)
    call, decisions = c.on_call_ready("blocker", stage="blocker", node_id="b", prompt_tokens=0)
    assert [d.instance for d in decisions] == [instance]
