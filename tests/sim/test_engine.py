"""The simulated vLLM-like GPU instance: timing, batching, KV cache, priorities, jump-ahead."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import numpy as np
import pytest

from agentflow import hardware
from agentflow.sim import calibration
from agentflow.sim.engine import SeqEvent, SimInstance

A100 = hardware.gpu("A100-80G")
L8B = hardware.model("Llama-3.1-8B")
DATA = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "vllm-latency"


def make(**kw) -> SimInstance:
    kw.setdefault("request_overhead_s", 0.0)
    return SimInstance(A100, L8B, **kw)


def drain(inst: SimInstance) -> list[SeqEvent]:
    """Drive like a discrete-event loop: wake at next_event_time until idle."""
    events = []
    while (t := inst.next_event_time()) is not None:
        events += inst.step_until(t)
    return events


def finished(events) -> dict[str, SeqEvent]:
    return {e.seq_id: e for e in events if e.kind == "finished"}


def formula_step(n_tokens: list[int], contexts: list[int], gpu=A100, model=L8B) -> float:
    """The operator sum of the engine docstring (agentflow.step_time), written out
    independently for a dense 16-bit model on one GPU."""
    peak, bw = gpu.peak_tflops * 1e12, gpu.mem_bw_gbs * 1e9
    d, hd = model.hidden, model.head_dim
    q, kv, f = model.heads * hd, model.kv_heads * hd, model.ffn_hidden
    T, S = sum(n_tokens), len(n_tokens)

    def roof(lat, flops, f_eff, nbytes, b_eff):
        return lat + max(flops / (peak * f_eff), nbytes / (bw * b_eff))

    def waves(units, slots, penalty):  # a partial last wave costs `penalty` of a wave
        w = units / slots
        return 1.0 if w <= 1 else ((1 - penalty) * w + penalty * math.ceil(w)) / w

    # GEMMs: compute on whole 128-row tiles (a power of two below one), in waves of
    # (128 x gemm_tile_features) output tiles on the SMs, the two terms meeting as a p-norm
    rows = 2 ** math.ceil(math.log2(T)) if T < 128 else 128 * math.ceil(T / 128)
    p = gpu.gemm_knee_p
    layer = 0.0
    for k, n in ((d, q + 2 * kv), (q, d), (d, 2 * f), (f, d)):  # qkv, o, gate+up, down
        tiles = math.ceil(rows / min(rows, 128)) * math.ceil(n / gpu.gemm_tile_features)
        c = 2 * k * n * rows / (peak * gpu.compute_efficiency) * waves(
            tiles, gpu.sm_count * gpu.gemm_ctas_per_sm, gpu.gemm_wave_penalty)
        m = (2 * k * n + 2 * (k + n) * T) / (bw * gpu.bw_efficiency)
        layer += gpu.linear_latency_s + (c ** p + m ** p) ** (1 / p)
    # norms x2 and act: a block per token, the longer of bandwidth and waves of one
    # block's row; rope and add: bandwidth; then the KV write (read 2 + write 2 B)
    b_el = bw * gpu.elementwise_bw_efficiency
    row_waves = math.ceil(T / (gpu.sm_count * gpu.elementwise_blocks_per_sm))
    layer += 5 * gpu.elementwise_latency_s + T * 2 * (2 * (q + kv) + 3 * d) / b_el
    for row in (2 * 2 * d, 2 * 2 * d, 2 * 3 * f):
        layer += max(T * row / b_el, row_waves * row / (gpu.elementwise_block_bw_gbs * 1e9))
    layer += gpu.kv_write_latency_s + T * 2 * kv * 4 / b_el
    dec = [(n, c) for n, c in zip(n_tokens, contexts) if n == 1]
    pre = [(n, c) for n, c in zip(n_tokens, contexts) if n > 1]
    if dec:
        L = sum(c + 1 for _, c in dec)
        # a block per (sequence, KV head), in rounds of the blocks the SMs hold at once
        wave = waves(len(dec) * model.kv_heads, gpu.sm_count * gpu.attn_blocks_per_sm,
                     gpu.attn_wave_penalty)
        layer += roof(gpu.decode_attn_latency_s, 4 * q * L, gpu.prefill_attn_efficiency,
                      (2 * kv * 2 * L + 4 * q * len(dec)) * wave, gpu.attn_bw_efficiency)
    if pre:
        pairs = sum(n * c + n * (n + 1) // 2 for n, c in pre)
        read = sum(c + n for n, c in pre)
        chunk = max(sum(n for n, _ in pre), gpu.prefill_attn_half_tokens)
        ramp = (chunk + gpu.prefill_attn_half_tokens) / chunk
        layer += roof(gpu.prefill_attn_latency_s, 4 * q * pairs * ramp,
                      gpu.prefill_attn_efficiency,
                      2 * kv * 2 * read + 4 * q * sum(n for n, _ in pre),
                      gpu.attn_bw_efficiency)
    head = roof(gpu.linear_latency_s, 2 * d * model.vocab * S, gpu.compute_efficiency,
                2 * d * model.vocab + 2 * (d + model.vocab) * S, gpu.bw_efficiency)
    return layer * model.layers + head + gpu.step_overhead_s


@pytest.mark.parametrize("jump", [True, False])
def test_single_request_is_prefill_plus_decode(jump):
    inst = make(jump_ahead=jump)
    prompt, out = 1000, 40
    inst.add("r", prompt, out, 0, 0.0)
    ev = drain(inst)
    prefill = formula_step([prompt], [0])
    decode = sum(formula_step([1], [prompt + k]) for k in range(out - 1))
    fin = finished(ev)["r"]
    assert fin.ttft_s == pytest.approx(prefill, rel=1e-12)
    assert fin.total_s == pytest.approx(prefill + decode, rel=1e-12)
    assert fin.time == pytest.approx(prefill + decode, rel=1e-12)
    assert fin.queue_s == 0.0 and fin.preempted == 0 and fin.output_tokens_so_far == out
    # prefill of 1000 tokens is compute-bound, a decode step memory-bound
    assert prefill > 5 * formula_step([1], [prompt])
    assert inst.steps == out and inst.load().kv_blocks_used == 0


def test_progress_events_at_powers_of_two():
    inst = make()
    inst.add("r", 100, 40, 0, 0.0)
    ev = drain(inst)
    assert [(e.kind, e.output_tokens) for e in ev] == [
        ("first_token", 1), ("progress", 2), ("progress", 4), ("progress", 8),
        ("progress", 16), ("progress", 32), ("finished", 40)]
    assert all(a.time < b.time for a, b in itertools.pairwise(ev))


def test_batched_decode_cheaper_than_singles_but_not_free():
    inst = SimInstance(A100, hardware.paper_model())
    one = inst.decode_step_time(1, 1024)
    b32 = inst.decode_step_time(32, 1024)
    assert one < b32 < 32 * one / 10  # the weights are read once per step
    assert inst.decode_step_time(128, 1024) > 2 * one  # KV reads and FLOPs grow with batch
    # end to end: 16 identical requests together vs one alone
    alone = make()
    alone.add("a", 500, 200, 0, 0.0)
    t1 = finished(drain(alone))["a"].time
    many = make()
    for k in range(16):
        many.add(f"s{k}", 500, 200, 0, 0.0)
    fin = finished(drain(many))
    last = max(e.time for e in fin.values())
    assert t1 < last < 3 * t1  # far below 16 * t1


def test_kv_exhaustion_preempts_lowest_priority_and_it_recomputes():
    inst = make(num_gpu_blocks=20)  # 320 tokens
    for k, prio in enumerate([0, 1, 2]):
        inst.add(f"s{k}", 50, 100, prio, 0.0)
    ev = drain(inst)
    fin = finished(ev)
    assert set(fin) == {"s0", "s1", "s2"}
    assert all(e.output_tokens == 100 for e in fin.values())
    assert fin["s0"].preempted == 0
    assert fin["s2"].preempted >= 1  # the largest priority value goes first
    assert inst.preemptions >= 1
    assert fin["s0"].time < fin["s2"].time
    assert inst.load().kv_blocks_used == 0
    # token counts never go backwards across a preemption
    counts = [e.output_tokens for e in ev if e.seq_id == "s2"]
    assert counts == sorted(counts)


def test_preemption_ties_go_to_latest_arrival():
    inst = make(num_gpu_blocks=20)
    inst.add("early", 50, 100, 1, 0.0)
    inst.add("late", 50, 100, 1, 0.0)
    inst.add("third", 50, 100, 1, 0.0)
    fin = finished(drain(inst))
    assert fin["early"].preempted == 0
    assert fin["third"].preempted >= 1


def test_priority_order_when_capacity_is_short():
    inst = make(max_num_seqs=1)
    for sid, prio in [("low", 5), ("high", 0), ("mid", 2), ("high2", 0)]:
        inst.add(sid, 100, 10, prio, 0.0)
    fin = finished(drain(inst))
    order = sorted(fin, key=lambda s: fin[s].time)
    assert order == ["high", "high2", "mid", "low"]
    assert fin["low"].queue_s > fin["mid"].queue_s > fin["high2"].queue_s > 0


def test_priority_order_when_kv_blocks_are_short():
    inst = make(num_gpu_blocks=12)  # 192 tokens: one 150-token request at a time
    inst.add("first", 100, 50, 3, 0.0)
    inst.step_until(0.001)  # "first" is running now
    inst.add("low", 100, 50, 9, 0.002)
    inst.add("high", 100, 50, 1, 0.003)
    fin = finished(drain(inst))
    assert fin["first"].time < fin["high"].time < fin["low"].time


def test_chunked_prefill_splits_a_long_prompt():
    inst = make(max_num_batched_tokens=512)
    inst.add("long", 2000, 3, 0, 0.0)
    ev = drain(inst)
    chunks = [formula_step([512], [512 * k]) for k in range(3)] + \
        [formula_step([2000 - 3 * 512], [3 * 512])]
    fin = finished(ev)["long"]
    assert fin.ttft_s == pytest.approx(sum(chunks), rel=1e-12)
    assert inst.steps == 4 + 2
    # a decode rides along with the chunks of a prompt that arrives later
    inst2 = make(max_num_batched_tokens=512)
    inst2.add("short", 10, 50, 0, 0.0)
    inst2.step_until(0.05)
    inst2.add("long", 2000, 3, 0, 0.05)
    fin2 = finished(drain(inst2))
    assert fin2["short"].total_s < 50 * formula_step([512], [1500]) + 1
    # without chunking the prompt runs whole, in one iteration
    whole = make(max_num_batched_tokens=512, chunked_prefill=False)
    whole.add("long", 2000, 3, 0, 0.0)
    f = finished(drain(whole))["long"]
    assert f.ttft_s == pytest.approx(formula_step([2000], [0]), rel=1e-12)


def random_workload(inst: SimInstance, seed: int, n: int = 30) -> list[tuple]:
    rnd = random.Random(seed)
    acts, t = [], 0.0
    for k in range(n):
        t += rnd.expovariate(3.0)
        acts.append((t, "add", f"s{k}", rnd.randint(20, 3000), rnd.randint(1, 300),
                     rnd.randint(0, 3)))
        if k > 2 and rnd.random() < 0.15:
            acts.append((t + rnd.random() * 0.3, "abort", f"s{rnd.randint(0, k)}"))
    acts.sort(key=lambda a: a[0])
    events = []
    for a in acts:
        while (t := inst.next_event_time()) is not None and t <= a[0]:
            events += inst.step_until(t)
        events += inst.step_until(a[0])
        if a[1] == "add":
            inst.add(a[2], a[3], a[4], a[5], a[0])
        else:
            inst.abort(a[2], a[0])
    events += drain(inst)
    return [(e.kind, e.seq_id, e.time, e.output_tokens, e.ttft_s, e.total_s, e.queue_s,
             e.preempted) for e in events]


def test_deterministic():
    a = random_workload(make(num_gpu_blocks=300), seed=3)
    b = random_workload(make(num_gpu_blocks=300), seed=3)
    assert a == b and len(a) > 50


@pytest.mark.parametrize("seed,kw", [
    (0, {}),
    (1, {"num_gpu_blocks": 250, "max_num_seqs": 8}),  # preemptions
    (2, {"max_num_batched_tokens": 256, "request_overhead_s": 0.02}),
    (3, {"chunked_prefill": False, "num_gpu_blocks": 400}),
])
def test_jump_ahead_equals_one_iteration_at_a_time(seed, kw):
    jumped = make(**kw)
    stepped = make(jump_ahead=False, **kw)
    a = random_workload(jumped, seed)
    b = random_workload(stepped, seed)
    assert a == b  # bit-identical times
    assert jumped.steps == stepped.steps
    assert jumped.plans < stepped.plans  # it did jump


def test_abort_frees_blocks_and_silences_the_sequence():
    inst = make()
    inst.add("a", 1000, 500, 0, 0.0)
    inst.add("b", 1000, 500, 0, 0.0)
    inst.step_until(1.0)
    used = inst.load().kv_blocks_used
    assert used > 0
    assert inst.abort("a", 1.0)
    assert inst.load().kv_blocks_used < used
    assert not inst.abort("a")
    ev = drain(inst)
    assert all(e.seq_id == "b" for e in ev)
    assert finished(ev)["b"].output_tokens == 500
    assert inst.load().kv_blocks_used == 0 and inst.idle
    # aborting a waiting request
    inst2 = make(max_num_seqs=1)
    inst2.add("x", 100, 20, 0, 0.0)
    inst2.add("y", 100, 20, 0, 0.0)
    inst2.abort("y")
    assert set(finished(drain(inst2))) == {"x"}


def test_add_mid_run_joins_at_the_next_iteration():
    inst = make()
    inst.add("a", 100, 1000, 0, 0.0)
    inst.step_until(1.0)
    inst.add("b", 100, 10, 0, 1.0)
    fin = finished(drain(inst))
    assert fin["b"].queue_s < formula_step([1], [2000])  # waited at most one iteration
    assert 1.0 < fin["b"].time < fin["a"].time


def test_request_overhead_is_queue_time():
    inst = make(request_overhead_s=0.05)
    inst.add("r", 100, 5, 0, 2.0)
    fin = finished(drain(inst))["r"]
    assert fin.queue_s == pytest.approx(0.05)
    assert fin.time == pytest.approx(2.05 + fin.total_s)


def test_prefix_cached_tokens_skip_prefill():
    cold, warm = make(), make()
    cold.add("r", 4000, 5, 0, 0.0)
    warm.add("r", 4000, 5, 0, 0.0, cached_tokens=4000)
    t_cold = finished(drain(cold))["r"].ttft_s
    t_warm = finished(drain(warm))["r"].ttft_s
    # whole blocks only, at least one token computed: 3999 // 16 * 16 = 3984 cached
    assert t_warm == pytest.approx(formula_step([16], [3984]), rel=1e-12)
    assert t_warm < t_cold / 5


def test_kv_capacity_and_rejection():
    m = hardware.paper_model()
    gpu = hardware.gpu("A6000")
    inst = SimInstance(gpu, m)
    assert inst.max_num_batched_tokens == 2048  # vLLM's default on a 48 GiB GPU
    reserve = 2048 * (4 * 8192 + 2 * 28672) * 2 + 256 * 128256 * 4 + 2 ** 30
    free = 48 * 2 ** 30 * 0.9 - m.weight_bytes - reserve
    assert inst.kv_blocks_total == int(free // (m.kv_bytes_per_token * 16))
    with pytest.raises(ValueError):
        SimInstance(A100, hardware.model("Llama-3.1-70B"))  # 141 GB of fp16 weights
    small = make(num_gpu_blocks=10)
    with pytest.raises(ValueError):
        small.add("big", 150, 20, 0, 0.0)


def test_tensor_parallel_is_faster_and_bigger():
    one = SimInstance(A100, L8B)
    two = SimInstance(A100, L8B, tensor_parallel=2)
    assert two.kv_blocks_total > 2 * one.kv_blocks_total
    assert two.decode_step_time(8, 1000) < one.decode_step_time(8, 1000)
    assert two.step_time([4000], [0]) < one.step_time([4000], [0])


def test_paper_setup_uses_calibration():
    m = hardware.paper_model()
    inst = SimInstance(hardware.gpu("A100-80G"), m)
    cal = hardware.CALIBRATIONS[("A100-80G", "Llama-3.1-70B", 4)]
    assert inst.gpu.bw_efficiency == cal.bw_efficiency
    assert inst.request_overhead_s == cal.request_overhead_s
    raw = SimInstance(hardware.gpu("A100-80G"), m, use_calibration=False)
    assert raw.gpu == hardware.gpu("A100-80G")


@pytest.mark.skipif(not DATA.exists(), reason="vllm-latency traces not available")
def test_calibrated_single_request_error_on_held_out_half():
    data = calibration.load_vllm_latency(DATA)
    _, held = calibration.split_halves(len(data["A100"]))
    for label, rows in data.items():
        rows = [r for r, keep in zip(rows, held) if keep][::4]
        sim = calibration.simulate_rows(calibration.paper_factory(label), rows)
        err = calibration.relative_errors(sim, [r[2] for r in rows])
        assert np.median(err) < 0.05, label
    lat = calibration.single_request_latency(calibration.paper_factory("L40S"), 1000, 100, 1000)
    assert 5.0 < lat < 6.5 and math.isfinite(lat)


@pytest.mark.parametrize("kind", ["add", "abort"])
def test_input_exactly_at_an_iteration_boundary_inside_a_run(kind):
    """A driver reacting to a progress event adds/aborts at that very instant: the jump-ahead
    run must end there, exactly as when iterations are planned one at a time."""
    results = []
    for jump in (True, False):
        inst = make(jump_ahead=jump)
        inst.add("a", 100, 300, 0, 0.0)
        inst.add("b", 100, 300, 0, 0.0)
        events = []
        while True:
            t = inst.next_event_time()
            evs = inst.step_until(t)
            events += evs
            if any(e.kind == "progress" and e.output_tokens == 64 for e in evs):
                break
        if kind == "add":
            inst.add("c", 50, 20, 0, t)
        else:
            inst.abort("b", t)
        events += drain(inst)
        results.append([(e.kind, e.seq_id, e.time, e.output_tokens) for e in events])
    assert results[0] == results[1]


def test_a_decode_runs_events_are_the_same_listed_in_python_or_numpy() -> None:
    """Few sequences: the plain-Python event list (``_run_events``) equals the array one,
    order included, from fresh sequences to long runs past many powers of two."""
    import random

    from agentflow.sim.engine import _PY_EVENTS_MAX, _run_events, _run_events_numpy

    rng = random.Random(1)
    for _ in range(3000):
        s = rng.randint(1, _PY_EVENTS_MAX)
        g0 = [rng.choice([0, 0, 1, 2, 3, rng.randint(0, 3000)]) for _ in range(s)]
        out = [g + rng.randint(1, 3000) for g in g0]
        k = rng.randint(1, min(o - g for g, o in zip(g0, out)))
        a, b = np.array(g0, dtype=np.int64), np.array(out, dtype=np.int64)
        assert _run_events(a, b, k) == _run_events_numpy(a, b, k), (g0, out, k)
