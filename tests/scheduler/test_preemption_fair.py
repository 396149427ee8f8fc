"""``scheduler.preemption: fair`` (agentflow.scheduler.preemption): within one class, a call of
a tenant within its fair share may stop a running call of a tenant over its share, as a
better class's call may stop a worse class's under ``class``. Hand-computed cases on the test
coordinator (one instance, 1 token/s, no prefill cost, fixed output lengths, a manual clock),
so every wait and budget below is seconds you can add up."""

from __future__ import annotations

import pytest

from agentflow.scheduler.call import CallState
from agentflow.scheduler.classes import call_band
from agentflow.scheduler.decisions import StartCall
from tests.scheduler.utils import chain_run, coordinator

LENGTHS = {"h": 100, "l": 10}  # a heavy tenant's 100 s call, a light tenant's 10 s one


def _arrive(c, qid: str, tenant: str, stage: str, *, ready: bool = True):
    c.on_query_arrival(qid, deadline=1000.0, run=chain_run(qid, 1000.0, [stage]),
                       slo_class="standard", tenant=tenant)
    if not ready:
        return None, []
    return c.on_call_ready(qid, stage=stage, node_id=f"{qid}.0", prompt_tokens=0)


def _kinds(decisions) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.call.query.id) for d in decisions]


def _flooded(mode: str):
    """Light has a query in flight (its first call not ready yet), heavy's 100 s call holds
    the only slot and, charged 100 s against light's 0, is over its share (quantum 10 s)."""
    c = coordinator("flowsage", LENGTHS, preemption=mode)
    c.fairness.quantum_s = 10.0
    _arrive(c, "l0", "light", "l", ready=False)
    heavy, started = _arrive(c, "h0", "heavy", "h")
    assert _kinds(started) == [("StartCall", "h0")]
    assert c.fairness.over_share(heavy.query)
    c.clock.advance_to(5.0)
    c.on_call_progress(heavy, 5)
    return c, heavy


def test_fair_stops_an_over_share_tenants_call_for_an_in_share_tenants() -> None:
    c, heavy = _flooded("fair")
    light_query = c.queries["l0"]
    assert call_band(c, heavy.query) == call_band(c, light_query) + 1
    # light's call: budget 0.1 x 10 s = 1 s; heavy has 95 s left and 5 s to redo: stop it
    light, decisions = c.on_call_ready("l0", stage="l", node_id="l0.0", prompt_tokens=0)
    assert _kinds(decisions) == [("PreemptCall", "h0"), ("StartCall", "l0")]
    assert heavy.state == CallState.WAITING and heavy.preemptions == 1
    assert c.preempted_calls == 1 and heavy.attempts == 0  # not a failure, not a retry
    # its admission charge went back: heavy is charged again when it runs again
    assert c.fairness.virtual_time(heavy.query) == pytest.approx(0.0)
    c.clock.advance_to(15.0)
    again = c.on_call_done(light, output_tokens=10)
    assert _kinds(again) == [("StartCall", "h0")]
    assert isinstance(again[0], StartCall) and again[0].attempt == 1


def test_class_mode_leaves_tenants_of_one_class_to_the_queue() -> None:
    c, heavy = _flooded("class")
    light, decisions = c.on_call_ready("l0", stage="l", node_id="l0.0", prompt_tokens=0)
    assert decisions == [] and light.state == CallState.WAITING
    assert heavy.state == CallState.RUNNING and c.preempted_calls == 0


def test_fair_leaves_an_in_share_tenants_call_alone() -> None:
    """Two tenants both within their share (heavy's charge within the quantum): the light
    call waits for heavy's, as under ``class``: a share balance stops nothing."""
    c = coordinator("flowsage", LENGTHS, preemption="fair")
    c.fairness.quantum_s = 200.0  # heavy's 100 s charge is within it
    _arrive(c, "l0", "light", "l", ready=False)
    heavy, _ = _arrive(c, "h0", "heavy", "h")
    assert not c.fairness.over_share(heavy.query)
    c.clock.advance_to(5.0)
    light, decisions = c.on_call_ready("l0", stage="l", node_id="l0.0", prompt_tokens=0)
    assert decisions == [] and light.state == CallState.WAITING
    assert heavy.state == CallState.RUNNING


def test_fair_still_stops_a_worse_class_for_a_better_one() -> None:
    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="fair")
    c.on_query_arrival("b0", deadline=None, run=chain_run("b0", 0.0, ["b"]), slo_class="batch")
    batch, _ = c.on_call_ready("b0", stage="b", node_id="b0.0", prompt_tokens=0)
    c.clock.advance_to(5.0)
    c.on_call_progress(batch, 5)
    c.on_query_arrival("i0", deadline=None, run=chain_run("i0", 0.0, ["i"]),
                       slo_class="interactive")
    _, decisions = c.on_call_ready("i0", stage="i", node_id="i0.0", prompt_tokens=0)
    assert _kinds(decisions) == [("PreemptCall", "b0"), ("StartCall", "i0")]


def test_the_simulator_reports_progress_under_fair_for_two_tenants_of_one_class() -> None:
    """The simulator tells the coordinator each running call's tokens before a decision only
    while a preemption can happen: under ``class`` with one class in flight it never does
    (runs unchanged to the digit), under ``fair`` two tenants of that class are enough."""
    from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
    from agentflow.sim.driver import Simulation
    from agentflow.sim.workload import TraceNode, TraceQuery

    cluster = SimClusterConfig(name="one", instances=[SimInstanceConfig(
        gpu="A100-80G", model="Llama-3.1-8B", max_inflight=1)])
    queries = [TraceQuery(id=q, question=f"question {q}",
                          nodes=[TraceNode("g", "generate", "llm", (), 500, n)])
               for q, n in (("heavy", 1500), ("light", 40))]
    reported = {}
    for mode in ("class", "fair"):
        sim = Simulation(cluster, "flowsage", preemption=mode)
        before = sim._progress_at
        result = sim.run(queries, [0.0, 0.5], [None, None], [1.0, 1.0],
                         tenants=["heavy", "light"], classes=["standard", "standard"])
        assert all(r.status == "done" for r in result.records)
        reported[mode] = sim._progress_at != before
    assert reported == {"class": False, "fair": True}


def test_the_default_is_fair_under_flowsage_and_off_elsewhere() -> None:
    """``auto``, serving's and the simulator's default: ``fair`` where the queue keeps room
    for better bands, off (not an error) under every other policy; an explicit mode under
    such a policy stays a config error."""
    from agentflow.config import AgentFlowConfig
    from agentflow.scheduler.preemption import check_preemption

    assert AgentFlowConfig().scheduler.preemption == "auto"
    assert check_preemption("auto", "flowsage") == "fair"
    assert check_preemption("auto", "marginal_delay+flowsage") == "fair"
    for policy in ("vllm", "sagesched", "hexgen-flow", "llf"):
        assert check_preemption("auto", policy) is None
        assert AgentFlowConfig.model_validate(
            {"scheduler": {"policy": policy}}).scheduler.preemption == "auto"
        with pytest.raises(ValueError, match=f"policy '{policy}' does not"):
            check_preemption("fair", policy)
    c = coordinator("flowsage", LENGTHS, preemption="auto")
    assert c.preemption == "fair"
    assert coordinator("vllm", LENGTHS, preemption="auto").preemption is None
