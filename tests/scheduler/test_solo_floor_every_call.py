"""The solo floor holds for every call, not only for shielded ones (issue 22).

Stop 28 kept a call's co-runner correction from pricing it below its time alone only when the
call was shielded (flowsage's class queue, a worse band in flight). The cause is not the
shield: the co-runner slope is a straight line fitted at the co-runner counts finished calls
saw, and read at fewer it undercuts the solo rate whatever queue ranks the call — on the
plain decode ratio as on the clean one. So a call without classes, and a class-ranked call
with no worse band in flight, are floored too. Counted, not timed: each test fails on the
shielded-only rule.
"""

from __future__ import annotations

import pytest

from agentflow.scheduler.coordinator import Coordinator
from agentflow.scheduler.policies.dispatch_marginal_delay import MarginalDelayDispatch
from tests.scheduler.utils import coordinator

# (w, sum x, sum y, sum x^2, sum x*y) of two calls at (3, 0.5) and (5, 1.5): a slope of 0.5
# per co-runner learned at 4 co-runners, a line that reads -1.0 with no co-runner
STEEP = [2.0, 8.0, 2.0, 34.0, 9.0]


def _steep_fast_beside_flat_slow(policy: str) -> Coordinator:
    c = coordinator(policy, {"s": 10}, slow=True, max_inflight=4)
    fast, slow = c.time_models["fast"], c.time_models["slow"]
    fast.decode_ratio, fast._batch_sums = 1.0, list(STEEP)  # 1 s a token alone
    fast.clean_decode_ratio, fast._clean_batch_sums = 1.0, list(STEEP)
    slow.decode_s_per_token = 0.8  # 0.8 s a token alone and beside others (no slope)
    c._models_epoch += 1
    return c


@pytest.mark.parametrize("policy", ["flowsage", "marginal_delay+fcfs"])
def test_an_unshielded_call_is_not_priced_below_its_time_alone(policy: str) -> None:
    c = _steep_fast_beside_flat_slow(policy)
    c.on_query_arrival("q", deadline=1000.0)
    call, _ = c.on_call_ready("q", stage="s", node_id="q.0", prompt_tokens=0)
    assert not c._shielded(call)
    price, _ = MarginalDelayDispatch().price_s(call, ["fast", "slow"], 0.0, c)
    # 10 output tokens at 1 s alone on "fast" (the line alone: 10 - 10 x 0.5 x 4 = -10 s);
    # 8 s on "slow"
    assert price.tolist() == [10.0, 8.0]
    assert call.instance == "slow"


def test_a_class_ranked_call_with_no_worse_band_in_flight_is_floored_too() -> None:
    c = _steep_fast_beside_flat_slow("flowsage")
    c.on_query_arrival("ui", deadline=1000.0, slo_class="interactive")
    call, _ = c.on_call_ready("ui", stage="s", node_id="ui.0", prompt_tokens=0)
    assert not c._shielded(call)  # nothing of a worse band runs or waits
    price, _ = MarginalDelayDispatch().price_s(call, ["fast"], 0.0, c)
    assert price.tolist() == [10.0]


def test_the_floor_does_not_touch_a_call_priced_above_its_time_alone() -> None:
    c = _steep_fast_beside_flat_slow("flowsage")
    fast = c.time_models["fast"]
    fast._batch_sums = [2.0, 0.0, 2.0, 2.0, 1.0]  # (-1, 0.5), (1, 1.5): 0.5 per co-runner at 0
    c._models_epoch += 1
    c.on_query_arrival("q", deadline=1000.0)
    call, _ = c.on_call_ready("q", stage="s", node_id="q.0", prompt_tokens=0)
    price, _ = MarginalDelayDispatch().price_s(call, ["fast"], 0.0, c)
    assert price.tolist() == [10.0]  # no co-runner, learned at 0: its learned time exactly
