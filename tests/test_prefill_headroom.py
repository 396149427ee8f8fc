"""The cluster-wide prefill headroom of the headroom gate (agentflow.scheduler.classes): while
an in-share tenant of a class has queries in flight, the prompts of that class's over-share
tenants prefill on at most 1 - HEADROOM of the up instances at once, and a held call is
offered its instance again the moment such a prompt finishes prefilling elsewhere. Two
identical instances (4 slots, 0.01 s per prompt token, 1 s per output token) and a manual
clock: nothing here is timed."""

from __future__ import annotations

from agentflow.scheduler import Coordinator, InstanceSpec
from agentflow.scheduler.call import CallState
from agentflow.scheduler.decisions import StartCall
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.workflow import ManualClock
from tests.helpers import FixedLengths, chain_run


def _cluster(names: str = "ab") -> Coordinator:
    c = Coordinator([InstanceSpec(n, max_inflight=4) for n in names], clock=ManualClock(0.0),
                    policy="flowsage", length_model=FixedLengths({"s": 30, "long": 100}))
    for n in names:
        c.time_models[n] = InstanceTimeModel(prefill_s_per_token=0.01, decode_s_per_token=1.0)
    c.fairness.quantum_s = 10.0
    return c


def _arrive(c: Coordinator, qid: str, tenant: str, *, ready: bool = True,
            cls: str = "standard"):
    c.on_query_arrival(qid, deadline=1000.0, run=chain_run(qid, 1000.0, ["long"]),
                       slo_class=cls, tenant=tenant)
    if not ready:
        return None, []
    return c.on_call_ready(qid, stage="long", node_id=f"{qid}.0", prompt_tokens=1000)


def test_worse_band_prefill_keeps_an_instance_clean_and_resumes_when_a_prompt_is_done() -> None:
    c = _cluster()
    _arrive(c, "l0", "light", ready=False)  # light in flight: the better band
    h0, _ = _arrive(c, "h0", "heavy")  # 100 s charged: heavy over its share, a worse band
    assert h0.state == CallState.RUNNING and c.fairness.over_share(h0.query)
    c.on_call_progress(h0, 1)  # h0 decodes on its instance
    h1, _ = _arrive(c, "h1", "heavy")  # the other instance, empty: always admits
    assert h1.state == CallState.RUNNING and h1.instance != h0.instance
    # h1's prompt is mid-prefill: one of the two instances (1 - HEADROOM of 2, rounded
    # down) already carries a worse-band prefill, so h2 is held off h0's instance too
    h2, decisions = _arrive(c, "h2", "heavy")
    assert h2.instance == h0.instance and h2.state == CallState.WAITING and decisions == []
    # h1 writes its first token: h2's instance is offered its queue again at once
    decisions = c.on_call_progress(h1, 1)
    assert [(d.call, d.instance) for d in decisions if isinstance(d, StartCall)] == [
        (h2, h0.instance)]
    assert h2.state == CallState.RUNNING
    # h2's prompt is now the one prefilling: h3 is held wherever it goes ...
    h3, _ = _arrive(c, "h3", "heavy")
    assert h3.state == CallState.WAITING
    # ... and a held call blocks nobody better: a light call sent to the same instance
    # starts past it (it is first in the queue's order), beside the prefill
    light, _ = _arrive(c, "l1", "light")
    assert light.instance == h3.instance and light.state == CallState.RUNNING
    assert h3.state == CallState.WAITING


def test_without_a_better_band_in_flight_nothing_is_held() -> None:
    c = _cluster()
    h0, _ = _arrive(c, "h0", "heavy")  # heavy alone: in share, the best band there is
    c.on_call_progress(h0, 1)
    h1, _ = _arrive(c, "h1", "heavy")
    h2, _ = _arrive(c, "h2", "heavy")
    assert CallState.WAITING not in {h0.state, h1.state, h2.state}


def test_a_lower_class_is_left_to_the_per_instance_gate() -> None:
    # an interactive query in flight and a batch flood: the same moves as the first test,
    # but the batch class is a worse class, not an over-share tenant: h2 starts
    c = _cluster()
    _arrive(c, "i0", "page", ready=False, cls="interactive")
    h0, _ = _arrive(c, "h0", "eval", cls="batch")
    c.on_call_progress(h0, 1)
    h1, _ = _arrive(c, "h1", "eval", cls="batch")
    assert h1.instance != h0.instance
    h2, _ = _arrive(c, "h2", "eval", cls="batch")
    assert h2.instance == h0.instance and h2.state == CallState.RUNNING
