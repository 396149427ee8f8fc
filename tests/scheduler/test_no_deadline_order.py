"""flowsage's order among queries without a deadline (a batch class): the fair-queueing
finish tag ``arrival + work left`` instead of least work left, so no query waits unboundedly
behind later, shorter ones. One instance decoding 1 token/s (tests/scheduler/utils.py): a stage of N
tokens is N seconds of work."""

from __future__ import annotations

from tests.scheduler.utils import chain_run, coordinator, occupy


def _arrive(c, query_id: str, stage: str, at: float):
    c.clock.advance_to(at)
    run = chain_run(query_id, 0.0, [stage])
    c.on_query_arrival(query_id, deadline=None, run=run, slo_class="batch")
    call, _ = c.on_call_ready(query_id, stage=stage, node_id=f"{query_id}.0", prompt_tokens=0)
    return call


def _order(c, now: float) -> list[str]:
    return [call.query.id for call in c.queues["fast"].ordered_waiting(now)]


def test_a_long_query_is_passed_only_by_queries_arriving_before_its_tag() -> None:
    c = coordinator("flowsage", {"long": 50, "short": 5, "blocker": 1000})
    occupy(c)  # the instance is busy: everything below waits
    _arrive(c, "long", "long", at=0.0)  # tag 0 + 50 = 50
    _arrive(c, "short-early", "short", at=10.0)  # tag 15: ahead, as least-work-first
    _arrive(c, "short-late", "short", at=60.0)  # tag 65: behind the long one that waited
    assert _order(c, 60.0) == ["short-early", "long", "short-late"]


def test_a_steady_stream_of_short_queries_cannot_hold_a_long_one_back() -> None:
    # least work left would keep "long" last for as long as short queries keep coming;
    # with the tag, every short query arriving after t = 50 goes behind it
    c = coordinator("flowsage", {"long": 50, "short": 5, "blocker": 1000})
    occupy(c)
    _arrive(c, "long", "long", at=0.0)
    for i in range(12):
        _arrive(c, f"s{i}", "short", at=10.0 * i + 1.0)  # tags 6, 16, ..., 116
    order = _order(c, 120.0)
    ahead = order[:order.index("long")]
    assert ahead == [f"s{i}" for i in range(5)]  # tags 6..46 < 50; s5 (tag 56) is behind
