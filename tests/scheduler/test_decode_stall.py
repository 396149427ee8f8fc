"""A call's decode is priced net of other prompts' prefill when the headroom gate shields it
(issue 22, isolation).

Beside a batch flood, most finished calls are batch calls that decoded through batch prompts'
prefill chunks (a chunk step costs every sequence in it the chunk's time, ~11 decode steps of
an 8B model on an A100). The plain decode ratio learns that stall as the instance's speed, and
dispatch then prices an interactive call — which the gate keeps away from new batch prefill —
as if it would sit through it too. These tests count, they do not time: hand-computed decodes,
then a coordinator with a manual clock.
"""

from __future__ import annotations

from agentflow.scheduler.time_model import InstanceTimeModel
from tests.scheduler.utils import coordinator


def _model() -> InstanceTimeModel:
    return InstanceTimeModel(prefill_s_per_token=1e-3, decode_s_per_token=0.02)


def test_the_clean_ratio_is_the_decode_speed_without_the_prefill_it_sat_through() -> None:
    m = _model()
    for i in range(60):
        out, during = 200, 4000 * (i % 3)  # 0, 4000 or 8000 tokens prefilled beside it
        # a step carrying a chunk costs the chunk's prefill (its decode runs inside it):
        # 2 or 4 of the 199 steps are chunk steps
        mixed = -(-during // 2048)
        decode = 1.5 * (out - 1 - mixed) * m.decode_s_per_token + during * m.prefill_s_per_token
        m.observe(1000, out, ttft_s=1.0, total_s=1.0 + decode, prefill_during_tokens=during,
                  co_runners=1.0)
    assert abs(m.clean_decode_ratio - 1.5) < 1e-6
    assert m.decode_ratio > 2.0  # the plain ratio holds the stall: 8 s of 6 s decodes


def test_a_decode_made_of_chunk_steps_leaves_the_clean_ratio_alone() -> None:
    """Under a flood of long prompts nearly every step of a call carries a chunk; its time is
    the stall, not its decode speed. Subtracting the stall but dividing by every step made
    the clean ratio fall to its floor (review finding); such a call is not read."""
    m = _model()
    for _ in range(60):
        out, during = 120, 118 * 2048  # 118 of its 119 steps carry a chunk
        decode = 1.0 * m.decode_s_per_token + during * m.prefill_s_per_token
        m.observe(1000, out, ttft_s=1.0, total_s=1.0 + decode, prefill_during_tokens=during,
                  co_runners=3.0)
    assert m.clean_decode_ratio == 1.0  # the prior: no call said anything about decode
    assert m.co_runner_slope(clean=True) == (0.0, 0.0)
    assert m.decode_ratio > 10  # the plain ratio reads the chunks as decode


def test_without_the_count_the_clean_ratio_is_the_plain_one() -> None:
    a, b = _model(), _model()
    for i in range(20):
        a.observe(500, 100 + i, ttft_s=0.6, total_s=0.6 + 3.0 + 0.1 * i, co_runners=float(i % 4))
        b.observe(500, 100 + i, ttft_s=0.6, total_s=0.6 + 3.0 + 0.1 * i, co_runners=float(i % 4),
                  prefill_during_tokens=0.0)
    assert a.clean_decode_ratio == a.decode_ratio == b.decode_ratio == b.clean_decode_ratio
    assert a.co_runner_slope(clean=True) == a.co_runner_slope()


def test_the_queue_counts_the_prompts_prefilled_while_a_call_decoded() -> None:
    c = coordinator("flowsage", {"s": 10}, max_inflight=4)
    c.time_models["fast"] = _model()
    q = c.queues["fast"]

    def ready(qid: str, prompt: int):
        c.on_query_arrival(qid, deadline=None)
        call, _ = c.on_call_ready(qid, stage="s", node_id=f"{qid}.0", prompt_tokens=prompt)
        return call

    a = ready("a", 300)
    b = ready("b", 5000)  # admitted before a's first token: its prefill is a's TTFT
    c.on_call_progress(b, 1)
    c.on_call_progress(a, 1)
    assert q.prefilled_since_first_token(a) == 0
    late = ready("late", 2000)
    c.on_call_progress(late, 1)
    assert q.prefilled_since_first_token(a) == 2000
    assert q.prefilled_since_first_token(ready("new", 10)) is None  # no first token yet
    c.clock.advance(5.0)
    # a prefilled at the base rate (0.3 s), then decoded 10 tokens: 9 steps, one of them
    # carrying late's 2000-token prefill (2 s), the other 8 at 1.5x base (0.24 s)
    c.on_call_done(a, output_tokens=10, ttft_s=0.3, total_s=0.3 + 0.16 * 1.5 + 2.0)
    m = c.time_models["fast"]
    assert abs(m.prefill_ratio - 1.0) < 1e-9
    assert abs(m.clean_decode_ratio - (0.8 + 0.2 * 1.5)) < 1e-9
    assert m.decode_ratio > 2.0


def _two_instances(policy: str = "flowsage"):
    c = coordinator(policy, {"s": 10, "b": 10}, slow=True, max_inflight=4)
    # same base speed; "fast" learned a decode ratio of 3 that is all prefill stall
    c.time_models["slow"].decode_s_per_token = 1.0
    fast, slow = c.time_models["fast"], c.time_models["slow"]
    fast.decode_ratio, fast.clean_decode_ratio = 3.0, 1.0
    slow.decode_ratio = slow.clean_decode_ratio = 1.5
    c._models_epoch += 1
    return c


def _interactive(c, qid: str) -> str:
    c.on_query_arrival(qid, deadline=1000.0, slo_class="interactive")
    call, _ = c.on_call_ready(qid, stage="s", node_id=f"{qid}.0", prompt_tokens=0)
    assert call.instance is not None
    return call.instance


def test_a_shielded_call_is_priced_with_the_clean_ratio() -> None:
    c = _two_instances()
    c.on_query_arrival("batch", deadline=None, slo_class="batch")
    c.on_call_ready("batch", stage="b", node_id="batch.0", prompt_tokens=0)
    # a batch call is in flight: the gate keeps new batch prefill off the interactive call's
    # instance, so it is priced at the decode speed net of stalls (fast: 10 s, slow: 15 s)
    assert _interactive(c, "ui") == "fast"


def test_a_class_queue_without_the_gate_keeps_the_plain_ratio() -> None:
    # fcfs ranks by class but installs no headroom gate: batch prefill may start beside the
    # interactive call, as the plain ratio saw, so nothing shields it (review finding)
    c = _two_instances("marginal_delay+fcfs")
    c.on_query_arrival("batch", deadline=None, slo_class="batch")
    c.on_call_ready("batch", stage="b", node_id="batch.0", prompt_tokens=0)
    assert _interactive(c, "ui") == "slow"


def test_with_no_worse_band_in_flight_the_plain_ratio_prices_it() -> None:
    c = _two_instances()
    # nothing shields it: its co-runners' prefill may start beside it, as the plain ratio saw
    assert _interactive(c, "ui") == "slow"


def test_the_gate_switches_the_co_runner_slope_dispatch_reads_too() -> None:
    """The slope as well as the ratio: plain (0.5 per co-runner, all of it prefill stall)
    while nothing worse is in flight, clean (none) once a batch call is."""
    c = coordinator("flowsage", {"s": 10, "b": 10}, slow=True, max_inflight=4)
    fast = c.time_models["fast"]
    fast._batch_sums = [2.0, 2.0, 3.0, 4.0, 4.0]  # (x, y) = (0, 1), (2, 2): 0.5 at 1 seen
    fast._clean_batch_sums = [2.0, 2.0, 2.0, 4.0, 2.0]  # (0, 1), (2, 1): flat
    c._models_epoch += 1
    c.on_query_arrival("ui", deadline=1000.0, slo_class="interactive")
    ui, _ = c.on_call_ready("ui", stage="s", node_id="ui.0", prompt_tokens=0)
    # 10 output tokens at 1 s each: 0.5 x 10 s per co-runner, learned at 1 co-runner
    view = c.batch_view(ui, ["fast"], 0.0)
    assert view.co_runner_decode_s.tolist() == [5.0] and view.co_runners_seen.tolist() == [1.0]
    c.on_query_arrival("batch", deadline=None, slo_class="batch")
    c.on_call_ready("batch", stage="b", node_id="batch.0", prompt_tokens=0)
    view = c.batch_view(ui, ["fast"], 0.0)
    assert view.co_runner_decode_s.tolist() == [0.0] and view.co_runners_seen.tolist() == [1.0]


# ------------------------------------------------------------------- preemption (option)
def _prefilling_batch_beside(prompt: int, elapsed: float):
    """A batch call admitted at 0 with a ``prompt`` that prefills at 10 ms a token; an
    interactive call admitted beside it at ``elapsed`` (4 slots, so it starts at once)."""
    from agentflow.scheduler.decisions import PreemptCall

    c = coordinator("flowsage", {"b": 100, "i": 10}, preemption="class", max_inflight=4)
    c.time_models["fast"] = InstanceTimeModel(prefill_s_per_token=0.01, decode_s_per_token=1.0)
    c.on_query_arrival("batch", deadline=None, slo_class="batch")
    batch, _ = c.on_call_ready("batch", stage="b", node_id="batch.0", prompt_tokens=prompt)
    c.clock.advance_to(elapsed)
    c.on_query_arrival("ui", deadline=None, slo_class="interactive")
    _, decisions = c.on_call_ready("ui", stage="i", node_id="ui.0", prompt_tokens=0)
    stopped = [d.call.query.id for d in decisions if isinstance(d, PreemptCall)]
    return stopped, batch, c


def test_a_batch_call_still_prefilling_is_stopped_for_the_interactive_call_beside_it() -> None:
    # 1000 tokens = 10 s of prefill, 1 s done: its 9 s left would stall every step of the
    # interactive call (budget 0.1 x 10 s = 1 s); stopping it loses only the 1 s done
    stopped, batch, _ = _prefilling_batch_beside(1000, 1.0)
    assert stopped == ["batch"] and batch.preemptions == 1


def test_a_stopped_prompt_is_not_counted_as_prefilled() -> None:
    # the victim's 1000-token prompt had run 1 s of its 10: it did not stall anyone's decode
    # steps as a whole prompt, and its redo will be counted when it runs (review finding)
    stopped, _, c = _prefilling_batch_beside(1000, 1.0)
    assert stopped == ["batch"]
    assert c.queues["fast"].prefilled_tokens == 0


def test_a_batch_call_nearly_prefilled_or_decoding_is_left_alone() -> None:
    # 9.5 s of 10 done: 0.5 s left fits the budget
    assert _prefilling_batch_beside(1000, 9.5)[0] == []
    # a short prompt (0.5 s) that is done: nothing left to stall (no co-runner slope learned)
    assert _prefilling_batch_beside(50, 1.0)[0] == []


def test_in_the_simulator_the_clean_slope_is_the_decode_physics_and_the_plain_one_the_stall(
        ) -> None:
    """A flooded A100 running an 8B model (the prefill test's flood, real engine): decode is
    weight-bound there, so a co-runner barely slows it; the plain regression, fed decodes
    that sat through co-runners' prompt chunks, learns each co-runner as tens of percent."""
    from tests.scheduler.test_time_model_prefill import _flood

    quiet, _ = _flood(rate=0.05, n=30)
    busy, _ = _flood(rate=3.0, n=120)
    alone = quiet.coordinator.time_models["a100"]
    m = busy.coordinator.time_models["a100"]
    plain_slope, seen = m.co_runner_slope()
    clean_slope, _ = m.co_runner_slope(clean=True)
    assert seen > 4 and plain_slope > 0.1  # what dispatch would price 5+ co-runners at
    # each co-runner's KV read at 4-12k tokens of context is a few percent of a weight-bound
    # 8B decode step on an A100 (Vidur's rows: 1.9% per co-runner at 2k, 8.5% at 12k, B = 1
    # -> 32): that, not tens of percent, is what the clean slope holds
    assert clean_slope < 0.25 * plain_slope and 0.0 < clean_slope < 0.09
    assert abs(m.clean_decode_ratio - alone.clean_decode_ratio) < 0.1 * alone.clean_decode_ratio


def test_a_prompt_queued_behind_another_has_done_none_of_its_prefill() -> None:
    """The engine prefills the prompts admitted before a call first, so 5 s after admission
    behind a 10 s prompt a call has done none of its own: all 10 s of it are left, and
    stopping it loses nothing (review finding: counted from admission, it had 'done' 5 s)."""
    from agentflow.scheduler.preemption import prefill_left_s, redo_s

    c = coordinator("flowsage", {"b": 100}, max_inflight=4)
    c.time_models["fast"] = InstanceTimeModel(prefill_s_per_token=0.01, decode_s_per_token=1.0)
    calls = []
    for qid in ("first", "second"):
        c.on_query_arrival(qid, deadline=None, slo_class="batch")
        call, _ = c.on_call_ready(qid, stage="b", node_id=f"{qid}.0", prompt_tokens=1000)
        calls.append(call)
    c.clock.advance_to(5.0)
    first, second = calls
    model = c.time_models["fast"]
    own = float(model.prefill_s(1000))
    assert abs(prefill_left_s(c, first, "fast", 5.0) - (own - 5.0)) < 1e-9
    assert abs(prefill_left_s(c, second, "fast", 5.0) - own) < 1e-9
    assert abs(redo_s(c, second, "fast", 5.0)) < 1e-9


def test_the_chunk_a_prompt_is_prefilled_in_is_the_engines_token_budget() -> None:
    """An H200's vLLM takes 8192 prompt tokens a step, an A100's 2048: counted in A100 chunks,
    8192 tokens prefilled beside a call on an H200 took one of its steps, not four (and the
    clean ratio read the H200 as slower than it is)."""
    from agentflow.scheduler.cluster import InstanceSpec

    def timed(gpu: str) -> InstanceTimeModel:
        return InstanceTimeModel.for_spec(InstanceSpec(name=gpu, gpu=gpu, model="Llama-3.1-8B"))

    assert timed("A100-80G").chunk_tokens == 2048 and timed("H200").chunk_tokens == 8192
    configured = InstanceSpec(name="h", gpu="H200", model="Llama-3.1-8B",
                              max_num_batched_tokens=2048)  # as deployed: its own budget
    assert InstanceTimeModel.for_spec(configured).chunk_tokens == 2048
    h200 = timed("H200")
    out, during = 41, 8192  # 40 steps, one of them the 8192-token chunk
    decode = 39 * h200.decode_s_per_token + during * h200.prefill_s_per_token
    ttft = h200.prefill_s(1000)  # at its prior rate: the prefill ratio stays 1
    h200.observe(1000, out, ttft_s=ttft, total_s=ttft + decode, prefill_during_tokens=during)
    assert abs(h200.clean_decode_ratio - 1.0) < 1e-9
