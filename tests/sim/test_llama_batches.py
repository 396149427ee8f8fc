"""llama-server's slots and ubatches in the simulator (agentflow.sim.llama_batches): the
split llama.cpp makes with one KV stream per slot, and what it costs on a CPU core."""

from __future__ import annotations

import pytest

from agentflow import hardware
from agentflow.config import InstanceConfig
from agentflow.sim.engine import SimInstance, engine_for
from agentflow.sim.llama_batches import (
    Piece,
    SlotTable,
    batch_order,
    decode_groups,
    iteration_seconds,
    ubatches,
)
from agentflow.step_time import OperatorModel


def llama_engine(**kw) -> SimInstance:
    cfg = InstanceConfig(name="c", gpu="Xeon-core", model="gemma-3-270m", max_num_seqs=4,
                         max_num_batched_tokens=2048,
                         backend={"type": "llama_server", "parallel": 4})
    engine = engine_for("c", cfg)
    for k, v in kw.items():
        setattr(engine, k, v)
    return engine


def test_slots_go_to_the_idle_slot_released_longest_ago():
    t = SlotTable(4)
    assert [t.take(x) for x in "abcd"] == [3, 2, 1, 0]  # never used: the last one first
    t.release("c", 5.0)
    t.release("a", 7.0)
    assert t.take("e") == 1
    t.release("d", 8.0)
    t.release("b", 2.0)
    assert t.take("f") == 2 and t.take("g") == 3 and t.take("h") == 0
    with pytest.raises(RuntimeError, match="no idle slot"):
        t.take("i")


def test_a_ubatch_holds_only_consecutive_slots_and_equal_token_counts():
    dec = [Piece(0, 1, 100, True, True), Piece(1, 1, 50, True, True)]
    assert [[p.slot for p in u] for u in ubatches(dec, 512)] == [[0, 1]]
    apart = [Piece(0, 1, 100, True, True), Piece(2, 1, 50, True, True)]
    assert [[p.slot for p in u] for u in ubatches(apart, 512)] == [[0], [2]]
    # decode in slot 1, prompts in slots 0 (600 tokens) and 2 (300): the server's batch is
    # [1, 0 x 600, 2 x 300]; slot 2 follows 1, so it joins the first ubatch with one token
    mixed = batch_order([Piece(0, 600, 0, False, True), Piece(2, 300, 0, False, False),
                         Piece(1, 1, 80, True, True)])
    got = [[(p.slot, p.n, p.context, p.samples) for p in u] for u in ubatches(mixed, 512)]
    assert got == [[(1, 1, 80, True), (2, 1, 0, False)], [(0, 512, 0, False)],
                   [(0, 88, 512, True)], [(2, 299, 1, False)]]
    assert decode_groups([3, 0, 1, 5]) == [[1, 2], [0], [3]]


def test_two_passes_cost_a_cpu_core_about_twice_one_shared_pass():
    ops = OperatorModel(hardware.gpu("Xeon-core"), hardware.model("gemma-3-270m"))
    lone = iteration_seconds(ops, [Piece(0, 1, 64, True, True)], 512)
    shared = iteration_seconds(ops, [Piece(0, 1, 64, True, True),
                                     Piece(1, 1, 64, True, True)], 512)
    apart = iteration_seconds(ops, [Piece(0, 1, 64, True, True),
                                    Piece(2, 1, 64, True, True)], 512)
    assert apart == pytest.approx(2 * lone)
    assert 1.1 * lone < shared < 1.5 * lone
    # a prompt chunk that samples nothing skips the LM head (the Gemma head is 178 MB)
    mid = iteration_seconds(ops, [Piece(0, 256, 0, False, False)], 512)
    end = iteration_seconds(ops, [Piece(0, 256, 0, False, True)], 512)
    assert end - mid == pytest.approx(float(ops.lm_head(1, 0)))


def run(engine: SimInstance, reqs) -> dict[str, float]:
    for name, prompt, out, t in reqs:
        engine.add(name, prompt, out, 0, t)
    ends = {}
    while (t := engine.next_event_time()) is not None:
        for ev in engine.step_until(t):
            if ev.kind == "finished":
                ends[ev.seq_id] = ev.time
    return ends


def test_the_engine_takes_slots_and_runs_decodes_apart_as_separate_passes():
    """A, B, C arrive together (slots 3, 2, 1); B ends early, so A and C decode in slots 3
    and 1: two passes per step. Decode runs (jump_ahead) and one step at a time agree."""
    reqs = [("a", 32, 80, 0.0), ("b", 32, 2, 0.0), ("c", 32, 80, 0.0)]
    fast, slow = llama_engine(), llama_engine(jump_ahead=False)
    ends = run(fast, reqs)
    assert ends == pytest.approx(run(slow, reqs), rel=1e-12)
    assert fast.llama_slots is not None and not fast.llama_slots.slot_of  # all released
    # the same three in a unified-KV server (one pass per step): A finishes much sooner
    unified = llama_engine()
    unified.llama_slots = None
    assert run(unified, reqs)["a"] < 0.8 * ends["a"]


def test_gpu_engines_keep_no_slots():
    cfg = InstanceConfig(name="g", gpu="A100-80G", model="Llama-3.1-8B")
    assert engine_for("g", cfg).llama_slots is None
    kvu = InstanceConfig(name="c", gpu="Xeon-core", model="gemma-3-270m",
                         backend={"type": "llama_server", "extra_args": ["--kv-unified"]})
    assert engine_for("c", kvu).llama_slots is None


def test_prompts_that_overflow_the_batch_fill_it_in_slot_order():
    """llama-server launches both requests into slots between iterations and fills the
    batch slot by slot (``update_slots``): the second request took the lower slot (3, then
    2: never-used slots go last first), so its prompt goes first and the first request's
    prompt gets what is left of the 2048 tokens; its first token comes later."""
    engine = llama_engine()
    engine.add("x", 2000, 2, 0, 0.0)
    engine.add("y", 2000, 2, 0, 0.0)
    first: dict[str, float] = {}
    while (t := engine.next_event_time()) is not None:
        for ev in engine.step_until(t):
            if ev.kind == "first_token":
                first[ev.seq_id] = ev.time
    assert engine.llama_slots is not None
    assert first["y"] < first["x"]
