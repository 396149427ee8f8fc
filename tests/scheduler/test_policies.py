"""Policies with hand-computed expectations.

The time model is set so that a call's time is exactly its output tokens (seconds per token
= 1 on the "fast" instance, 2 on the "slow" one, no prefill cost) and the length predictor is
a fixed table, so every number below can be checked by hand.
"""

from __future__ import annotations

import math

import pytest

from agentflow.scheduler import ScheduledCall, resolve
from agentflow.scheduler.distribution import Distribution
from tests.scheduler.utils import chain_run, coordinator, occupy


def test_workload_balanced_at_alpha_one_picks_the_fast_gpu_and_at_zero_the_empty_one() -> None:
    # Call of 2 tokens: t(fast) = 2 s, t(slow) = 4 s. fast already holds 6 s of work.
    # alpha=1: score = t_ref/t_i -> fast 2/2 = 1.0, slow 2/4 = 0.5   -> fast
    # alpha=0: score = -W_i/W_ref -> fast -6/6 = -1.0, slow -0/6 = 0 -> slow
    # alpha=.5: fast 0.5 - 0.5 = 0.0, slow 0.25 - 0 = 0.25           -> slow
    expected_scores = {1.0: {"fast": 1.0, "slow": 0.5}, 0.0: {"fast": -1.0, "slow": 0.0},
                       0.5: {"fast": 0.0, "slow": 0.25}}
    for alpha, expected in ((1.0, "fast"), (0.0, "slow"), (0.5, "slow")):
        c = coordinator("workload_balanced+fcfs", {"s": 2}, slow=True, alpha=alpha)
        occupy(c, "fast", tokens=6)
        query = c.on_query_arrival("q", deadline=None)
        probe = ScheduledCall(id="probe", query=query, stage="s", node_id="p", prompt_tokens=0,
                              output=Distribution.point(2), ready_at=0.0)
        assert c.dispatch.scores(probe, ["fast", "slow"], 0.0, c) == pytest.approx(
            expected_scores[alpha])
        call, _ = c.on_call_ready("q", stage="s", node_id="n", prompt_tokens=0)
        assert call.instance == expected, alpha


def test_outstanding_work_is_live_and_falls_when_calls_finish() -> None:
    c = coordinator("least_loaded+fcfs", {"s": 5}, slow=True)
    c.on_query_arrival("q", deadline=None)
    first, _ = c.on_call_ready("q", stage="s", node_id="a", prompt_tokens=0)
    assert first.instance == "fast"  # both empty: tie broken by the faster run time
    assert c.outstanding_work("fast", 0.0) == 5
    c.clock.advance(2.0)
    assert c.outstanding_work("fast", 2.0) == 3  # 3 s of the running call left
    second, _ = c.on_call_ready("q", stage="s", node_id="b", prompt_tokens=0)
    assert second.instance == "slow"  # W_fast = 3 > W_slow = 0
    c.on_call_done(first, output_tokens=5)
    assert c.outstanding_work("fast", 2.0) == 0  # live: falls when the call finishes
    third, _ = c.on_call_ready("q", stage="s", node_id="c", prompt_tokens=0)
    assert third.instance == "fast"


def test_round_robin_ignores_speed_and_load() -> None:
    c = coordinator("vllm", {"s": 1}, slow=True, max_inflight=10)
    c.on_query_arrival("q", deadline=None)
    got = [c.on_call_ready("q", stage="s", node_id=f"n{i}", prompt_tokens=0)[0].instance
           for i in range(4)]
    assert got == ["fast", "slow", "fast", "slow"]


def test_urgency_orders_by_budget_share_and_budgets_shrink_as_time_passes() -> None:
    # Query A: deadline 10, waiting call t=2 with two 3 s stages after it (downstream 6):
    #   budget = 10 * 2 / (2 + 6) = 2.5, urgency = 2 - 2.5 = -0.5
    # Query B: deadline 9, waiting call t=4, nothing after it:
    #   budget = 9 * 4 / 4 = 9,           urgency = 4 - 9 = -5
    # urgency runs A first; EDF would run B first (9 < 10).
    lengths = {"a1": 2, "a2": 3, "a3": 3, "b1": 4}
    for policy, first in (("least_loaded+edf", "B"), ("least_loaded+urgency", "A")):
        c = coordinator(policy, lengths)
        occupy(c)
        run_a = chain_run("A", 10, ["a1", "a2", "a3"])
        run_b = chain_run("B", 9, ["b1"])
        c.on_query_arrival("A", deadline=10, run=run_a)
        c.on_query_arrival("B", deadline=9, run=run_b)
        call_b, _ = c.on_call_ready("B", stage="b1", node_id="B.0", prompt_tokens=0)
        call_a, _ = c.on_call_ready("A", stage="a1", node_id="A.0", prompt_tokens=0)
        order = [call.query.id for call in c.queues["fast"].ordered_waiting(0.0, c)]
        assert order[0] == first, policy
    from agentflow.scheduler.policies.base import budget_and_urgency

    assert budget_and_urgency(call_a, 0.0, c) == pytest.approx((2.5, -0.5))
    assert budget_and_urgency(call_b, 0.0, c) == pytest.approx((9.0, -5.0))
    # At t=4 with A still waiting: budget = (10 - 4) * 2 / 8 = 1.5, urgency = +0.5.
    assert budget_and_urgency(call_a, 4.0, c) == pytest.approx((1.5, 0.5))
    # A slow first stage: once A.0 ran until t=6, A.1's budget is (10-6) * 3 / (3+3) = 2.
    run_a.mark_started("A.0", 0.0)
    run_a.mark_done("A.0", 6.0)
    call_a2, _ = c.on_call_ready("A", stage="a2", node_id="A.1", prompt_tokens=0)
    assert budget_and_urgency(call_a2, 6.0, c) == pytest.approx((2.0, 1.0))


def test_llf_uses_the_query_remaining_critical_path() -> None:
    # A: deadline 10, remaining path 2+3+3 = 8 -> laxity 2.  B: deadline 9, path 4 -> laxity 5.
    c = coordinator("least_loaded+llf", {"a1": 2, "a2": 3, "a3": 3, "b1": 4})
    occupy(c)
    c.on_query_arrival("A", deadline=10, run=chain_run("A", 10, ["a1", "a2", "a3"]))
    c.on_query_arrival("B", deadline=9, run=chain_run("B", 9, ["b1"]))
    c.on_call_ready("B", stage="b1", node_id="B.0", prompt_tokens=0)
    c.on_call_ready("A", stage="a1", node_id="A.0", prompt_tokens=0)
    keys = {call.query.id: c.queues["fast"].policy.key(call, 0.0, c)[1]
            for call in c.queues["fast"].waiting}
    assert keys == {"A": 2.0, "B": 5.0}


def test_gittins_prefers_the_call_likely_to_finish_soon() -> None:
    # Costs with I = 0 are O^2/2. "risky": O = 1 (p .9) or 100 (p .1) -> cost .5 or 5000.
    # "sure": O = 10 -> cost 50. Index(risky) = .9 / (.5) = 1.8 > index(sure) = 1/50.
    # Mean-length order would run "sure" first (10 < 10.9).
    risky = Distribution(values=[1.0, 100.0], probs=[0.9, 0.1])
    c = coordinator("least_loaded+gittins", {"risky": risky, "sure": 10})
    occupy(c)
    c.on_query_arrival("q", deadline=None)
    c.on_call_ready("q", stage="sure", node_id="s", prompt_tokens=0)
    c.on_call_ready("q", stage="risky", node_id="r", prompt_tokens=0)
    assert [x.stage for x in c.queues["fast"].ordered_waiting(0.0, c)] == ["risky", "sure"]


def test_presets_and_bad_names() -> None:
    assert [type(p).__name__ for p in resolve("hexgen-flow")] == [
        "WorkloadBalancedDispatch", "UrgencyQueue"]
    assert [type(p).__name__ for p in resolve("sagesched")] == ["LeastLoadedDispatch",
                                                                 "GittinsQueue"]
    assert [p.name for p in resolve("vllm")] == ["round_robin", "fcfs"]
    assert [p.name for p in resolve("flowsage")] == ["marginal_delay", "flowsage"]
    assert [p.name for p in resolve("llf")] == ["least_loaded", "llf"]
    with pytest.raises(ValueError, match="unknown policy"):
        resolve("fastest")
    with pytest.raises(ValueError, match="unknown queue policy"):
        resolve("round_robin+sjf")
    with pytest.raises(ValueError, match="alpha"):
        resolve("workload_balanced+fcfs", alpha=2.0)
    assert math.isfinite(resolve("hexgen-flow", alpha=0.3)[0].alpha)


def test_flowsage_runs_the_query_most_likely_to_miss_first() -> None:
    # Both queries: deadline 20, one stage left whose mean is 10 s -> the same slack (10 s).
    # "Sure" always writes 10 tokens; "Unsure" writes 2 or 18 (mean 10): its P10-P90 path
    # spread is 16 s, so its miss probability is higher -> it runs first, unlike LLF, which
    # sees equal laxity and falls back to arrival order.
    unsure = Distribution(values=[2.0, 18.0], probs=[0.5, 0.5])
    made = {}
    for policy, first in (("least_loaded+flowsage", "Unsure"), ("least_loaded+llf", "Sure")):
        c = made[policy] = coordinator(policy, {"s": 10, "u": unsure})
        occupy(c)
        c.on_query_arrival("Sure", deadline=20, run=chain_run("Sure", 20, ["s"]))
        c.on_query_arrival("Unsure", deadline=20, run=chain_run("Unsure", 20, ["u"]))
        c.on_call_ready("Sure", stage="s", node_id="Sure.0", prompt_tokens=0)
        c.on_call_ready("Unsure", stage="u", node_id="Unsure.0", prompt_tokens=0)
        order = [x.query.id for x in c.queues["fast"].ordered_waiting(0.0, c)]
        assert order[0] == first, policy
    # z = (D - now - R) / sigma falls faster for the predictable query: once both are late
    # (now = 30, slack -10), the predictable one is the likelier miss.
    c = made["least_loaded+flowsage"]
    assert [x.query.id for x in c.queues["fast"].ordered_waiting(30.0, c)][0] == "Sure"
    assert [x.query.id for x in c.queues["fast"].ordered_waiting(5.0, c)][0] == "Unsure"
