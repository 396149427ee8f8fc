"""The CPU cost of a llama.cpp pass that computes more than one sequence
(``GPUProfile.cpu_multi_seq_s``, ``agentflow.step_time``): charged once per such pass, never
to a lone decode or a lone prompt chunk, never on a GPU; fitted by ``agentflow calibrate``
from its batched rows, which single requests cannot identify."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agentflow import hardware
from agentflow.config import InstanceConfig
from agentflow.sim import host_calibration as calib
from agentflow.step_time import OperatorModel, StepShape

CPU = hardware.gpu("Xeon-core")
GEMMA = hardware.model("gemma-3-270m")
X = 0.012


@pytest.mark.parametrize("ns,cs,several", [
    ([1], [40], False), ([300], [0], False), ([512], [1024], False),
    ([1, 1], [40, 90], True), ([1] * 4, [10, 20, 30, 40], True), ([1, 300], [40, 0], True),
    ([200, 300], [0, 0], True), ([256, 256], [512, 0], True)])
def test_charged_once_to_a_pass_of_several_sequences(ns, cs, several):
    base, ops = OperatorModel(CPU, GEMMA), OperatorModel(replace(CPU, cpu_multi_seq_s=X), GEMMA)
    sh = StepShape.of(ns, cs)
    assert ops.step(sh) - base.step(sh) == pytest.approx(X if several else 0.0, abs=1e-15)
    assert sum(ops.breakdown(sh).values()) == pytest.approx(ops.step(sh), rel=1e-12)


def test_decode_runs_price_it_per_step_arrays_and_floats_alike():
    ops = OperatorModel(replace(CPU, cpu_multi_seq_s=X), GEMMA)
    kv = np.arange(100, 900, 13, dtype=np.int64)
    arr = ops.step_parts(2, 2, 2, kv)
    assert [float(a) for a in arr] == [float(ops.step_parts(2, 2, 2, int(k))) for k in kv]
    base = OperatorModel(CPU, GEMMA).step_parts(2, 2, 2, kv)
    assert np.allclose(arr - base, X, rtol=0, atol=1e-15)


def test_a_gpu_never_pays_it():
    a100 = replace(hardware.gpu("A100-80G"), cpu_multi_seq_s=X)
    llama = hardware.model("Llama-3.1-8B")
    sh = StepShape.of([1] * 8, [1000] * 8)
    assert OperatorModel(a100, llama).step(sh) == OperatorModel(hardware.gpu("A100-80G"),
                                                                llama).step(sh)


def test_calibrate_fits_it_from_the_batched_rows():
    """Rows timed by a profile with a 12 ms multi-sequence pass: on the single rows alone
    the fit cannot see it (it stays 0) and prices the batches short; with the batched rows
    it recovers it and their batch/lone ratios within 1%."""
    limits = calib.engine_limits(InstanceConfig(
        name="c", gpu="Xeon-core", model="gemma-3-270m",
        backend={"type": "llama_server", "parallel": 4}))
    truth = replace(CPU, compute_efficiency=0.6, decode_compute_efficiency=0.3,
                    cpu_multi_seq_s=X)
    rows = []
    for p in (32, 512):
        for o in (1, 24):
            ttft, total = calib.sim_batch(truth, GEMMA, limits, 1, p, o)
            rows.append((p, o, ttft, total))
    batched = [(b, p, 32, calib.sim_batch(truth, GEMMA, limits, b, p, 32)[1],
                calib.sim_single(truth, GEMMA, limits, p, 32)[1])
               for b in (2, 4) for p in (32, 512)]
    start = replace(CPU, compute_efficiency=0.3, decode_compute_efficiency=0.2)
    single = calib.fit_profile(rows, start, GEMMA, limits)
    assert single.cpu_multi_seq_s == 0.0
    assert np.all(calib.batch_residuals(single, GEMMA, limits, batched) < -0.02)
    fitted = calib.fit_profile(rows, start, GEMMA, limits, batched)
    assert fitted.cpu_multi_seq_s == pytest.approx(X, rel=0.1)
    assert np.abs(calib.batch_residuals(fitted, GEMMA, limits, batched)).max() < 0.01
    assert "cpu_multi_seq_s" in calib.STORED_FIELDS
