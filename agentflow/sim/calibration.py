"""Calibrate and check ``SimInstance`` against measured vLLM single-request latencies.

Data: ``traces/vllm-latency`` (HexGen-Flow / RL-Router): 483 ``(input, output)`` token pairs
and, per GPU (A100, A6000, L40S), the measured throughput of each request run alone on a vLLM
server serving Llama-3.1-70B (latency = 1 / value). Precision and TP are not recorded; we
take HexGen-Flow's setup: 4-bit weights and KV, one GPU per instance.

What the data contain. The latencies grow with the output length (~38 / 59 / 54 ms per
token) and with input x output (the KV reads of decode attention), but not with the prompt
itself: a 7,809-token prompt with 10 output tokens took 0.55 s on the A100, where computing
its prefill would take at least 3.5 s even at 100% of the A100's peak FLOP/s, and a 3,792-
token jump in prompt length between consecutive requests adds nothing measurable. The
benchmark client that published the data sends ``"word " * n`` as the prompt, one request at
a time, in increasing prompt length, so with vLLM's automatic prefix caching every prompt is
(almost) entirely a cache hit. The replay therefore passes ``cached_tokens = input`` (the
engine keeps whole blocks and computes at least one token, as vLLM does); the same
simulator with cold prompts is reported alongside. Prefill speed (``compute_efficiency``) is
thus *not* calibrated by these data; it keeps its spec-sheet-fraction default.

Fit (``fit_constants``): the simulator's single-request latency is, when every GEMM and the
decode attention are on the bandwidth side of their rooflines (true here: at most one block
of prompt tokens is computed per step),

    latency = request_overhead + sum over steps of (kernel latencies + element-wise
              operators + KV write + step_overhead)
              + [sum over steps of weight bytes / peak bandwidth] / bw_efficiency
              + [sum over steps of KV bytes read / peak bandwidth] / attn_bw_efficiency

(``agentflow.step_time``), linear in (request_overhead, 1/bw_efficiency,
1/attn_bw_efficiency). Weighted least squares (weights 1/measured, i.e. relative error) on
the even-indexed half of the requests; per GPU a request overhead and a weight-streaming
efficiency, one attention efficiency shared by the three GPUs (same kernel, same model
shape); ``step_overhead_s`` stays at its 2 ms prior and the other operator constants at
their fitted values (``hardware.OPERATOR_FIT``), because single requests cannot separate per-step
constants from ``bw_efficiency``. The odd half is held out.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from agentflow import hardware
from agentflow.hardware import Calibration, GPUProfile, ModelProfile

if TYPE_CHECKING:
    from agentflow.sim.engine import SimInstance

# File label -> hardware profile name.
GPU_LABELS: dict[str, str] = {"A100": "A100-80G", "A6000": "A6000", "L40S": "L40S"}
# The reference (HexGen-Flow / RL-Router) simulator's decode seconds per output token.
REFERENCE_DECODE_S: dict[str, float] = {"A100": 0.035, "A6000": 0.058, "L40S": 0.0545}

Row = tuple[int, int, float]  # (input tokens, output tokens, measured latency s)


def load_vllm_latency(directory: str | Path) -> dict[str, list[Row]]:
    """Per GPU label, the (input, output, measured latency) of every request."""
    directory = Path(directory)
    pairs = [ast.literal_eval(line.strip())
             for line in (directory / "requests.txt").read_text().splitlines() if line.strip()]
    out: dict[str, list[Row]] = {}
    for label in GPU_LABELS:
        path = directory / f"results_{label}.txt"
        if not path.exists():
            continue
        values = [float(v) for v in path.read_text().split()]
        if len(values) != len(pairs):
            raise ValueError(f"{path}: {len(values)} results for {len(pairs)} requests")
        out[label] = [(int(i), int(o), 1.0 / v) for (i, o), v in zip(pairs, values)]
    return out


def single_request_latency(sim_instance_factory: Callable[[], SimInstance], input_tokens: int,
                           output_tokens: int, cached_tokens: int = 0) -> float:
    """Seconds from ``add`` to ``finished`` for one request alone on a fresh instance."""
    inst = sim_instance_factory()
    inst.add("calibration", input_tokens, output_tokens, 0, 0.0, cached_tokens=cached_tokens)
    for ev in inst.step_until(math.inf):
        if ev.kind == "finished":
            return ev.time
    raise RuntimeError("the request did not finish")


def paper_factory(label: str, gpu_profile: GPUProfile | None = None,
                  model_profile: ModelProfile | None = None, **kwargs):
    """A factory of ``SimInstance`` for a file label (calibrated stock profile by default)."""
    from agentflow.sim.engine import SimInstance

    g = gpu_profile or hardware.gpu(GPU_LABELS[label])
    m = model_profile or hardware.paper_model()
    return lambda: SimInstance(g, m, **kwargs)


def simulate_rows(factory: Callable[[], SimInstance], rows: Sequence[Row],
                  prompts_cached: bool = True) -> np.ndarray:
    return np.array([single_request_latency(factory, i, o, i if prompts_cached else 0)
                     for i, o, _ in rows])


def relative_errors(predicted: Iterable[float], measured: Iterable[float]) -> np.ndarray:
    p, m = np.asarray(list(predicted), float), np.asarray(list(measured), float)
    return np.abs(p - m) / m


def split_halves(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (fit half, held-out half): even and odd request indices. The requests
    are sorted by prompt length, so both halves span the same sizes."""
    even = np.arange(n) % 2 == 0
    return even, ~even


# ----------------------------------------------------------------------------- the fit
def _features(gpu_profile: GPUProfile, model_profile: ModelProfile, rows: Sequence[Row],
              block_size: int = 16) -> np.ndarray:
    """Per request: [fixed seconds, weight bytes / peak bw, KV-read bytes / peak bw] of the
    simulator's prompt-cached single-request replay (agentflow.step_time, every GEMM and
    decode attention on the bandwidth side of its roofline, which holds for steps of at most
    one block of tokens). Fixed: kernel latencies, element-wise operators, the KV write, the
    first step's attention over the cached prompt, and ``step_overhead_s``."""
    from agentflow.step_time import OperatorModel

    om = OperatorModel(gpu_profile, model_profile)
    bw = gpu_profile.mem_bw_gbs * 1e9
    L = om.layers
    lat_lin = gpu_profile.linear_latency_s

    def weights(T: int) -> float:  # bytes streamed by the GEMMs of a step of T tokens
        return L * sum(om.gemm_work(g, T)[1] for g in range(4)) + om.lm_head_work(1)[1]

    def fixed(T: int) -> float:
        return (L * (4 * lat_lin + om.elementwise(T)) + lat_lin + om.fixed(T))

    feats = []
    for i, o, _ in rows:
        cached = (i - 1) - (i - 1) % block_size
        t0 = i - cached  # prompt tokens computed in the first step
        if t0 == 1:
            _, b0 = om.attention_work(1, i, i)
            first_attn, read = gpu_profile.decode_attn_latency_s * L, L * b0
        else:
            first_attn = L * float(om.prefill_attention(
                t0, t0 * cached + t0 * (t0 + 1) // 2, i))
            read = 0.0
        fix = fixed(t0) + first_attn + (o - 1) * (fixed(1) + L * gpu_profile.decode_attn_latency_s)
        # decode step k = 1..o-1 attends to i + k tokens
        ctx = (o - 1) * i + (o - 1) * o / 2
        read += L * om.attention_work(o - 1, ctx, ctx)[1]
        write = weights(t0) + (o - 1) * weights(1)
        feats.append((fix, write / bw, read / bw))
    return np.array(feats, float)


@dataclass
class FitResult:
    constants: dict[str, Calibration]  # per file label
    step_overhead_s: float


def fit_constants(data: dict[str, list[Row]], mask: np.ndarray | None = None,
                  model_profile: ModelProfile | None = None,
                  step_overhead_s: float | None = None) -> FitResult:
    """Joint weighted least squares (see the module docstring) on the rows where ``mask``."""
    m = model_profile or hardware.paper_model()
    labels = list(data)
    blocks_X, blocks_y = [], []
    n_par = 2 * len(labels) + 1
    overhead = None
    for k, label in enumerate(labels):
        g = hardware.gpu(GPU_LABELS[label])
        if step_overhead_s is not None:
            g = replace(g, step_overhead_s=step_overhead_s)
        overhead = g.step_overhead_s
        rows = data[label]
        sel = np.ones(len(rows), bool) if mask is None else mask
        F = _features(g, m, rows)[sel]
        y = np.array([r[2] for r in rows])[sel]
        X = np.zeros((len(y), n_par))
        X[:, 2 * k] = 1.0  # request overhead
        X[:, 2 * k + 1] = F[:, 1]  # 1 / bw_efficiency
        X[:, -1] = F[:, 2]  # 1 / attn_bw_efficiency
        w = 1.0 / y
        blocks_X.append(X * w[:, None])
        blocks_y.append((y - F[:, 0]) * w)
    if overhead is None:
        raise ValueError("fit_constants needs measurements of at least one GPU")
    coef = np.linalg.lstsq(np.vstack(blocks_X), np.concatenate(blocks_y), rcond=None)[0]
    attn = 1.0 / coef[-1]
    consts = {label: Calibration(bw_efficiency=1.0 / coef[2 * k + 1], attn_bw_efficiency=attn,
                                 request_overhead_s=coef[2 * k], source="fit")
              for k, label in enumerate(labels)}
    return FitResult(consts, overhead)


# ------------------------------------------------------------------ the reference rule
def reference_latency(label: str, rows: Sequence[Row],
                      prefill: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """HexGen-Flow's rule: a fixed decode time per output token (``REFERENCE_DECODE_S``)
    plus a prefill ``a + b * input`` (zero unless fitted)."""
    d = REFERENCE_DECODE_S[label]
    a, b = prefill
    return np.array([a + b * i + d * o for i, o, _ in rows])


def fit_reference_prefill(label: str, rows: Sequence[Row]) -> tuple[float, float]:
    """Least squares of ``measured - d * output = a + b * input`` (their 'the rest is
    prefill'), for predicting requests that were not measured."""
    d = REFERENCE_DECODE_S[label]
    X = np.array([[1.0, i] for i, _, _ in rows])
    y = np.array([lat - d * o for _, o, lat in rows])
    a, b = np.linalg.lstsq(X, y, rcond=None)[0]
    return float(a), float(b)
