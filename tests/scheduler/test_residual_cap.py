"""A running call's expected remainder never passes its ``max_tokens``
(``gittins.expected_residual``), and preemption prices it so: a call near its cap is about to
end, whatever its length distribution's over-run rule says. By hand, on the one-instance
coordinator of ``tests/scheduler/utils.py`` (1 decode token per second, no prefill cost)."""

from __future__ import annotations

import pytest

from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.gittins import expected_residual
from agentflow.scheduler.preemption import remaining_s
from tests.scheduler.utils import chain_run, coordinator

TAIL = Distribution([10, 1000], [0.8, 0.2])  # short mostly, sometimes 1000 tokens


def test_the_over_run_remainder_is_capped_by_what_the_call_may_still_write() -> None:
    # past every length it may have: "as much again as written" ...
    assert expected_residual(TAIL, 1100) == pytest.approx(1100.0)
    # ... but it may write only 20 more, and nothing at its cap
    assert expected_residual(TAIL, 1100, max_tokens=1120) == pytest.approx(20.0)
    assert expected_residual(TAIL, 1120, max_tokens=1120) == 0.0
    # within its distribution the cap binds too, and a loose cap changes nothing
    assert expected_residual(TAIL, 100, max_tokens=150) == pytest.approx(50.0)
    assert expected_residual(TAIL, 100, max_tokens=5000) == expected_residual(TAIL, 100)
    with pytest.raises(ValueError, match="max_tokens"):
        expected_residual(TAIL, 0, max_tokens=-1)


def _ready(c, query_id: str, cls: str, stage: str, max_tokens: int | None = None):
    c.on_query_arrival(query_id, deadline=None, run=chain_run(query_id, 0.0, [stage]),
                       slo_class=cls)
    return c.on_call_ready(query_id, stage=stage, node_id=f"{query_id}.0", prompt_tokens=0,
                           max_tokens=max_tokens)


def test_a_call_at_its_cap_is_waited_for_not_a_reason_to_stop_another() -> None:
    """Two batch calls hold both slots: one 1100 tokens in with a cap of 1101 (1 s left),
    one just started. The page call's budget is 0.1 x its 20 s alone = 2 s, so waiting for
    the capped call fits it and nothing is stopped. Priced without the cap, the capped call
    had 1100 s left, the wait did not fit, and the other batch call was stopped for nothing."""
    c = coordinator("flowsage", {"b": TAIL, "i": 20}, preemption="class", max_inflight=2)
    capped, _ = _ready(c, "capped", "batch", "b", max_tokens=1101)
    assert capped.max_tokens == 1101  # the coordinator keeps the runtime's cap on the call
    c.clock.advance_to(1100.0)
    c.on_call_progress(capped, 1100)
    fresh, started = _ready(c, "fresh", "batch", "b")
    assert [type(d).__name__ for d in started] == ["StartCall"]
    assert remaining_s(c, capped, "fast", 1100.0) == pytest.approx(1.0)
    inter, decisions = _ready(c, "inter", "interactive", "i")
    assert decisions == []  # it waits about 1 s for the capped call's last token
    assert fresh.preemptions == 0 and c.preempted_calls == 0
    c.clock.advance_to(1101.0)
    assert [(type(d).__name__, d.call.query.id)
            for d in c.on_call_done(capped, output_tokens=1101)] == [("StartCall", "inter")]
