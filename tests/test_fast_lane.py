"""The fast lane (agentflow.scheduler.fast_lane) and the presence it reads
(agentflow.scheduler.fairness): hand-computed cases on the test coordinator (a 1 token/s
``fast`` instance and a 2 s/token ``slow`` one, 30-token calls for the flood and 1-token
ones for the light tenant, a manual clock)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentflow.config import SchedulerConfig
from agentflow.scheduler.call import CallState, QueryState
from agentflow.scheduler.fairness import PRESENCE_GAPS, TenantShares
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS, check_fast_lane
from tests.helpers import chain_run, coordinator

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
