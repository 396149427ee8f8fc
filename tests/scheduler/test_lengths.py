"""What the scheduler assumes about call lengths: the pipeline's max_tokens caps every
prediction (ready calls and future stages alike)."""

from __future__ import annotations

import networkx as nx
import pytest

from agentflow.scheduler import Coordinator, InstanceSpec
from agentflow.scheduler.lengths.learned import LearnedLengthModel
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
                       clock=ManualClock(0.0), policy="flowsage", length_model=LearnedLengthModel())


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
    assert c.remaining_s(c.queries["capped"], 0.0) < c.remaining_s(c.queries["free"], 0.0)


# ------------------------------------------------------------------ oracle and hint leaks
def _trace(qid: str, cand: int, check: int, cand_prompt: int):
    from agentflow.sim.workload import TraceNode, TraceQuery

    return TraceQuery(id=qid, question="How many singers are there?", nodes=[
        TraceNode("kw", "extract_keywords", "llm", (), 600, 20),
        TraceNode("c0", "generate_candidate", "llm", ("kw",), cand_prompt, cand),
        TraceNode("c1", "generate_candidate", "llm", ("kw",), cand_prompt, cand // 2),
        TraceNode("exec", "execute", "tool", ("c0", "c1"), duration_s=3.0),
        TraceNode("eval", "evaluate", "llm", ("exec",), 900, check)])


def _view_after_arrival(policy: str, trace) -> dict:
    """What the scheduler believes just after the query arrived (its first call running)."""
    from agentflow.sim.cluster import CLUSTERS
    from agentflow.sim.driver import Simulation

    sim = Simulation(CLUSTERS["paper-4gpu"], policy)
    seen: dict = {}

    def look(s: Simulation) -> None:
        c = s.coordinator
        query = c.queries["0:" + trace.id]
        [call] = [x for q in c.queues.values() for x in q.running]
        seen.update(cost=c.remaining_cost(query).mean(), path=c.remaining_s(query, 1e-6),
                    kw=call.output, coordinator=c)

    sim.schedule_hook(1e-6, look)
    sim.run([trace], [0.0], [100.0], [50.0])
    return seen


def test_the_simulator_tells_the_scheduler_no_future_sizes() -> None:
    small = _trace("q", cand=40, check=2, cand_prompt=900)
    large = _trace("q", cand=900, check=200, cand_prompt=12000)
    for policy in ("flowsage", "hexgen-flow", "sagesched"):
        a, b = _view_after_arrival(policy, small), _view_after_arrival(policy, large)
        # future stages differ 20x in the trace, yet the scheduler's view is the same
        assert a["cost"] == b["cost"] and a["path"] == b["path"], policy


def test_the_oracle_sees_true_lengths_everywhere_under_any_policy() -> None:
    from agentflow.scheduler.distribution import cost_distribution
    from agentflow.scheduler.lengths import OracleLengthModel

    small = _trace("q", cand=40, check=2, cand_prompt=900)
    large = _trace("q", cand=900, check=200, cand_prompt=12000)
    for policy in ("oracle", "hexgen-flow@oracle", "least_loaded+edf@oracle"):
        a, b = _view_after_arrival(policy, small), _view_after_arrival(policy, large)
        assert isinstance(a["coordinator"].length_model, OracleLengthModel)
        assert a["kw"].quantile(0.0) == a["kw"].quantile(1.0) == 20  # ready call: the truth
        truth = sum(cost_distribution(p, type(a["kw"]).point(o)).mean()
                    for p, o in ((600, 20), (900, 40), (900, 20), (900, 2)))
        assert a["cost"] == pytest.approx(truth)  # future stages: the truth too
        assert b["cost"] > 10 * a["cost"] and b["path"] > a["path"]
    assert _view_after_arrival("oracle", small)["coordinator"].policy_name == "oracle"


def test_policy_names_pick_the_length_model_from_the_registry() -> None:
    from agentflow.scheduler.policies import parse_policy, policy_help, with_length_model

    assert parse_policy("oracle").length_model == "oracle"
    assert (parse_policy("oracle").dispatch, parse_policy("oracle").queue) == (
        parse_policy("flowsage").dispatch, parse_policy("flowsage").queue)
    assert parse_policy("flowsage").length_model == "learned"
    spec = parse_policy("least_loaded+edf@oracle")
    assert (spec.dispatch, spec.queue, spec.length_model, spec.simulation_only) == (
        "least_loaded", "edf", "oracle", True)
    assert with_length_model("hexgen-flow", "oracle") == "hexgen-flow@oracle"
    assert with_length_model("flowsage@oracle", "learned") == "flowsage@oracle"
    with pytest.raises(ValueError, match="unknown length model 'psychic'"):
        parse_policy("flowsage@psychic")
    assert "oracle" in policy_help() and "oracle" not in policy_help(simulation=False)


def test_oracle_policies_are_refused_outside_the_simulator() -> None:
    from agentflow.evaluation.spec import EvalError, check_policies

    check_policies(["hexgen-flow@oracle", "oracle", "vllm"], simulated=True)
    for name in ("oracle", "sagesched@oracle"):
        with pytest.raises(EvalError, match="only in the simulator"):
            check_policies([name], simulated=False)


def test_simulate_takes_length_model_and_its_earlier_flag_name() -> None:
    from agentflow.cli.main import build_parser

    for flag in ("--length-model", "--predictor"):
        args = build_parser().parse_args(["simulate", "--trace", "t.json", flag, "oracle"])
        assert args.length_model == "oracle"
    with pytest.raises(SystemExit):  # an unknown model is refused, naming the choices
        build_parser().parse_args(["simulate", "--trace", "t.json", "--length-model", "x"])
