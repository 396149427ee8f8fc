"""The operator step-time model, the vLLM token-budget defaults, the KV-capacity formula in
``agentflow.hardware`` (serving without the simulator) and ``agentflow simulate step``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agentflow import hardware
from agentflow.cli.main import main as agentflow_main
from agentflow.config import InstanceConfig
from agentflow.scheduler.setup import instance_spec
from agentflow.sim.engine import SimInstance, engine_for
from agentflow.step_time import OperatorModel, StepShape, step_sums

ROOT = Path(__file__).resolve().parents[1]
A100 = hardware.gpu("A100-80G")
L8B = hardware.model("Llama-3.1-8B")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = agentflow_main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------ operator model
def test_a_chunk_beside_long_decodes_adds_its_own_time():
    """Operators add: a 512-token chunk does not hide under 32 decodes at 12k context (the
    old whole-step max(compute, memory) charged it ~0.1 ms)."""
    ops = OperatorModel(A100, L8B)
    decode = ops.step(StepShape.of([1] * 32, [12288] * 32))
    chunk = ops.step(StepShape.of([512], [0]))
    both = ops.step(StepShape.of([1] * 32 + [512], [12288] * 32 + [0]))
    assert both - decode > 0.6 * (chunk - A100.step_overhead_s)
    assert both < decode + chunk  # the weights are read once, the overhead paid once


def test_decode_attention_grows_with_batch_and_context_at_the_fitted_bandwidth():
    ops = OperatorModel(A100, L8B)
    kv_per_token_layer = 2 * L8B.kv_heads * L8B.head_dim * 2
    bw = A100.mem_bw_gbs * 1e9 * A100.attn_bw_efficiency
    b1 = ops.decode_attention(1, 12289)
    b12 = ops.decode_attention(12, 12 * 12289)
    # 11 more sequences read 11 more KV caches at attn_bw_efficiency of peak bandwidth
    assert b12 - b1 == pytest.approx(11 * 12289 * kv_per_token_layer / bw, rel=0.01)
    # up to 40 sequences x 8 KV heads = 320 blocks fit in one round of 3 x 108 SMs (the
    # kernel splits the KV to fill it): time in proportion to the KV read
    b40 = ops.decode_attention(40, 40 * 12289)
    assert b40 - b1 == pytest.approx(39 * 12289 * kv_per_token_layer / bw, rel=0.01)
    # 48 are 384 blocks, 1.19 rounds: the partial second round costs its share
    b48 = ops.decode_attention(48, 48 * 12289)
    w = 384 / 324
    factor = ((1 - A100.attn_wave_penalty) * w + A100.attn_wave_penalty * 2) / w
    assert factor > 1.03
    assert b48 - A100.decode_attn_latency_s == pytest.approx(
        factor * 48 * 12289 * kv_per_token_layer / bw, rel=0.01)
    # the rounds are the GPU's: H200's 132 SMs hold 396 blocks, so 48 sequences fit one
    h200 = hardware.gpu("H200")
    oh = OperatorModel(h200, L8B)
    bw_h = h200.mem_bw_gbs * 1e9 * h200.attn_bw_efficiency
    assert oh.decode_attention(48, 48 * 12289) - h200.decode_attn_latency_s == pytest.approx(
        48 * 12289 * kv_per_token_layer / bw_h, rel=0.01)
    assert ops.decode_attention(0, 0) == 0.0 and ops.prefill_attention(0, 0, 0) == 0.0


def test_gemm_tiles_run_in_waves_on_the_sms():
    """128 x 128 output tiles, one per SM at a time: the MLP gate+up projection of
    Llama-3-8B (28,672 features) is 224 tiles per 128 tokens, 2.07 waves on an A100, so
    its compute time carries the partial third wave; the output projection (32 tiles)
    stays under one wave (split-K spreads it over the SMs)."""
    ops = OperatorModel(A100, L8B)
    flat = OperatorModel(replace(A100, gemm_tile_features=0), L8B)
    sharp, sharp_flat = (OperatorModel(replace(g, gemm_knee_p=float("inf")), L8B)
                         for g in (A100, replace(A100, gemm_tile_features=0)))
    w = 224 / 108
    factor = ((1 - A100.gemm_wave_penalty) * w + A100.gemm_wave_penalty * 3) / w
    assert factor > 1.01
    # at 4,096 tokens all four are compute-bound: the max is the compute term
    lat = A100.linear_latency_s
    assert sharp.gemm(2, 4096) - lat == pytest.approx(
        (sharp_flat.gemm(2, 4096) - lat) * (
            ((1 - A100.gemm_wave_penalty) * 32 * w + A100.gemm_wave_penalty * 67) / (32 * w)),
        rel=1e-9)
    assert ops.gemm(1, 4096) > flat.gemm(1, 4096)  # 1,024 tiles: 9.48 waves
    assert ops.gemm(1, 64) == flat.gemm(1, 64)  # 32 tiles: under one wave
    assert factor * (flat.gemm(2, 256) - lat) > ops.gemm(2, 256) - lat > flat.gemm(2, 256) - lat


def test_norms_and_activation_run_a_block_per_token_in_waves():
    """vLLM's RMS norm and gated activation run one 1,024-thread block per token, 2 per SM:
    216 tokens are one wave on an A100, 224 two (Vidur's rows step there: norms 5-6 -> 8
    us, activation 18 -> 26 us); a single token costs a row at one block's rate, not its
    share of the bandwidth. A CPU core keeps latency + bytes."""
    ops = OperatorModel(A100, L8B)
    row = 2 * 3 * L8B.ffn_hidden + 2 * 2 * 2 * L8B.hidden  # act + two norms, bytes
    per_wave = row / (A100.elementwise_block_bw_gbs * 1e9)
    assert ops.norms_act(224) - ops.norms_act(216) > 0.5 * per_wave  # bytes alone: 0.03
    assert ops.norms_act(216) - ops.norms_act(208) < 0.2 * per_wave
    assert ops.norms_act(1) > 5 * A100.elementwise_latency_s + per_wave
    cpu = OperatorModel(hardware.gpu("Xeon-core"), hardware.model("gemma-3-270m"))
    lat = 5 * cpu.gpu.elementwise_latency_s
    b = cpu.gpu.mem_bw_gbs * 1e9 * cpu.gpu.elementwise_bw_efficiency
    assert cpu.norms_act(300) == pytest.approx(lat + cpu.norms_act_bytes(300) / b, rel=1e-12)


def test_gemm_padding_rows_cost_compute_and_the_knee_is_soft():
    """With one kernel, a step of 136 tokens computes two 128-row tiles (as long as 256
    tokens); below the tile a power of two; near the knee the GEMM is slower than either
    asymptote."""
    from agentflow.step_time import tile_rows

    assert [tile_rows(T, 128) for T in (1, 3, 64, 65, 128, 129, 256, 257)] == [
        1, 4, 64, 128, 128, 256, 256, 384]
    assert tile_rows(100, 1) == 100
    one = OperatorModel(replace(A100, gemm_half_tile_efficiency=0.0), L8B)
    assert one.linear(136) == pytest.approx(one.linear(256), rel=0.02)
    assert one.linear(136) > 1.3 * one.linear(128)
    ops = OperatorModel(A100, L8B)
    flops, nbytes = ops.gemm_work(2, 128)
    c = flops / (A100.peak_tflops * 1e12 * A100.compute_efficiency)
    m = nbytes / (A100.mem_bw_gbs * 1e9 * A100.bw_efficiency)
    assert ops.gemm(2, 128) - A100.linear_latency_s > 1.1 * max(c, m)
    sharp = OperatorModel(replace(A100, gemm_knee_p=float("inf")), L8B)
    assert sharp.gemm(2, 128) - A100.linear_latency_s == pytest.approx(max(c, m))


def test_a_short_prefill_chunk_reaches_less_of_the_attention_efficiency():
    """Efficiency n / (n + half): a 1k chunk after 4k cached tokens costs more per pair
    than an 8k one; below ``half`` tokens the factor stops at 2."""
    ops = OperatorModel(A100, L8B)

    def per_pair(n, c):
        pairs = n * c + n * (n + 1) // 2
        return (ops.prefill_attention(n, pairs, n + c) - A100.prefill_attn_latency_s) / pairs

    h = A100.prefill_attn_half_tokens
    assert per_pair(1024, 4096) / per_pair(8192, 4096) == pytest.approx(
        ((1024 + h) / 1024) / ((8192 + h) / 8192), rel=0.02)
    assert per_pair(64, 4096) / per_pair(16384, 0) == pytest.approx(
        2 / ((16384 + h) / 16384), rel=0.05)


def test_step_shape_classifies_decodes_and_prefills():
    sh = StepShape.of([1, 1, 100], [10, 20, 5])
    assert (sh.tokens, sh.seqs, sh.decode_seqs, sh.decode_kv) == (102, 3, 2, 32)
    assert (sh.prefill_tokens, sh.prefill_pairs, sh.prefill_kv) == (100, 100 * 5 + 5050, 105)
    with pytest.raises(ValueError):
        StepShape.of([0], [3])


def test_mixture_of_experts_reads_more_expert_weights_with_more_tokens():
    ops = OperatorModel(A100, hardware.model("Qwen3-30B-A3B"))
    one, many = ops.gemm_work(2, 1)[1], ops.gemm_work(2, 64)[1]
    assert many > 10 * one  # a batch of 64 tokens touches most experts, one token a few


# ----------------------------------------------------------------------- token budget
@pytest.mark.parametrize("gpu,budget", [("A100-80G", 2048), ("A100-40G", 2048),
                                        ("A6000", 2048), ("L40S", 2048), ("A40", 2048),
                                        ("H100", 8192), ("H200", 8192)])
def test_vllm_default_token_budget_per_gpu(gpu, budget):
    assert hardware.default_max_num_batched_tokens(gpu) == budget
    assert SimInstance(hardware.gpu(gpu), L8B).max_num_batched_tokens == budget


def test_token_budget_stays_overridable_in_the_cluster_file():
    cfg = InstanceConfig(name="x", gpu="H100", model="Llama-3.1-8B",
                         max_num_batched_tokens=1024)
    assert engine_for("x", cfg).max_num_batched_tokens == 1024
    assert engine_for("y", InstanceConfig(name="y", gpu="H100", model="Llama-3.1-8B")
                      ).max_num_batched_tokens == 8192


# ---------------------------------------------------------------------- KV capacity
@pytest.mark.parametrize("kw", [{}, {"tensor_parallel": 2, "max_num_batched_tokens": 4096},
                                {"weight_bits": 4, "kv_bits": 8, "max_num_seqs": 16}])
def test_serving_kv_budget_is_the_simulated_engines_capacity(kw):
    cfg = InstanceConfig(name="x", gpu="A100-80G", model="Llama-3.1-70B"
                         if kw.get("tensor_parallel") or kw.get("weight_bits") else
                         "Llama-3.1-8B", **kw)
    engine = engine_for("x", cfg)
    assert instance_spec(cfg).kv_token_budget == \
        engine.kv_blocks_total * engine.block_size > 0


def test_a_model_that_does_not_fit_is_a_clear_error():
    cfg = InstanceConfig(name="big", gpu="A100-80G", model="Llama-3.1-70B")
    with pytest.raises(ValueError, match="does not fit"):
        instance_spec(cfg)


def test_serving_does_not_import_the_simulator():
    """Building the serving side (instance specs with their KV budgets, time models, the
    coordinator, the server app) leaves ``agentflow.sim`` unimported."""
    code = """
import sys
from agentflow.config import InstanceConfig
from agentflow.scheduler.setup import build_coordinator, instance_spec
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.workflow.clock import ManualClock
import agentflow.scheduler.serving, agentflow.server.app
cfgs = [InstanceConfig(name="a", gpu="A100-80G", model="Llama-3.1-8B"),
        InstanceConfig(name="b", gpu="L40S", model="Llama-3.1-70B", weight_bits=4, kv_bits=4)]
specs = [instance_spec(c) for c in cfgs]
assert all(s.kv_token_budget > 0 for s in specs)
[InstanceTimeModel.for_spec(s) for s in specs]
build_coordinator(cfgs, clock=ManualClock(), policy="flowsage")
loaded = sorted(m for m in sys.modules if m == "agentflow.sim" or m.startswith("agentflow.sim."))
print(loaded)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


# ------------------------------------------------------------- agentflow simulate step
def test_simulate_step_json_is_the_engines_step_time(capsys):
    rc, out, _ = run_cli(capsys, "simulate", "step", "--gpu", "A100-80G", "--model",
                         "Llama-3.1-8B", "--tp", "1", "--decode", "32:12288", "--decode",
                         "8:2048", "--prefill", "512:1024", "--json")
    assert rc == 0
    data = json.loads(out)
    inst = SimInstance(A100, L8B)
    expected = inst.step_time([1] * 40 + [512], [12288] * 32 + [2048] * 8 + [1024])
    assert data["step_ms"] == pytest.approx(expected * 1e3, rel=1e-12)
    assert data["tokens"] == 552 and data["sequences"] == 41
    parts = data["operators_ms"]
    assert sum(parts.values()) == pytest.approx(data["step_ms"], rel=1e-9)
    assert data["layers_ms"] == pytest.approx(
        data["step_ms"] - parts["lm_head"] - parts["overhead"], rel=1e-9)
    assert parts["allreduce"] == 0.0  # one GPU


def test_simulate_step_tensor_parallel_pays_all_reduces(capsys):
    args = ["simulate", "step", "--gpu", "H100", "--model", "Llama-3.1-70B", "--decode",
            "8:4096", "--json"]
    rc, out, _ = run_cli(capsys, *args, "--tp", "4")
    tp4 = json.loads(out)
    rc2, out, _ = run_cli(capsys, *args, "--tp", "2")
    tp2 = json.loads(out)
    assert rc == rc2 == 0
    assert tp4["operators_ms"]["allreduce"] > 0
    assert tp4["operators_ms"]["linear"] < tp2["operators_ms"]["linear"]  # weights split
    inst = SimInstance(hardware.gpu("H100"), hardware.model("Llama-3.1-70B"), 4)
    assert tp4["step_ms"] == pytest.approx(inst.decode_step_time(8, 4096) * 1e3, rel=1e-12)


def test_simulate_step_applies_the_fitted_calibration(capsys):
    rc, out, _ = run_cli(capsys, "simulate", "step", "--gpu", "A6000", "--model",
                         "Llama-3.1-70B", "--weight-bits", "4", "--kv-bits", "4",
                         "--decode", "1:1024", "--json")
    assert rc == 0
    inst = SimInstance(hardware.gpu("A6000"), hardware.paper_model())
    assert inst.gpu.bw_efficiency != hardware.gpu("A6000").bw_efficiency  # calibrated
    assert json.loads(out)["step_ms"] == pytest.approx(inst.decode_step_time(1, 1024) * 1e3,
                                                      rel=1e-12)


def test_simulate_step_table(capsys):
    rc, out, _ = run_cli(capsys, "simulate", "step", "--gpu", "H100", "--model",
                         "Llama-3.1-8B", "--prefill", "2048")
    assert rc == 0
    assert "prefill_attention" in out and out.strip().splitlines()[-1].startswith("step: ")


@pytest.mark.parametrize("argv,message", [
    (["--gpu", "B300", "--model", "Llama-3.1-8B", "--decode", "1:10"], "unknown GPU 'B300'"),
    (["--gpu", "A100-80G", "--model", "Llama-9", "--decode", "1:10"], "unknown model"),
    (["--gpu", "A100-80G", "--model", "Llama-3.1-8B"], "at least one --decode or --prefill"),
    (["--gpu", "A100-80G", "--model", "Llama-3.1-70B", "--decode", "1:10"], "does not fit"),
    (["--gpu", "A100-80G", "--model", "Llama-3.1-8B", "--decode", "1:10", "--tp", "0"],
     "--tp must be >= 1"),
])
def test_simulate_step_errors(capsys, argv, message):
    rc, out, err = run_cli(capsys, "simulate", "step", *argv)
    assert rc == 2 and out == "" and message in err


@pytest.mark.parametrize("spec,flag", [("32x100", "--decode"), ("0:100", "--decode"),
                                       ("8:-1", "--decode"), ("8", "--decode"),
                                       ("a:b", "--prefill"), ("1:2:3", "--prefill"),
                                       ("0", "--prefill")])
def test_simulate_step_rejects_malformed_specs(capsys, spec, flag):
    with pytest.raises(SystemExit) as exc:
        agentflow_main(["simulate", "step", "--gpu", "A100-80G", "--model", "Llama-3.1-8B",
                        flag, spec])
    assert exc.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


# ----------------------------------------------------------- serial (CPU-core) operators
XEON = hardware.gpu("Xeon-core")
GEMMA = hardware.model("gemma-3-270m")


def test_on_a_cpu_core_compute_and_memory_add_and_decode_rows_have_their_own_rate():
    """A serial GEMM is latency + compute + bytes (not their max), with decode rows priced
    at decode_compute_efficiency and prefill rows at compute_efficiency."""
    ops = OperatorModel(XEON, GEMMA)
    peak = XEON.peak_tflops * 1e12
    for T, B in ((1, 1), (4, 4), (300, 0), (302, 2)):
        flops, nbytes = ops.gemm_work(2, T)
        want = (XEON.linear_latency_s + nbytes / (XEON.mem_bw_gbs * 1e9 * XEON.bw_efficiency)
                + flops * B / T / (peak * XEON.decode_compute_efficiency)
                + flops * (T - B) / T / (peak * XEON.compute_efficiency))
        assert ops.gemm(2, T, B) == pytest.approx(want, rel=1e-12)


def test_a_cpu_decode_step_grows_by_each_sequences_compute_a_gpu_one_hides_it():
    """The reason for the serial roofline: on one core every extra sequence of a decode
    batch costs its own dot products on top of the shared weight read; the same profile
    with compute and memory overlapping (a GPU's roofline) grows far less."""
    serial = OperatorModel(XEON, GEMMA)
    overlap = OperatorModel(replace(XEON, overlap_compute_memory=True), GEMMA)

    def step(ops, b):
        return ops.step(StepShape.of([1] * b, [100] * b))

    per_seq = sum(serial.gemm_work(i, 1)[0] for i in range(4)) * GEMMA.layers
    per_seq += serial.lm_head_work(1)[0]
    per_seq /= XEON.peak_tflops * 1e12 * XEON.decode_compute_efficiency
    growth = step(serial, 4) - step(serial, 1)
    assert growth > 3 * per_seq  # plus three more sequences' attention and activations
    assert growth < 3 * per_seq * 1.15
    assert step(overlap, 4) - step(overlap, 1) < 0.5 * growth


def test_gpu_profiles_overlap_and_ignore_the_decode_compute_class():
    for g in hardware.GPUS.values():
        if g.name != "Xeon-core":
            assert g.overlap_compute_memory
    shape = StepShape.of([1] * 8 + [512], [2048] * 8 + [0])
    slower = replace(A100, decode_compute_efficiency=1e-4)
    assert OperatorModel(slower, L8B).step(shape) == OperatorModel(A100, L8B).step(shape)


def test_lm_head_bytes_follow_head_bits():
    ops8 = OperatorModel(A100, replace(L8B, head_bits=8))
    ops16 = OperatorModel(A100, L8B)
    assert ops8.lm_head_work(1)[1] - 2 * (L8B.hidden + L8B.vocab) == pytest.approx(
        (ops16.lm_head_work(1)[1] - 2 * (L8B.hidden + L8B.vocab)) / 2)
    assert GEMMA.head_bits == 8  # the GGUF's tied embedding is Q8_0


def test_step_sums_is_the_shape_the_engine_times():
    """One builder of a step's sums: StepShape.of checks and uses it, and the simulated
    engine's step for a mixed batch is the operator model's step of that shape."""
    ns, ctx = [1, 1, 1, 700], [40, 900, 3000, 128]
    assert StepShape.of(ns, ctx) == StepShape(*step_sums(ns, ctx))
    eng = SimInstance(XEON, GEMMA, max_num_seqs=8)
    assert eng.step_time(ns, ctx) == pytest.approx(
        OperatorModel(XEON, GEMMA).step(StepShape.of(ns, ctx)) * eng.slowdown)


def test_the_faster_of_two_tile_heights_runs_at_the_knee():
    """Vidur's A100 rows: the four GEMMs take 0.53 ms at 136 tokens, 0.49 at 192 and 0.55
    at 200-256 (cuBLAS switches kernels). With 64-row tiles at 0.82 of the 128-row
    efficiency, T = 129-192 computes 192 rows at the cost of ~234: cheaper than 256; at
    200-256 the 256 rows of 64-row tiles cost more than two 128-row tiles, and at <= 128
    or 257+ the full tile wins too."""
    ops = OperatorModel(A100, L8B)
    one = OperatorModel(replace(A100, gemm_half_tile_efficiency=0.0), L8B)
    assert ops.linear(192) < 0.95 * one.linear(192)
    assert ops.linear(136) == pytest.approx(ops.linear(192), rel=0.01)
    assert ops.linear(200) > 1.05 * ops.linear(192)
    for T in (1, 64, 100, 128, 200, 256, 384, 512, 2048):
        assert ops.linear(T) == one.linear(T)
    assert hardware.gpu("Xeon-core").overlap_compute_memory is False  # serial: untouched
