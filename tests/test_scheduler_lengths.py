"""What the scheduler assumes about call lengths: the pipeline's max_tokens caps every
prediction (ready calls and future stages alike)."""

from __future__ import annotations

import networkx as nx

from agentflow.scheduler import Coordinator, InstanceSpec
from agentflow.scheduler.predictor import LengthPredictor
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun


async def _never(ctx):  # the nodes are only looked at, never run
    raise AssertionError("not run")


def _run(query_id: str, caps: dict[str, int | None]) -> WorkflowRun:
    """generate_candidate -> revise, with the given max_tokens hints."""
    g = nx.DiGraph()
    for node_id, stage in (("gen", "generate_candidate"), ("rev", "revise")):
        hints = {"prompt_tokens": 700}
        if caps.get(node_id) is not None:
            hints["max_tokens"] = caps[node_id]
        g.add_node(node_id, node=Node(node_id, stage, NodeKind.LLM, _never, hints=hints))
    g.add_edge("gen", "rev")
    return WorkflowRun(Query("How many?", "db", arrival=0.0, slo_s=60.0, id=query_id), g)


def _coordinator() -> Coordinator:
    return Coordinator([InstanceSpec("a", gpu="A100-80G", model="Llama-3.1-8B",
                                     max_inflight=4)],
                       clock=ManualClock(0.0), policy="flowsage", predictor=LengthPredictor())


def test_a_ready_calls_prediction_is_clipped_to_its_max_tokens() -> None:
    c = _coordinator()
    c.on_query_arrival("q", deadline=60.0, key_text="How many?", run=_run("q", {}))
    free, _ = c.on_call_ready("q", stage="generate_candidate", node_id="x", prompt_tokens=700)
    capped, _ = c.on_call_ready("q", stage="generate_candidate", node_id="y",
                                prompt_tokens=700, max_tokens=160)
    assert free.output.quantile(0.9) > 160  # the stage prior alone is far above the cap
    assert capped.output.quantile(1.0) <= 160
    assert capped.mean_output < free.mean_output
    # KV admission reserves prompt + P90 output: the cap bounds it too.
    assert c._kv_tokens(capped) <= 700 + 160


def test_future_stages_are_estimated_under_their_max_tokens_hint() -> None:
    c = _coordinator()
    run_free = _run("free", {})
    run_capped = _run("capped", {"gen": 160, "rev": 160})
    c.on_query_arrival("free", deadline=60.0, key_text="How many?", run=run_free)
    c.on_query_arrival("capped", deadline=60.0, key_text="How many?", run=run_capped)
    free = c.remaining_cost(c.queries["free"]).mean()
    capped = c.remaining_cost(c.queries["capped"]).mean()
    assert capped < free
    # both stages at most 160 tokens: cost = O^2/2 + I*O <= 2 * (160^2/2 + 700*160)
    assert c.remaining_cost(c.queries["capped"]).quantile(1.0) <= 2 * (160 ** 2 / 2 + 700 * 160)
    assert run_capped.remaining_critical_path(0.0) < run_free.remaining_critical_path(0.0)
