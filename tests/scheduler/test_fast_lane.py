"""The fast lane (agentflow.scheduler.fast_lane) and the presence it reads
(agentflow.scheduler.fairness): hand-computed cases on the test coordinator (a 1 token/s
``fast`` instance and a 2 s/token ``slow`` one, 30-token calls for the flood and 1-token
ones for the light tenant, a manual clock)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from agentflow.config import SchedulerConfig
from agentflow.scheduler.call import CallState, QueryState
from agentflow.scheduler.fairness import PRESENCE_GAPS, TenantShares
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS, check_fast_lane
from tests.scheduler.utils import chain_run, coordinator

LENGTHS = {"s": 30, "t": 1}  # heavy's calls, light's


def _query(qid: str, tenant: str, cls: str = "standard") -> QueryState:
    return QueryState(id=qid, arrival=0.0, deadline=None, slo_class=cls, tenant=tenant)


def test_a_tenant_is_present_between_its_queries_until_silent_for_a_few_of_its_gaps() -> None:
    shares = TenantShares(quantum_s=10.0)
    key = ("standard", "light")
    for i, t in enumerate((0.0, 10.0, 20.0)):  # a query every 10 s, each gone at once
        q = _query(f"l{i}", "light")
        shares.arrive(q, t)
        shares.leave(q)
    assert key in shares.present_pairs(20.0 + PRESENCE_GAPS * 10.0 - 1.0)
    assert key not in shares.present_pairs(20.0 + PRESENCE_GAPS * 10.0 + 1.0)


def test_a_tenant_seen_once_is_present_only_while_in_flight() -> None:
    shares = TenantShares(quantum_s=10.0)
    q = _query("l0", "light")
    shares.arrive(q, 0.0)
    assert shares.present_pairs(500.0) == [("standard", "light")]
    shares.leave(q)
    assert shares.present_pairs(0.5) == []


def test_outranked_by_a_present_tenant_behind_in_its_share_or_a_better_class() -> None:
    from agentflow.slo_classes import DEFAULT_SLO_CLASSES

    shares = TenantShares(quantum_s=10.0, classes=lambda: DEFAULT_SLO_CLASSES)
    light, heavy = _query("l", "light"), _query("h", "heavy")
    shares.arrive(light, 0.0)
    shares.arrive(heavy, 0.0)
    shares.charge(heavy, 15.0)  # more than a quantum ahead of light
    assert shares.outranked(("standard", "heavy"), 1.0)
    assert not shares.outranked(("standard", "light"), 1.0)
    shares.charge(light, 10.0)  # within a quantum again
    assert not shares.outranked(("standard", "heavy"), 1.0)
    # a batch tenant is outranked by any present tenant of a better class, whatever its share
    batch = _query("b", "etl", "batch")
    shares.arrive(batch, 1.0)
    assert shares.outranked(("batch", "etl"), 1.0)
    assert not shares.outranked(("standard", "light"), 1.0)


def _arrive(c, qid: str, tenant: str, stage: str = "s"):
    c.on_query_arrival(qid, deadline=1000.0, run=chain_run(qid, 1000.0, [stage]),
                       slo_class="standard", tenant=tenant)
    call, _ = c.on_call_ready(qid, stage=stage, node_id=f"{qid}.0", prompt_tokens=0)
    return call


def _heavy_on(c, instance: str) -> list:
    return [x for x in c.queues[instance].running if x.query.tenant == "heavy"]


def _finish_running(c, instance: str) -> None:
    for call in list(c.queues[instance].running):
        c.on_call_done(call, output_tokens=30)
        c.on_query_done(call.query.id)


def _flood_beside_light(c) -> None:
    """Heavy keeps both instances busy; light sends a 1-second query every 10 s, three
    times, and while each is in flight one of heavy's calls ends and a new one starts (30 s
    charged to heavy): light leaves each time more than a quantum behind heavy."""
    n = 6
    for i in range(n):
        _arrive(c, f"h{i}", "heavy")
    for i in range(3):
        light = _arrive(c, f"l{i}", "light", "t")
        ended = next(x for x in c.queues["fast"].running if x.query.tenant == "heavy")
        c.on_call_done(ended, output_tokens=30)
        c.on_query_done(ended.query.id)
        _arrive(c, f"h{n + i}", "heavy")
        c.clock.advance(1.0)
        c.on_call_done(light, output_tokens=1)
        c.on_query_done(light.query.id)
        c.clock.advance(9.0)


def test_the_flood_runs_at_most_the_cap_on_the_fastest_instance_while_light_is_present() -> None:
    c = coordinator("flowsage", LENGTHS, slow=True, max_inflight=4)
    assert c.fast_lane is not None and c.fast_lane.instance == "fast"
    _flood_beside_light(c)  # nothing of light's in flight now, but it is present
    assert c.fairness.outranked(("standard", "heavy"), c.clock.now())
    _finish_running(c, "fast")  # the lane empties: heavy may refill only two of its slots
    for i in range(20, 26):
        _arrive(c, f"h{i}", "heavy")
    assert len(_heavy_on(c, "fast")) == FAST_LANE_CALLS
    assert any(x.query.tenant == "heavy" for q in c.queues.values() for x in q.waiting)
    # light's next query finds a free slot on the lane at once
    light = _arrive(c, "l9", "light", "t")
    assert light.state == CallState.RUNNING and light.instance == "fast"


def test_once_light_has_gone_silent_the_flood_has_the_whole_cluster() -> None:
    c = coordinator("flowsage", LENGTHS, slow=True, max_inflight=4)
    _flood_beside_light(c)
    c.clock.advance(PRESENCE_GAPS * 10.0)  # silent for more than three of its gaps
    assert not c.fairness.outranked(("standard", "heavy"), c.clock.now())
    _finish_running(c, "fast")
    for i in range(20, 26):
        _arrive(c, f"h{i}", "heavy")
    assert len(_heavy_on(c, "fast")) == 4


def test_the_lane_off_holds_nothing() -> None:
    c = coordinator("flowsage", LENGTHS, slow=True, max_inflight=4, fast_lane=None)
    assert c.fast_lane is None
    _flood_beside_light(c)
    _finish_running(c, "fast")
    for i in range(20, 26):
        _arrive(c, f"h{i}", "heavy")
    assert len(_heavy_on(c, "fast")) == 4


def test_one_instance_has_no_lane_and_other_queues_have_none() -> None:
    alone = coordinator("flowsage", LENGTHS, max_inflight=4)
    assert alone.fast_lane is not None and alone.fast_lane.instance is None
    heavy = _arrive(alone, "h0", "heavy")
    assert not alone.fast_lane.holds(alone.queues["fast"], heavy)
    assert coordinator("hexgen-flow", LENGTHS, slow=True).fast_lane is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_setting_is_refused(bad) -> None:
    with pytest.raises(ValueError, match="fast_lane"):
        check_fast_lane(bad)
    if isinstance(bad, int) and not isinstance(bad, bool):
        with pytest.raises(ValidationError):
            SchedulerConfig(fast_lane=bad)
    assert SchedulerConfig(fast_lane=None).fast_lane is None
    assert SchedulerConfig().fast_lane == FAST_LANE_CALLS


# ------------------------------------------------------------------------------ simulator
def _flood_and_light(fast_lane: int | None) -> dict[str, list[float]]:
    """A MoE model on an H200 and an A40: a heavy tenant sends a 4-call query every second
    on average (120 of them), a light one every 10 s (10); latencies per tenant."""
    import numpy as np

    from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
    from agentflow.sim.driver import Simulation
    from agentflow.sim.workload import TraceNode, TraceQuery

    cluster = SimClusterConfig(name="two", instances=[
        SimInstanceConfig(gpu="H200", model="Qwen3-30B-A3B"),
        SimInstanceConfig(gpu="A40", model="Qwen3-30B-A3B", weight_bits=8)])

    def query(qid: str) -> TraceQuery:
        return TraceQuery(id=qid, question=f"question {qid}", nodes=[
            TraceNode("a", "link", "llm", (), 3000, 60),
            TraceNode("b", "generate", "llm", ("a",), 6000, 600),
            TraceNode("c", "generate", "llm", ("a",), 6000, 600),
            TraceNode("d", "revise", "llm", ("b", "c"), 4000, 100)])

    rng = np.random.default_rng(0)
    sent = [(float(t), f"h{i}", "heavy")
            for i, t in enumerate(np.cumsum(rng.exponential(1.0, 120)))]
    sent += [(15.0 + 10.0 * i, f"l{i}", "light") for i in range(10)]
    sent.sort()
    sim = Simulation(cluster, "flowsage", fast_lane=fast_lane)
    result = sim.run([query(q) for _, q, _ in sent], [t for t, _, _ in sent],
                     [None] * len(sent), [1.0] * len(sent), tenants=[w for _, _, w in sent],
                     classes=["standard"] * len(sent))
    out: dict[str, list[float]] = {"light": [], "heavy": []}
    for r in result.records:
        assert r.status == "done" and r.latency_s is not None
        out[str(r.tenant)].append(r.latency_s)
    return out


def test_in_the_simulator_the_lane_shortens_the_light_tenants_worst_queries() -> None:
    on, off = _flood_and_light(FAST_LANE_CALLS), _flood_and_light(None)
    assert len(on["heavy"]) == len(off["heavy"]) == 120  # the flood is not starved
    # 9 of the light tenant's 10 queries: 8.4 s at worst with the lane, 15.3 s without (the
    # issue-40 step model: GEMM tiles and knee, decode waves). Its worst query with the lane
    # (16.0 s, against 9.4 s without) is the one case the lane does not help here; with the
    # earlier step model every query was under 11.2 s against 15.7 s.
    light_on, light_off = sorted(on["light"]), sorted(off["light"])
    assert light_on[-2] < 0.8 * light_off[-2]
    assert float(np.median(light_on)) < 0.9 * float(np.median(light_off))


def test_simulate_takes_the_lane_setting_and_refuses_a_bad_one(tmp_path, capsys) -> None:
    import json

    from agentflow.cli.main import main

    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"Text2SQLRequest": [
        {"step": "extract_keywords", "input_length": 650, "output_length": 20}]}] * 2))
    args = ["simulate", "--trace", str(trace), "--queries", "2", "--policy", "flowsage"]
    with pytest.raises(SystemExit):
        main([*args, "--fast-lane", "0"])
    assert "whole number of calls" in capsys.readouterr().err
    out = tmp_path / "off.json"
    assert main([*args, "--fast-lane", "off", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["fast_lane"] is None
    default = tmp_path / "default.json"
    assert main([*args, "--json", str(default)]) == 0
    assert "fast_lane" not in json.loads(default.read_text())["config"]  # as before the lane
