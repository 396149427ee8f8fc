"""Sliding-window attention in the operator step model (``agentflow.step_time``): a
windowed model's local layers attend to at most ``sliding_window`` keys, so their prefill
pairs and KV reads stop growing with the context; a model without a window, and every
chunk inside the window, price exactly as before."""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import numpy as np
import pytest

from agentflow import hardware
from agentflow.step_time import OperatorModel, StepShape, windowed_pairs

CPU = hardware.gpu("Xeon-core")
GEMMA = hardware.model("gemma-3-270m")
UNWINDOWED = replace(GEMMA, sliding_window=0, sliding_window_pattern=0)


def test_windowed_pairs_is_the_sum_it_names():
    for c, n, w in product(range(0, 24), range(1, 24), range(1, 14)):
        assert windowed_pairs(c, n, w) == sum(min(c + i, w) for i in range(1, n + 1))


def test_gemma_is_five_local_layers_to_one_global():
    assert (GEMMA.sliding_window, GEMMA.sliding_window_pattern) == (512, 6)
    assert OperatorModel(CPU, GEMMA)._local == pytest.approx(15 / 18)


def test_a_local_layer_past_the_window_costs_the_same_at_any_context():
    """All layers local: a 512-token chunk after 1,536 or after 3,000 cached tokens attends
    to 512 keys a query either way (the causal count grows by 759k pairs)."""
    ops = OperatorModel(CPU, replace(GEMMA, sliding_window_pattern=0))

    def attention(c: int, n: int = 512) -> float:
        sh = StepShape.of([n], [c])
        return float(ops.prefill_attention(sh.prefill_tokens, sh.prefill_pairs,
                                           sh.prefill_kv))

    assert attention(1536) == attention(3000)
    assert attention(1536) < attention(0) * 2.01  # 512 keys a query vs 256.5 on average
    old = OperatorModel(CPU, UNWINDOWED)
    sh = StepShape.of([512], [1536])
    assert float(old.prefill_attention(sh.prefill_tokens, sh.prefill_pairs, sh.prefill_kv)) \
        > attention(1536) * 2.5


def test_global_layers_keep_the_whole_context():
    """gemma-3: 3 of 18 layers global, so the pairs are 3/18 causal + 15/18 windowed."""
    ops, old = OperatorModel(CPU, GEMMA), OperatorModel(CPU, UNWINDOWED)
    c, n = 1536, 512
    sh = StepShape.of([n], [c])
    got = ops.prefill_attention(sh.prefill_tokens, sh.prefill_pairs, sh.prefill_kv)
    pairs = sh.prefill_pairs - 15 / 18 * (sh.prefill_pairs - windowed_pairs(c, n, 512))
    kv = sh.prefill_kv - 15 / 18 * (sh.prefill_kv - (512 - 1 + n))
    assert got == pytest.approx(old.prefill_attention(n, pairs, kv), rel=1e-12)


def test_inside_the_window_nothing_changes():
    """A chunk that ends inside the window, and decodes within it, price bit for bit as the
    model without a window (the correction is subtracted, and it is 0 there)."""
    ops, old = OperatorModel(CPU, GEMMA), OperatorModel(CPU, UNWINDOWED)
    for ns, cs in (([512], [0]), ([300], [200]), ([1] * 4, [100, 200, 300, 400]),
                   ([1, 200], [511, 0])):
        assert ops.step(StepShape.of(ns, cs)) == old.step(StepShape.of(ns, cs))
    kv = np.arange(1, 512, dtype=np.int64)
    assert np.array_equal(ops.step_parts(1, 1, 1, kv), old.step_parts(1, 1, 1, kv))


def test_decode_past_the_window_reads_the_window_arrays_and_floats_alike():
    ops, old = OperatorModel(CPU, GEMMA), OperatorModel(CPU, UNWINDOWED)
    kv = np.arange(400, 3000, 37, dtype=np.int64)
    arr = ops.step_parts(1, 1, 1, kv)
    assert [float(a) for a in arr] == [float(ops.step_parts(1, 1, 1, int(k))) for k in kv]
    assert all(arr[kv > 512] < old.step_parts(1, 1, 1, kv)[kv > 512])
    # two sequences both past the window: exactly 2 x 512 KV tokens on the local layers
    both = ops.decode_attention(2, 4000)
    assert both == pytest.approx(old.decode_attention(2, 4000 - 15 / 18 * (4000 - 1024)))


def test_several_chunks_in_one_pass_keep_a_bound():
    """Two prompts' chunks in one pass: their sums do not say how far each attends, so the
    local pairs are bounded by tokens x window (never more than the causal count)."""
    ops, old = OperatorModel(CPU, GEMMA), OperatorModel(CPU, UNWINDOWED)
    sh = StepShape.of([256, 256], [2048, 0])
    got = ops.prefill_attention(sh.prefill_tokens, sh.prefill_pairs, sh.prefill_kv)
    bound = min(sh.prefill_pairs, 512 * 512)
    pairs = sh.prefill_pairs - 15 / 18 * (sh.prefill_pairs - bound)
    assert got == pytest.approx(old.prefill_attention(512, pairs, sh.prefill_kv), rel=1e-12)
    assert got < old.prefill_attention(sh.prefill_tokens, sh.prefill_pairs, sh.prefill_kv)

