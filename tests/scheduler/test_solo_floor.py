"""A shielded call is never priced faster than it runs alone (issue 22, mixed-qwen).

The co-runner slope is a straight line fitted where finished calls ran: under a flood, at 3-10
co-runners. Read at fewer co-runners than that (an instance that is idle at the moment of the
decision), the line falls below the solo decode rate, and below zero where the slope is steep,
as on the MoE instances: mixed-qwen, 2 x L1, seed 1, priced a 12k-token candidate at 0.7 s on
an idle A40 that then took 13.1 s, and the interactive tail was made of such candidates. The
correction is bounded by the instance's solo (profile) rate. Counted, not timed.
"""

from __future__ import annotations

from agentflow.scheduler.policies.dispatch_marginal_delay import MarginalDelayDispatch
from tests.scheduler.utils import coordinator


def _steep_fast_beside_flat_slow():
    c = coordinator("flowsage", {"s": 10, "b": 10}, slow=True, max_inflight=4)
    c.on_query_arrival("batch", deadline=None, slo_class="batch")  # a worse band in flight
    c.on_call_ready("batch", stage="b", node_id="batch.0", prompt_tokens=0)
    fast, slow = c.time_models["fast"], c.time_models["slow"]
    # fast: 1 s a token alone; clean ratio 1.0 learned at 4 co-runners with a slope of 0.5
    # per co-runner, (x, y) = (3, 0.5), (5, 1.5): the line reads -1.0 at no co-runner
    fast.clean_decode_ratio = 1.0
    fast._clean_batch_sums = [2.0, 8.0, 2.0, 34.0, 9.0]
    # slow: 0.8 s a token alone and beside others (no slope)
    slow.decode_s_per_token, slow.clean_decode_ratio = 0.8, 1.0
    c._models_epoch += 1
    c.on_query_arrival("ui", deadline=1000.0, slo_class="interactive")
    return c


def test_the_co_runner_correction_stops_at_the_solo_time() -> None:
    c = _steep_fast_beside_flat_slow()
    call, _ = c.on_call_ready("ui", stage="s", node_id="ui.0", prompt_tokens=0)
    price, _ = MarginalDelayDispatch().price_s(call, ["fast"], 0.0, c)
    # 10 output tokens at 1 s alone: 10 s at least (the line alone would say 10 - 10 x 0.5
    # x (4 - co) < 0)
    assert price.tolist() == [10.0]


def test_the_call_goes_where_it_runs_faster_alone() -> None:
    c = _steep_fast_beside_flat_slow()
    call, _ = c.on_call_ready("ui", stage="s", node_id="ui.0", prompt_tokens=0)
    assert call.instance == "slow"  # 8 s there against 10 s on "fast"
