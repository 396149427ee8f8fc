"""llama-server's slots and ubatches in the simulator (agentflow.sim.llama_batches): what the
split llama.cpp makes with one KV stream per slot (tests/llm/test_llama_batches.py) costs on
a CPU core, and the simulated engine that follows it."""

from __future__ import annotations

import pytest

from agentflow import hardware
from agentflow.config import InstanceConfig
from agentflow.llm.llama_batches import Piece
from agentflow.sim.engine import SimInstance, engine_for
from agentflow.sim.llama_batches import iteration_seconds
from agentflow.step_time import OperatorModel


def llama_engine(**kw) -> SimInstance:
    cfg = InstanceConfig(name="c", gpu="Xeon-core", model="gemma-3-270m", max_num_seqs=4,
                         max_num_batched_tokens=2048,
                         backend={"type": "llama_server", "parallel": 4})
    engine = engine_for("c", cfg)
    for k, v in kw.items():
        setattr(engine, k, v)
    return engine


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


def test_below_its_tiled_rows_a_cpu_pass_reads_the_weights_once_per_row():
    """A host whose llama.cpp runs passes of 1-3 rows as matrix-vector products (measured on
    this project's EPYC VM: two decodes in one pass cost 1.99-2.01x one, four 2.80-2.88x):
    two and three rows pay a weight read each, four share one, a prompt chunk is unchanged,
    and a decode run priced at once equals the same steps one at a time."""
    from dataclasses import replace

    from agentflow.sim.llama_batches import decode_run_seconds

    base = hardware.gpu("Xeon-core")
    model = hardware.model("gemma-3-270m")
    flat, tiled = OperatorModel(base, model), OperatorModel(replace(base, cpu_tiled_rows=4),
                                                             model)

    def step(ops, n):
        return iteration_seconds(ops, [Piece(i, 1, 64, True, True) for i in range(n)], 512)

    lone = step(tiled, 1)
    assert lone == step(flat, 1)
    assert step(tiled, 2) > 1.25 * step(flat, 2) and step(tiled, 2) < 2 * lone
    assert step(tiled, 3) > step(tiled, 4) == step(flat, 4)
    chunk = [Piece(0, 256, 0, False, True)]
    assert iteration_seconds(tiled, chunk, 512) == iteration_seconds(flat, chunk, 512)
    import numpy as np

    run = decode_run_seconds(tiled, [0, 1], [65, 65], np.arange(3))  # context + its token
    one = [iteration_seconds(tiled, [Piece(i, 1, 64 + j, True, True) for i in (0, 1)], 512)
           for j in range(3)]
    assert list(run) == pytest.approx(one, rel=1e-12)
