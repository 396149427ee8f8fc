"""Preemption across SLO classes (agentflow.scheduler.preemption): the decision by hand on one
instance that decodes 1 token/s with no prefill cost (tests/scheduler/utils.py), so every budget and
wait below is seconds you can add up; then its two executors — the simulator (the engine
attempt aborted, the call redone from its prompt) and serving (scripted backends, a Hold:
the batch call's backend request is cancelled while held, and re-run after)."""

from __future__ import annotations

import re

import pytest

from agentflow.config import AgentFlowConfig
from agentflow.scheduler.call import CallState
from agentflow.scheduler.decisions import PreemptCall, StartCall
from agentflow.scheduler.preemption import MAX_PREEMPTIONS, budget_s
from tests.scheduler.utils import chain_run, coordinator


def _ready(c, query_id: str, cls: str, stage: str):
    c.on_query_arrival(query_id, deadline=None, run=chain_run(query_id, 0.0, [stage]),
                       slo_class=cls)
    return c.on_call_ready(query_id, stage=stage, node_id=f"{query_id}.0", prompt_tokens=0)


def _kinds(decisions) -> list[tuple[str, str]]:
    return [(type(d).__name__, d.call.query.id) for d in decisions]


# ------------------------------------------------------------------------------ decision
def test_an_interactive_call_stops_the_batch_call_holding_the_only_slot() -> None:
    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class")
    batch, started = _ready(c, "batch", "batch", "b")
    assert _kinds(started) == [("StartCall", "batch")]
    c.clock.advance_to(5.0)
    c.on_call_progress(batch, 5)
    # budget: 0.1 x 10 s alone = 1 s; the batch call has 100 - 5 = 95 s left: stop it
    inter, decisions = _ready(c, "inter", "interactive", "i")
    assert _kinds(decisions) == [("PreemptCall", "batch"), ("StartCall", "inter")]
    stop = decisions[0]
    assert isinstance(stop, PreemptCall) and (stop.instance, stop.attempt) == ("fast", 0)
    assert batch.state == CallState.WAITING and batch in c.queues["fast"].waiting
    assert batch.attained_tokens == 0 and batch.preemptions == 1  # recompute: progress lost
    assert c.preempted_calls == 1 and batch.attempts == 0  # not a failure, not a retry
    # the interactive call done, the batch call runs again — as its second attempt
    c.clock.advance_to(15.0)
    again = c.on_call_done(inter, output_tokens=10)
    assert _kinds(again) == [("StartCall", "batch")]
    assert isinstance(again[0], StartCall) and again[0].attempt == 1


def test_no_preemption_when_the_wait_fits_the_budget_or_off() -> None:
    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class")
    batch, _ = _ready(c, "batch", "batch", "b")
    c.clock.advance_to(99.5)
    c.on_call_progress(batch, 99)  # 1 s left on the batch call, within the 1 s budget: wait
    _, decisions = _ready(c, "inter", "interactive", "i")
    assert decisions == [] and c.preempted_calls == 0
    for mode in (None, "off"):
        c = coordinator("flowsage", {"b": 100, "i": 10}, preemption=mode)
        _ready(c, "batch", "batch", "b")
        c.clock.advance_to(5.0)
        _, decisions = _ready(c, "inter", "interactive", "i")
        assert decisions == [], mode


def test_a_call_below_the_best_class_in_flight_stops_nothing() -> None:
    """The headroom gate admits only the best class in flight; stopping batch work for a
    standard call while an interactive query runs would free a slot it still may not take."""
    c = coordinator("flowsage", {"b": 100, "i": 10, "s": 10}, preemption="class",
                    max_inflight=2)
    _ready(c, "batch", "batch", "b")
    c.clock.advance_to(1.0)
    _ready(c, "inter", "interactive", "i")  # takes the second slot
    c.clock.advance_to(2.0)
    _, decisions = _ready(c, "std", "standard", "s")
    assert decisions == [] and c.preempted_calls == 0


def test_the_victim_is_the_call_with_least_to_redo_and_only_as_many_as_make_room() -> None:
    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class", max_inflight=2)
    far, _ = _ready(c, "far", "batch", "b")
    near, _ = _ready(c, "near", "batch", "b")
    c.clock.advance_to(50.0)
    c.on_call_progress(far, 50)  # 50 s of decode to redo
    c.on_call_progress(near, 5)  # 5 s
    _, decisions = _ready(c, "inter", "interactive", "i")
    assert _kinds(decisions) == [("PreemptCall", "near"), ("StartCall", "inter")]
    assert far.state == CallState.RUNNING and near.state == CallState.WAITING


def test_a_call_is_stopped_at_most_max_preemptions_times() -> None:
    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class")
    batch, _ = _ready(c, "batch", "batch", "b")
    for n in range(MAX_PREEMPTIONS + 1):
        c.clock.advance_to(c.clock.now() + 5.0)
        inter, decisions = _ready(c, f"inter{n}", "interactive", "i")
        if n < MAX_PREEMPTIONS:
            assert _kinds(decisions) == [("PreemptCall", "batch"), ("StartCall", f"inter{n}")]
            c.clock.advance_to(c.clock.now() + 10.0)
            assert _kinds(c.on_call_done(inter, output_tokens=10)) == [("StartCall", "batch")]
            c.on_query_done(f"inter{n}")
        else:  # immune now: the interactive call waits for it
            assert decisions == [] and inter.state == CallState.WAITING
    assert batch.preemptions == MAX_PREEMPTIONS == c.preempted_calls


def test_co_runners_are_stopped_beyond_what_the_budget_absorbs() -> None:
    """Two slots: the interactive call starts beside a batch call. Learned slope 1 (each
    co-runner doubles the decode time): the batch call costs 10 output tokens x 1 s = 10 s,
    over the 1 s budget, so it is stopped; with a slope of 0.05 it costs 0.5 s and stays."""
    for ratio, stopped in ((2.0, True), (1.05, False)):
        c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class", max_inflight=2)
        model = c.time_models["fast"]
        model.smoothing = 0.0  # keep the decode ratio at 1: only the slope is learned
        for co_runners, r in ((0, 1.0), (1, ratio)):
            model.observe(0, 11, 0.0, 10.0 * r, co_runners=co_runners)
        c._models_epoch += 1
        _ready(c, "batch", "batch", "b")
        _, decisions = _ready(c, "inter", "interactive", "i")
        assert ("PreemptCall", "batch") in _kinds(decisions) if stopped else \
            _kinds(decisions) == [("StartCall", "inter")]


def test_the_budget_is_capped_by_the_deadline_slack() -> None:
    c = coordinator("flowsage", {"i": 10})
    run = chain_run("q", 0.0, ["i"])
    c.on_query_arrival("q", deadline=10.5, run=run, slo_class="interactive")
    call, _ = c.on_call_ready("q", stage="i", node_id="q.0", prompt_tokens=0)
    assert budget_s(c, call, 10.0, 0.0) == pytest.approx(0.5)  # slack 10.5 - 10 < 1
    assert budget_s(c, call, 10.0, 2.0) == 0.0  # late: no delay is affordable


def test_a_bad_preemption_setting_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="preemption must be one of auto, off, class, fair"):
        coordinator("flowsage", {"i": 10}, preemption="always")
    with pytest.raises(ValueError, match="preemption"):
        AgentFlowConfig.model_validate({"scheduler": {"preemption": "always"}})
    assert AgentFlowConfig().scheduler.preemption == "auto"
    assert AgentFlowConfig.model_validate(
        {"scheduler": {"preemption": "class"}}).scheduler.preemption == "class"


@pytest.mark.parametrize("policy", ["vllm", "hexgen-flow", "sagesched", "llf",
                                    "least_loaded+fcfs", "least_loaded+edf"])
def test_preemption_under_a_queue_that_keeps_no_room_is_an_error_naming_the_policy(
        policy: str) -> None:
    """Only flowsage's queue keeps room for a better class; under any other a stopped call
    would be admitted again beside the call it made way for, so the setting would stop
    calls for nothing (before: silently inert). Refused at config load and by the
    coordinator the simulator builds, naming the policy; off is fine with every policy."""
    named = re.escape(f"policy '{policy}' does not")
    with pytest.raises(ValueError, match=named):
        AgentFlowConfig.model_validate({"scheduler": {"policy": policy,
                                                      "preemption": "class"}})
    with pytest.raises(ValueError, match=named):
        coordinator(policy, {"i": 10}, preemption="class")
    assert AgentFlowConfig.model_validate(
        {"scheduler": {"policy": policy, "preemption": "off"}}).scheduler.preemption == "off"
    for ok in ("flowsage", "least_loaded+flowsage", "marginal_delay+flowsage"):
        assert AgentFlowConfig.model_validate(
            {"scheduler": {"policy": ok, "preemption": "class"}}).scheduler.preemption == "class"


def test_simulate_refuses_preemption_with_a_policy_it_cannot_act_under(tmp_path, capsys
                                                                       ) -> None:
    import json

    from agentflow.cli.main import main

    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"Text2SQLRequest": [
        {"step": "extract_keywords", "input_length": 650, "output_length": 20}]}] * 2))
    args = ["simulate", "--trace", str(trace), "--queries", "2", "--preemption", "class"]
    assert main([*args, "--policy", "flowsage,vllm"]) == 2  # before any simulation runs
    assert "policy 'vllm' does not" in capsys.readouterr().err
    assert main([*args, "--policy", "flowsage"]) == 0


# ------------------------------------------------------------------------------ simulator
def _sim_run(preemption: str | None, classes: list[str | None] | None):
    from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
    from agentflow.sim.driver import Simulation
    from agentflow.sim.workload import TraceNode, TraceQuery

    cluster = SimClusterConfig(name="one", instances=[SimInstanceConfig(
        gpu="A100-80G", model="Llama-3.1-8B", max_inflight=1)])
    long_call = TraceQuery(id="long", question="a long batch question",
                           nodes=[TraceNode("g", "generate", "llm", (), 2000, 1500)])
    short = TraceQuery(id="short", question="a short page question",
                       nodes=[TraceNode("g", "generate", "llm", (), 500, 40)])
    sim = Simulation(cluster, "flowsage", preemption=preemption)
    result = sim.run([long_call, short], [0.0, 0.5], [None, None], [1.0, 1.0],
                     tenants=["evalrun", "page"] if classes else None, classes=classes)
    return sim, {r.id.split(":")[1]: r for r in result.records}, result


def test_the_simulator_aborts_the_batch_attempt_and_redoes_it_from_its_prompt() -> None:
    classes = ["batch", "interactive"]
    _, off, _ = _sim_run(None, classes)
    _, alone, _ = _sim_run(None, None)  # each query's run time with nothing beside it
    sim, on, result = _sim_run("class", classes)
    assert all(r.status == "done" for r in (*off.values(), *on.values()))
    assert off["short"].finish > off["long"].finish  # without it: behind the whole batch call
    # with it: the page question runs at once, as fast as it runs behind nothing ...
    assert on["short"].finish < on["long"].finish
    assert on["short"].latency_s < off["short"].latency_s / 3
    # ... and the batch call starts over once it is done: its 0.5 s of tokens are lost
    # (recompute), so it ends a whole alone-run after the page question, not earlier
    long_alone = alone["long"].latency_s
    assert on["long"].finish >= on["short"].finish + 0.99 * long_alone
    assert on["long"].finish > off["long"].finish
    assert (on["long"].preemptions, on["short"].preemptions) == (1, 0)
    summary = result.summary()
    assert summary["preempted_calls"] == 1 and summary["completed"] == 2
    assert summary["tenants"]["evalrun"]["preempted_calls"] == 1
    assert sim.instances["a100-80g-0"].preemptions == 0  # the engine's own (KV) never fired
    assert sim.instances["a100-80g-0"].idle
    # the batch tenant's fair share paid for one run of its call, not the stopped one too
    # (two admissions of ~the same expected time: ~2x the off run's before the refund)
    paid_off = _sim_run(None, classes)[0].coordinator.fairness.virtual_times()
    paid_on = sim.coordinator.fairness.virtual_times()
    assert paid_on[("batch", "evalrun")] < 1.2 * paid_off[("batch", "evalrun")]


def test_without_classes_preemption_changes_nothing_to_the_digit() -> None:
    """Nor does the summary count preemptions in a run without tenants or classes (one pair:
    nothing to stop), so such runs write what they always wrote, whatever the setting."""
    off, *on = (_sim_run(mode, None)[2].summary() for mode in (None, "class", "fair", "auto"))
    assert "preempted_calls" not in off
    assert all(s == off for s in on)


# ------------------------------------------------------------------------------ serving
BATCH_Q, PAGE_Q = "How many stores are there in total?", "Count the stores."


@pytest.mark.timeout(120)
def test_serving_cancels_the_held_batch_call_runs_the_page_call_then_reruns_the_batch_one(
        ) -> None:
    from agentflow.api import AgentFlow
    from agentflow.config import InstanceConfig, SchedulerConfig
    from agentflow.llm.scripted import Hold, ScriptedBackend

    backend = ScriptedBackend({"extract_keywords": "stores"},
                              default="SELECT count(*) FROM stores", name="cpu-0")
    # the batch question's calls wait in the gate until released: running by construction
    hold = Hold(lambda r: BATCH_Q in r.prompt)
    backend.hold = hold
    config = AgentFlowConfig(fewshot=None, pipeline="single",
                             instances=[InstanceConfig(name="cpu-0", max_inflight=1)],
                             scheduler=SchedulerConfig(policy="flowsage", preemption="class"))
    with AgentFlow(config, backends={"cpu-0": backend}) as af:
        batch = af.submit(BATCH_Q, db="bookshop", slo_class="batch")
        hold.wait_held(1)  # the batch call holds the only slot
        page = af.ask(PAGE_Q, db="bookshop", slo_class="interactive")
        # the page question was answered while the batch call was still held: it was
        # stopped — its backend request cancelled, so it left the gate
        assert page.status == "done" and page.rows == [[12]]
        assert not batch.future.done()
        router = af.router
        assert router.coordinator.preempted_calls == 1
        assert router.counts["preempted", "cpu-0"] == 1
        hold.wait_held(1)  # ... and its redo is back in the gate, the only slot free again
        assert hold.arrived == 2
        hold.release()
        answer = batch.result(timeout=60)
    assert answer.status == "done" and answer.rows == [[12]]  # the query never saw an error
    assert not any(c.get("failed_attempts") for s in answer.stages for c in s["llm_calls"])
    assert sum(BATCH_Q in r.prompt for r in backend.calls) == 2  # stopped once, run again
    assert router.counts["retried", "cpu-0"] == 0 and router.counts["error", "cpu-0"] == 0


def test_a_call_that_would_lose_more_than_it_saves_is_left_to_finish() -> None:
    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class")
    batch, _ = _ready(c, "batch", "batch", "b")
    c.clock.advance_to(60.0)
    c.on_call_progress(batch, 60)  # 60 s to redo > the 40 s its stop would save
    inter, decisions = _ready(c, "inter", "interactive", "i")
    assert decisions == [] and inter.state == CallState.WAITING


def test_a_call_past_its_mean_with_a_long_tail_ahead_is_stopped() -> None:
    """The batch stage writes 10 tokens (80%) or 1000 (20%): mean 208 s. At 210 s it has
    written 210 tokens, so it is in the long mode: 790 s left, more than its 210 s redo.
    Priced by its admission-time finish (208 s) it looked done and was never stopped."""
    from agentflow.scheduler.distribution import Distribution
    from agentflow.scheduler.preemption import remaining_s

    def batch_written(tokens: int):
        """A batch call with that tail that has written ``tokens`` at 1 token/s."""
        c = coordinator("flowsage", {"b": Distribution([10, 1000], [0.8, 0.2]), "i": 10},
                        preemption="class")
        batch, _ = _ready(c, "batch", "batch", "b")
        c.clock.advance_to(float(tokens))
        c.on_call_progress(batch, tokens)
        return c, batch

    c, batch = batch_written(210)
    assert remaining_s(c, batch, "fast", 210.0) == pytest.approx(790.0)
    inter, decisions = _ready(c, "inter", "interactive", "i")
    assert _kinds(decisions) == [("PreemptCall", "batch"), ("StartCall", "inter")]
    # past every length it may have (over-run): as much again as written (Gittins' rule),
    # which never beats its redo, so such a call is left to finish
    c, batch = batch_written(1100)
    assert remaining_s(c, batch, "fast", 1100.0) == pytest.approx(1100.0)
    _, decisions = _ready(c, "inter", "interactive", "i")
    assert decisions == []


def test_a_stopped_call_is_charged_to_its_tenant_once_for_the_work() -> None:
    """Fair shares charge a call's expected instance time at admission (100 s here). The
    stopped batch call is admitted twice for one run's work; it must cost its tenant 100 s,
    not 200, or preemption would push the tenant behind its share a second time."""
    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class")
    batch, _ = _ready(c, "batch", "batch", "b")
    assert c.fairness.virtual_time(batch.query) == pytest.approx(100.0)
    c.clock.advance_to(5.0)
    inter, decisions = _ready(c, "inter", "interactive", "i")
    assert ("PreemptCall", "batch") in _kinds(decisions)
    assert c.fairness.virtual_time(batch.query) == 0.0  # refunded while it waits
    assert c.fairness.virtual_time(inter.query) == pytest.approx(10.0)
    c.clock.advance_to(15.0)
    assert _kinds(c.on_call_done(inter, output_tokens=10)) == [("StartCall", "batch")]
    assert c.fairness.virtual_time(batch.query) == pytest.approx(100.0)  # once, not twice


def test_a_retried_call_is_charged_to_its_tenant_once_too() -> None:
    """A run its instance failed is retried from the prompt, like a stopped one: the tenant
    pays for the run that completes, not for each attempt."""
    c = coordinator("flowsage", {"b": 100, "i": 10}, slow=True)
    c.on_query_arrival("i0", deadline=None, run=chain_run("i0", 0.0, ["i"]),
                       slo_class="interactive")  # a second class: fair shares are on
    batch, _ = _ready(c, "batch", "batch", "b")
    assert c.fairness.virtual_time(batch.query) == pytest.approx(100.0)
    first = batch.instance
    decisions = c.on_call_failed(batch, "boom", retryable=True)
    assert ("StartCall", "batch") in _kinds(decisions) and batch.instance != first
    # charged once, for the retry on the other instance (its expected time there)
    assert c.fairness.virtual_time(batch.query) == pytest.approx(
        c.expected_s(batch, batch.instance))
