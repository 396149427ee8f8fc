"""``marginal_delay`` dispatch, with numbers checkable by hand.

Two batching instances (8 slots each, no KV limit): "fast" prefills 0.01 s and decodes 1 s
per token, "slow" prefills 0.02 s and decodes 2 s per token. A probe call's price on an
instance is ``wait + t + co_runners * prefill``.
"""

from __future__ import annotations

import random

import pytest

from agentflow.scheduler import Coordinator, InstanceSpec, ScheduledCall
from agentflow.scheduler.call import CallState
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.workflow import ManualClock
from tests.scheduler.utils import FixedLengths


def batching(policy: str = "marginal_delay+fcfs", *, slots: int = 8,
             kv: int | None = None) -> Coordinator:
    specs = [InstanceSpec("fast", max_inflight=slots, kv_token_budget=kv),
             InstanceSpec("slow", max_inflight=slots, kv_token_budget=kv)]
    c = Coordinator(specs, clock=ManualClock(0.0), policy=policy,
                    length_model=FixedLengths({"decode": 10, "short": 2}))
    c.time_models["fast"] = InstanceTimeModel(prefill_s_per_token=0.01, decode_s_per_token=1.0)
    c.time_models["slow"] = InstanceTimeModel(prefill_s_per_token=0.02, decode_s_per_token=2.0)
    return c


def probe(c: Coordinator, prompt: int, output: float) -> ScheduledCall:
    query = c.queries.get("probe") or c.on_query_arrival("probe", deadline=None)
    return ScheduledCall(id=f"probe{prompt}", query=query, stage="short", node_id="p",
                         prompt_tokens=prompt, output=Distribution.point(output), ready_at=0.0)


def start_decoders(c: Coordinator, n: int, instance: str = "fast") -> list[ScheduledCall]:
    c.on_query_arrival("load", deadline=None)
    calls = []
    for i in range(n):
        call, decisions = c.on_call_ready("load", stage="decode", node_id=f"d{i}",
                                          prompt_tokens=0)
        assert [d.instance for d in decisions] == [instance]  # free prompts: no stall to price
        calls.append(call)
    return calls


def test_a_long_prompt_leaves_a_busy_batch_and_a_short_one_joins_it() -> None:
    c = batching()
    start_decoders(c, 4)  # four 10 s decodes on "fast"; earliest_finish would see W = 40 s
    long_prompt = probe(c, prompt=2000, output=2)
    # fast: 0 wait + (20 + 2) + 4 co-runners * 20 s = 102; slow: 0 + (40 + 4) + 0 = 44
    price, _ = c.dispatch.price_s(long_prompt, ["fast", "slow"], 0.0, c)
    assert price.tolist() == pytest.approx([102.0, 44.0])
    assert c.dispatch.choose(long_prompt, ["fast", "slow"], 0.0, c) == "slow"
    short_prompt = probe(c, prompt=50, output=2)
    # fast: 0.5 + 2 + 4 * 0.5 = 4.5; slow: 1 + 4 = 5 -> joins the batch
    price, _ = c.dispatch.price_s(short_prompt, ["fast", "slow"], 0.0, c)
    assert price.tolist() == pytest.approx([4.5, 5.0])
    assert c.dispatch.choose(short_prompt, ["fast", "slow"], 0.0, c) == "fast"
    # HEFT's rule prices "fast" as a serial machine (W = 40 s): it sends even the short call
    # to the slow GPU, where it takes 5 s instead of 2.5 s.
    heft = batching("earliest_finish+fcfs")
    heft.on_instance_down("slow")  # so the four decoders all land on "fast"
    start_decoders(heft, 4)
    heft.on_instance_up("slow")
    assert heft.dispatch.choose(probe(heft, prompt=50, output=2), ["fast", "slow"], 0.0,
                                heft) == "slow"


def test_prompts_admitted_but_not_yet_prefilled_are_waited_for() -> None:
    c = batching()
    c.on_query_arrival("q", deadline=None)
    first, _ = c.on_call_ready("q", stage="short", node_id="a", prompt_tokens=300)
    assert first.instance == "fast"  # 3 + 2 = 5 s there, 6 + 4 = 10 s on "slow"
    call = probe(c, prompt=100, output=2)
    # fast: 3 s of prefill ahead + (1 + 2) own + 1 co-runner * 1 s = 7; slow: 2 + 4 = 6
    price, _ = c.dispatch.price_s(call, ["fast", "slow"], 0.0, c)
    assert price.tolist() == pytest.approx([7.0, 6.0])
    c.on_call_progress(first, 1)  # its prefill is done: only the stall it would suffer is left
    price, _ = c.dispatch.price_s(call, ["fast", "slow"], 0.0, c)
    assert price.tolist() == pytest.approx([4.0, 6.0])


def test_a_full_engine_is_priced_with_the_wait_for_a_slot() -> None:
    # One slot per instance: a serial engine. The running call's remainder is the wait (as
    # HEFT counts it), and no one decodes next to the probe's prefill.
    c = batching(slots=1)
    start_decoders(c, 1)  # 10 s on "fast"
    c.clock.advance(4.0)
    call = probe(c, prompt=0, output=2)
    price, _ = c.dispatch.price_s(call, ["fast", "slow"], 4.0, c)
    assert price.tolist() == pytest.approx([6.0 + 2.0, 4.0])
    # KV full: 8 slots, but the decoder holds 10 of 11 KV tokens and the probe needs 2
    c = batching(kv=11)
    start_decoders(c, 1)
    c.clock.advance(4.0)
    price, _ = c.dispatch.price_s(probe(c, prompt=0, output=2), ["fast", "slow"], 4.0, c)
    assert price.tolist() == pytest.approx([6.0 + 2.0, 4.0])


def test_the_load_book_counts_admitted_calls_and_their_kv_through_every_exit() -> None:
    # Random admissions, finishes, failures and cancellations: the book's running count and
    # KV tokens equal what the queues hold, after every step.
    rng = random.Random(7)
    c = batching(slots=3, kv=60)
    c.on_query_arrival("q", deadline=None)
    calls = []
    for step in range(300):
        live = [x for x in calls if x.state in (CallState.RUNNING, CallState.WAITING)]
        action = rng.random()
        if action < 0.5 or not live:
            call, _ = c.on_call_ready("q", stage="short", node_id=f"n{step}", prompt_tokens=
                                      rng.randint(0, 30))
            calls.append(call)
        else:
            call = rng.choice(live)
            if call.state == CallState.RUNNING and action < 0.6:
                c.on_call_progress(call, 1)  # first token: its prefill is done
            elif call.state == CallState.WAITING or action < 0.7:
                c.on_call_cancelled(call)
            elif action < 0.9:
                c.on_call_done(call, output_tokens=2)
            else:
                c.on_call_failed(call, "boom")
        c.clock.advance(rng.random())
        for i, queue in enumerate(c.queues.values()):
            assert c.loads.n_run[i] == len(queue.running)
            assert queue.kv_tokens_in_use == sum(x.kv_reserved for x in queue.running)
            assert c.loads.prefill_prompt[i] == sum(x.prompt_tokens for x in queue.running
                                                    if x.attained_tokens == 0)


def test_the_time_model_learns_how_co_runners_slow_decoding() -> None:
    model = InstanceTimeModel(prefill_s_per_token=0.0, decode_s_per_token=1.0)
    assert model.co_runner_slope() == (0.0, 0.0)  # nothing seen: no slowdown assumed
    for n in [0, 2, 4, 6, 8] * 10:  # decode ratio 1 + 0.1 n: 11 tokens in 10 * ratio s
        model.observe(0, 11, ttft_s=0.0, total_s=10 * (1 + 0.1 * n), co_runners=n)
    slope, seen = model.co_runner_slope()
    assert slope == pytest.approx(0.1) and seen == pytest.approx(4.0, abs=0.2)
    alone = InstanceTimeModel(prefill_s_per_token=0.0, decode_s_per_token=1.0)
    for _ in range(20):  # a serial engine: always alone, so no slope to learn
        alone.observe(0, 11, ttft_s=0.0, total_s=13.0, co_runners=0)
    assert alone.co_runner_slope() == (0.0, 0.0)
    faster = InstanceTimeModel(prefill_s_per_token=0.0, decode_s_per_token=1.0)
    for n in [0, 8] * 10:  # noise that makes company look faster is not a speed-up
        faster.observe(0, 11, ttft_s=0.0, total_s=10 * (1 - 0.05 * n), co_runners=n)
    assert faster.co_runner_slope()[0] == 0.0


def test_finished_calls_teach_the_slope_and_dispatch_prices_it() -> None:
    c = batching()
    decoders = start_decoders(c, 3)  # the first found 0 co-runners, the third 2
    c.clock.advance(4.0)
    c.on_call_done(decoders[2], output_tokens=11, ttft_s=0.0, total_s=10.0)
    w, x, *_ = c.time_models["fast"]._batch_sums
    assert w == 1.0 and x == pytest.approx((2 + 2) / 2)  # 2 beside it at start and at end
    # a learned slope of 0.5 decode-ratio per co-runner at 1 co-runner on average:
    c.time_models["fast"]._batch_sums = [2.0, 2.0, 3.0, 4.0, 4.0]  # (x, y) = (0, 1), (2, 2)
    assert c.time_models["fast"].co_runner_slope() == pytest.approx((0.5, 1.0))
    call = probe(c, prompt=0, output=2)
    # fast: 2 decoders running; the probe decodes D = 2 s there, and each co-runner adds
    # 0.5 * 2 = 1 s to it, as it adds 1 s to each of them.
    #   own: 2 + 1 * (2 - 1) = 3; inflicted: 2 * (0 + 1) = 2 -> 5
    # slow: 4 s, nothing running, nothing learned
    price, _ = c.dispatch.price_s(call, ["fast", "slow"], 4.0, c)
    assert price.tolist() == pytest.approx([5.0, 4.0])


def test_a_call_that_outgrows_its_prediction_holds_more_kv_and_blocks_new_admissions() -> None:
    # Predicted: exactly 10 output tokens, so 10 KV tokens are held for a prompt-less call.
    # It writes 16: past every length the prediction allows, the coordinator now holds twice
    # what it wrote (32, the next progress report) - and a KV budget of 40 that fitted a
    # second 10-token call no longer does, so that one waits instead of being admitted into
    # memory the engine would have to take back by preemption.
    c = batching(kv=40, slots=8)
    c.on_instance_down("slow")
    first = start_decoders(c, 1)[0]
    assert first.kv_reserved == 10 and c.queues["fast"].kv_tokens_in_use == 10
    c.on_call_progress(first, 16)
    # held (``InstanceQueue.note_progress``) until the instance's KV is read, which prices it
    assert c.queues["fast"].kv_tokens_in_use == 32 and first.kv_reserved == 32
    second, decisions = c.on_call_ready("load", stage="decode", node_id="late", prompt_tokens=0)
    assert decisions == [] and second.state == CallState.WAITING
    # once it finishes its memory is all released and the waiting call starts
    decisions = c.on_call_done(first, output_tokens=20)
    assert [d.call for d in decisions] == [second]
    assert c.queues["fast"].kv_tokens_in_use == 10


def test_dispatch_prices_a_held_report_where_it_decides_the_room() -> None:
    # The same outgrown call, both instances up: its report is held, and "fast" fits a
    # 10-token probe without it (10 + 10 <= 40) but not with it (32 + 10 > 40). The room
    # test prices the held report (the bound of what it may add says it could matter), so
    # "fast" is priced with the wait for a slot, as with the report priced at once.
    c = batching(kv=40, slots=8)
    first = start_decoders(c, 1)[0]
    c.on_call_progress(first, 16)
    assert c.loads.kv_folded and c.loads.kv_settled[0] == 10  # held, not priced yet
    call = probe(c, prompt=0, output=10)
    price, _ = c.dispatch.price_s(call, ["fast", "slow"], 0.0, c)
    assert not c.loads.kv_folded and c.loads.kv_settled[0] == 32  # priced by the room test
    assert c._kv_fits(10.0).tolist() == [False, True]
    c.loads.settle_kv()
    assert price.tolist() == c.dispatch.price_s(call, ["fast", "slow"], 0.0, c)[0].tolist()
    # fast: 10 s left on its running call (the wait for a slot) + 10 s own + nothing
    # inflicted (no prompt, the slope unlearned); slow: 20 s alone (without the wait, fast
    # would have been 10 s: the held report decides this dispatch)
    assert price.tolist() == pytest.approx([20.0, 20.0])


def test_a_held_report_that_cannot_change_the_room_stays_held() -> None:
    # With a budget of 100, "fast" fits the probe whatever the held report adds (at most
    # 32 + 10 <= 100): dispatch reads the answer without pricing it; the call then finishes
    # and gives back what it holds, the held report never priced (what it would have
    # added, it would have taken back).
    c = batching(kv=100, slots=8)
    first = start_decoders(c, 1)[0]
    c.on_call_progress(first, 16)
    call = probe(c, prompt=0, output=10)
    c.dispatch.price_s(call, ["fast", "slow"], 0.0, c)
    assert c.loads.kv_folded and c.loads.kv_settled[0] == 10
    c.on_call_done(first, output_tokens=20)
    assert not c.loads.kv_folded and c.loads.kv_pending[0] == 0.0
    assert c.queues["fast"].kv_tokens_in_use == 0
