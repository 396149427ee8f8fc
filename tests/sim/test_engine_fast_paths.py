"""The engine's fast paths give the very same floats and events as the direct computation.

A decode run's iteration times come from one table per (operator model, batch size) shared
by the fleet once that size has run a few times (``engine._decode_table``), and a plan's
iteration ends are Python floats. Each
test compares against the direct path (``_DECODE_TABLE_MAX_S = 0``, or ``_durations``) bit
for bit, so an off-by-one slice, a wrong stride or a missed slowdown fails here.
"""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from agentflow import hardware
from agentflow.sim import engine as engine_mod
from agentflow.sim.engine import SimInstance

L8B = hardware.model("Llama-3.1-8B")


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64).tolist()


@pytest.mark.parametrize("gpu,model", [
    ("H100", "Llama-3.1-8B"), ("A100-80G", "Llama-3.1-8B"), ("L40S", "Llama-3.1-8B"),
    ("A6000", "Llama-3.1-8B"), ("H100", "Qwen3-30B-A3B"),
    ("Xeon-core", "gemma-3-270m"),  # a CPU profile: the serial roofline
])
def test_decode_run_table_equals_the_direct_durations(monkeypatch, gpu, model):
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_MAX_S", 16)  # wider batches too
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_AFTER", 0)  # a table from the first run
    inst = SimInstance(hardware.gpu(gpu), hardware.model(model), name=f"t-{gpu}")
    rng = random.Random(7)
    for trial in range(400):
        S = rng.randint(1, 16)
        dkv = sum(rng.randint(1, 6000) for _ in range(S))
        K = rng.choice([2, 3, rng.randint(2, 64), rng.randint(2, 3000)])
        if trial % 3 == 0:
            inst.slowdown = rng.choice([1.0, 1.37, 2.5])
        want = inst._durations(S, S, S, dkv + S * np.arange(K, dtype=np.int64))
        got = inst._decode_run(S, dkv, K)
        assert _bits(got) == _bits(want), (gpu, S, dkv, K, inst.slowdown)


def test_decode_run_past_the_table_is_computed_directly(monkeypatch):
    inst = SimInstance(hardware.gpu("H100"), L8B, name="long")
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_MAX_KV", 5000)
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_AFTER", 0)
    want = inst._durations(2, 2, 2, 4990 + 2 * np.arange(40, dtype=np.int64))
    assert _bits(inst._decode_run(2, 4990, 40)) == _bits(want)


def _workload(inst: SimInstance, seed: int, n: int = 60, prefix: str = "") -> list[tuple]:
    """Adds and aborts at random times, the engine woken at each event and each action;
    every event and every ``load`` / ``tokens_written`` reading along the way. ``prefix``:
    "hashed", each prompt carries prefix-block hashes shared with a quarter of the others
    (automatic prefix caching: hits found at admission); "cached", a third of each prompt
    is a prefix-cache hit at its first admission (none after a preemption)."""
    rnd = random.Random(seed)
    acts, t = [], 0.0
    for k in range(n):
        t += rnd.expovariate(4.0)
        acts.append((t, "add", f"s{k}", rnd.randint(20, 3000), rnd.randint(1, 700),
                     rnd.randint(0, 3)))
        if k > 2 and rnd.random() < 0.15:
            acts.append((t + rnd.random() * 0.3, "abort", f"s{rnd.randint(0, k)}"))
    acts.sort(key=lambda a: a[0])
    out: list[tuple] = []

    def wake(until: float | None) -> None:
        while (t := inst.next_event_time()) is not None and (until is None or t <= until):
            for e in inst.step_until(t):
                out.append((e.kind, e.seq_id, e.time, e.output_tokens, e.ttft_s, e.total_s,
                            e.queue_s, e.preempted))
            load = inst.load()
            out.append(("load", load.running, load.waiting, load.kv_blocks_used,
                        sorted(inst.tokens_written(t).items())))

    for a in acts:
        wake(a[0])
        out.append(("at", sorted(inst.tokens_written(a[0]).items())))
        if a[1] == "add" and prefix == "cached":
            inst.add(a[2], a[3], a[4], a[5], a[0], cached_tokens=a[3] // 3)
        elif a[1] == "add" and prefix == "hashed":
            group = int(a[2][1:]) % 4
            inst.add(a[2], a[3], a[4], a[5], a[0],
                     prefix_hashes=tuple((group, j) for j in range(a[3] // 64)),
                     tokens_per_block=64.0)
        elif a[1] == "add":
            inst.add(a[2], a[3], a[4], a[5], a[0])
        else:
            inst.abort(a[2], a[0])
    wake(None)
    assert all(type(x[2]) is float for x in out if x[0] in ("first_token", "progress",
                                                            "finished"))
    return out


def _same_with_switch_off(monkeypatch, switch: str, gpu: str, seed: int, kw: dict,
                          prefix: str = "") -> SimInstance:
    """Run the seeded workload on an engine as it is, then with ``engine.<switch>`` off on a
    fresh one: the same events, loads and tokens at every wake and action, and the same
    counters. Returns the first engine (for a test's own checks)."""
    kw.setdefault("request_overhead_s", 0.0)
    on = SimInstance(hardware.gpu(gpu), L8B, **kw)
    events = _workload(on, seed, n=80, prefix=prefix)
    monkeypatch.setattr(engine_mod, switch, False)
    off = SimInstance(hardware.gpu(gpu), L8B, **kw)
    assert events == _workload(off, seed, n=80, prefix=prefix)
    assert (on.prefix_lookup_tokens, on.prefix_hit_tokens) == \
        (off.prefix_lookup_tokens, off.prefix_hit_tokens)
    assert (on.steps, on.tokens_computed, on.busy_s, on.plans, on.preemptions) == \
        (off.steps, off.tokens_computed, off.busy_s, off.plans, off.preemptions)
    return on


@pytest.mark.parametrize("seed,kw", [
    (0, {}),
    (1, {"num_gpu_blocks": 250, "max_num_seqs": 8}),  # preemptions, runs cut by blocks
    (2, {"max_num_batched_tokens": 256, "request_overhead_s": 0.02}),
    (3, {"max_num_seqs": 32}),  # wider batches: the array path above _PY_EVENTS_MAX
])
def test_runs_from_the_table_equal_the_direct_runs_event_by_event(monkeypatch, seed, kw):
    kw.setdefault("request_overhead_s", 0.0)
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_AFTER", 2)  # direct runs, then the table
    engines = [SimInstance(hardware.gpu("A100-80G"), L8B, **kw)]
    fast = _workload(engines[0], seed)
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_MAX_S", 0)
    engines.append(SimInstance(hardware.gpu("A100-80G"), L8B, **kw))
    slow = _workload(engines[1], seed)
    engines.append(SimInstance(hardware.gpu("A100-80G"), L8B, jump_ahead=False, **kw))
    stepped = _workload(engines[2], seed)
    assert fast == slow
    events = [x for x in fast if x[0] in ("first_token", "progress", "finished")]
    assert events == [x for x in stepped if x[0] in ("first_token", "progress", "finished")]
    assert len(events) > 200
    # what the engine counts along the way (busy seconds: real_vs_sim's engine work)
    a, b, c = ((e.steps, e.tokens_computed, e.busy_s, e.plans) for e in engines)
    assert a == b
    assert a[:2] == c[:2] and a[2] == pytest.approx(c[2], rel=1e-12) and a[3] < c[3]


def test_a_copied_engine_shares_the_tables_and_runs_the_same(monkeypatch):
    """``Simulation.fork`` deep-copies engines: the copy keeps reading the same tables (they
    depend only on the operator model's values, which the copy has too) and its runs give
    the very events the original's do."""
    import copy

    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_AFTER", 0)
    inst = SimInstance(hardware.gpu("L40S"), L8B, request_overhead_s=0.0, name="orig")
    inst.add("a", 800, 300, 0, 0.0)
    inst.add("b", 1500, 200, 1, 0.0)
    inst.step_until(inst.next_event_time())
    clone = copy.deepcopy(inst)
    assert clone._tables is inst._tables and clone.ops is not inst.ops

    def rest(e: SimInstance) -> list[tuple]:
        out = []
        while (t := e.next_event_time()) is not None:
            out += [(x.kind, x.seq_id, x.time, x.output_tokens) for x in e.step_until(t)]
        return out

    ran = rest(clone)
    assert ran == rest(inst) and len(ran) > 10


@pytest.mark.parametrize("seed,kw", [
    (0, {}),
    (1, {"num_gpu_blocks": 250, "max_num_seqs": 8}),  # preemptions, runs cut by blocks
    (2, {"max_num_batched_tokens": 256, "request_overhead_s": 0.02}),
    (3, {"max_num_seqs": 32}),  # wider batches: the array path above _PY_EVENTS_MAX
    (4, {"num_gpu_blocks": 240, "max_num_seqs": 6}),  # blocks scarce: runs the general loop
])
def test_the_short_way_to_a_decode_run_equals_the_general_loop(monkeypatch, seed, kw):
    """``_build_plan``'s decode-run short way: the same events, loads (KV blocks taken) and
    tokens written at every wake and action as the general loop, and the same counters."""
    short = _same_with_switch_off(monkeypatch, "_DECODE_FAST", "A100-80G", seed, kw)
    assert short.plans > 100


@pytest.mark.parametrize("gpu,model", [
    ("H100", "Llama-3.1-8B"), ("A6000", "Llama-3.1-8B"), ("H100", "Qwen3-30B-A3B"),
    ("Xeon-core", "gemma-3-270m"),
])
def test_decode_ends_summed_in_python_equal_numpys_cumsum(monkeypatch, gpu, model):
    """``_decode_ends``: the table's slice summed by ``accumulate`` from ``tb`` gives
    ``np.cumsum``'s floats bit for bit (sequential sums), at normal speed and slowed down."""
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_AFTER", 0)
    inst = SimInstance(hardware.gpu(gpu), hardware.model(model), name=f"e-{gpu}")
    rng = random.Random(11)
    for trial in range(400):
        S = rng.randint(1, 20)  # above _DECODE_TABLE_MAX_S too: computed directly
        dkv = sum(rng.randint(1, 6000) for _ in range(S))
        K = rng.choice([2, 3, rng.randint(2, 64), rng.randint(2, 3000)])
        tb = rng.choice([0.0, rng.uniform(0, 1e4), 1e-7 * rng.random()])
        inst.slowdown = 1.0 if trial % 4 else rng.choice([1.37, 2.5])
        dt = inst._decode_run(S, dkv, K)
        dt[0] += tb
        want = np.cumsum(dt)
        got = inst._decode_ends(S, dkv, K, tb)
        assert type(got) is (list if K <= engine_mod._PY_ENDS_MAX and inst.slowdown == 1.0
                             and S <= engine_mod._DECODE_TABLE_MAX_S else array)
        assert all(type(x) is float for x in got) and len(got) == K
        assert _bits(np.array(got)) == _bits(want), (gpu, S, dkv, K, tb, inst.slowdown)
        monkeypatch.setattr(engine_mod, "_PY_DECODE_ENDS", False)
        assert _bits(np.array(inst._decode_ends(S, dkv, K, tb))) == _bits(want)
        monkeypatch.setattr(engine_mod, "_PY_DECODE_ENDS", True)


@pytest.mark.parametrize("seed,kw", [
    (0, {}),
    (1, {"num_gpu_blocks": 250, "max_num_seqs": 8}),
    (2, {"max_num_batched_tokens": 256, "request_overhead_s": 0.02}),
    (3, {"max_num_seqs": 32}),
])
def test_decode_ends_in_python_equal_the_array_path_event_by_event(monkeypatch, seed, kw):
    monkeypatch.setattr(engine_mod, "_DECODE_TABLE_AFTER", 2)  # direct runs, then the table
    _same_with_switch_off(monkeypatch, "_PY_DECODE_ENDS", "H100", seed, kw)


@pytest.mark.parametrize("seed,kw", [
    (0, {}),
    (1, {"num_gpu_blocks": 250, "max_num_seqs": 8}),  # preemptions, runs cut by blocks
    (2, {"max_num_batched_tokens": 256, "request_overhead_s": 0.02}),
    (3, {"max_num_seqs": 32}),
    (5, {"jump_ahead": False}),  # no decode runs: the short way never applies
])
def test_the_short_way_of_a_wake_equals_advancing_event_by_event(monkeypatch, seed, kw):
    """``step_until``'s short way for a wake at the end it asked for inside a decode run:
    the same events, loads and tokens written at every wake and action as ``_advance``."""
    _same_with_switch_off(monkeypatch, "_WAKE_FAST", "L40S", seed, kw)


def _late_wakes(inst: SimInstance, seed: int, n: int = 80) -> list[tuple]:
    """Adds at random times; the engine woken at the time it asked for or, one wake in
    three, somewhat later (several iterations may have ended by then)."""
    rnd = random.Random(seed)
    adds, t = [], 0.0
    for k in range(n):
        t += rnd.expovariate(4.0)
        adds.append((t, f"s{k}", rnd.randint(20, 3000), rnd.randint(1, 700)))
    out: list[tuple] = []
    for at, sid, prompt, output in adds + [(float("inf"), "", 0, 0)]:
        while (t := inst.next_event_time()) is not None and t <= at:
            if rnd.random() < 1 / 3:
                t = min(at, t + rnd.choice([1e-4, 0.01, 0.2]))
            out += [(e.kind, e.seq_id, e.time, e.output_tokens) for e in inst.step_until(t)]
        if sid:
            inst.add(sid, prompt, output, 0, at)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_late_wakes_take_the_long_way_and_see_the_same_events(monkeypatch, seed):
    short = SimInstance(hardware.gpu("A6000"), L8B, request_overhead_s=0.0)
    fast = _late_wakes(short, seed)
    monkeypatch.setattr(engine_mod, "_WAKE_FAST", False)
    slow = SimInstance(hardware.gpu("A6000"), L8B, request_overhead_s=0.0)
    assert fast == _late_wakes(slow, seed)
    assert len(fast) > 300


_ONE_PASS_CASES = [
    (0, {}),
    (1, {"num_gpu_blocks": 250, "max_num_seqs": 8}),  # preemptions, runs cut by blocks
    (2, {"max_num_batched_tokens": 256, "request_overhead_s": 0.02}),
    (3, {"max_num_seqs": 32}),  # 9-16 sequences (lists, not arrays) and above 16
    (4, {"num_gpu_blocks": 240, "max_num_seqs": 6}),  # blocks scarce: the general loop
    (5, {"jump_ahead": False}),  # no decode runs: every plan one iteration
    (6, {"max_num_batched_tokens": 512, "chunked_prefill": False}),  # whole prompts only
    (7, {"max_num_seqs": 3}),  # admissions stopped by the sequence limit
]


def _counting(monkeypatch, method: str) -> list[int]:
    """How often ``SimInstance.<method>`` answered with a plan (not False / None)."""
    made = [0]
    f = getattr(SimInstance, method)

    def counted(self, *a):
        got = f(self, *a)
        if got is not None and got is not False:
            made[0] += 1
        return got

    monkeypatch.setattr(SimInstance, method, counted)
    return made


@pytest.mark.parametrize("seed,kw", _ONE_PASS_CASES)
@pytest.mark.parametrize("prefix", ["", "hashed", "cached"])
def test_a_decode_run_in_one_pass_equals_the_short_way(monkeypatch, seed, kw, prefix):
    """``_one_pass_run``: the same events, loads (KV blocks taken) and tokens written at
    every wake and action as the short way it replaces, and the same counters; it makes
    plans wherever decode runs exist (fails on a wrong block count, run length, event
    order or a skipped ``first_sched``)."""
    made = _counting(monkeypatch, "_one_pass_run")
    _same_with_switch_off(monkeypatch, "_RUN_ONE_PASS", "A100-80G", seed, dict(kw), prefix)
    assert (made[0] > 0) == kw.get("jump_ahead", True)


@pytest.mark.parametrize("seed,kw", _ONE_PASS_CASES)
@pytest.mark.parametrize("prefix", ["", "hashed", "cached"])
def test_a_schedule_without_preemption_equals_the_general_loop(monkeypatch, seed, kw, prefix):
    """``_schedule_without_preemption``: the same events, loads and tokens written at every
    wake and action as ``_build_plan``'s general loop, and the same counters (prefix-cache
    hits included); it makes most plans that admit or run a prompt chunk, and leaves the
    ones that preempt to the loop."""
    made = _counting(monkeypatch, "_schedule_without_preemption")
    on = _same_with_switch_off(monkeypatch, "_NO_PREEMPT_ONE_PASS", "H100", seed, dict(kw),
                               prefix)
    assert made[0] > 50
    if prefix == "hashed":
        assert on.prefix_hit_tokens > 0


def test_a_decode_runs_events_in_python_equal_numpys_for_wide_batches() -> None:
    """``_run_events_py`` (lists of any length, what a one-pass run of up to
    ``_ONE_PASS_MAX`` sequences lists) equals ``_run_events_numpy``, order included."""
    rng = random.Random(7)
    for _ in range(2000):
        s = rng.randint(1, 2 * engine_mod._ONE_PASS_MAX)
        g0 = [rng.choice([0, 0, 1, 2, 3, rng.randint(0, 3000)]) for _ in range(s)]
        out = [g + rng.randint(1, 3000) for g in g0]
        k = rng.randint(1, min(o - g for g, o in zip(g0, out)))
        want = engine_mod._run_events_numpy(np.array(g0, dtype=np.int64),
                                            np.array(out, dtype=np.int64), k)
        assert engine_mod._run_events_py(g0, out, k) == want, (g0, out, k)


@pytest.mark.parametrize("blocks,outputs", [(400, (3000, 2500, 2800)), (350, (2000, 2600, 2400)),
                                            (250, (900, 1200, 1100, 1000))])
def test_a_one_pass_run_cut_by_blocks_equals_the_short_way(monkeypatch, blocks, outputs):
    """Long decodes on a small KV cache with nothing waiting: one-pass runs end where the
    free blocks run out (``_blocks_run_out``); the same events, KV used and tokens written
    at every wake as the short way, every other wake a little late."""
    cuts = _counting(monkeypatch, "_blocks_run_out")

    def run() -> tuple[list[tuple], int]:
        inst = SimInstance(hardware.gpu("L40S"), L8B, request_overhead_s=0.0,
                           num_gpu_blocks=blocks)
        made = _counting(monkeypatch, "_one_pass_run")
        for i, o in enumerate(outputs):
            inst.add(f"s{i}", 100 + 37 * i, o, i % 2, 0.0)
        out: list[tuple] = []
        late = False
        while (t := inst.next_event_time()) is not None:
            late = not late
            for e in inst.step_until(t + (1e-3 if late else 0.0)):
                out.append((e.kind, e.seq_id, e.time, e.output_tokens, e.preempted))
            out.append(("load", inst.load().kv_blocks_used, sorted(inst.tokens_written(t).items())))
        return out, made[0]

    on, made = run()
    assert made > 0 and cuts[0] > 0
    monkeypatch.setattr(engine_mod, "_RUN_ONE_PASS", False)
    off, _ = run()
    assert on == off
