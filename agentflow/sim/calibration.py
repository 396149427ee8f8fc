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

Fit (``fit_constants``): the simulator's single-request latency is, when every step is
memory-bound (true here: at most one block of prompt tokens is computed per step),

    latency = request_overhead + O * step_overhead
              + [sum over steps of (weight bytes + KV written) / peak bandwidth] / bw_efficiency
              + [sum over steps of KV bytes read / peak bandwidth] / attn_bw_efficiency

linear in (request_overhead, 1/bw_efficiency, 1/attn_bw_efficiency). Weighted least squares
(weights 1/measured, i.e. relative error) on the even-indexed half of the requests; per GPU a
request overhead and a weight-streaming efficiency, one attention efficiency shared by the
three GPUs (same kernel, same model shape); ``step_overhead_s`` stays at its 2 ms prior
because single requests cannot separate it from ``bw_efficiency`` (both are per-token
constants). The odd half is held out.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
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
    """Per request: [steps, weight+write bytes / peak bw, KV-read bytes / peak bw] of the
    simulator's prompt-cached single-request replay (memory-bound steps)."""
    bw = gpu_profile.mem_bw_gbs * 1e9
    kvb = model_profile.kv_bytes_per_token
    W = model_profile.weight_bytes
    rho = model_profile.active_params_b / model_profile.params_b
    feats = []
    for i, o, _ in rows:
        cached = (i - 1) - (i - 1) % block_size
        t0 = i - cached  # prompt tokens computed in the first step
        f0 = 1.0 if rho >= 1 else 1 - (1 - rho) ** t0
        f1 = 1.0 if rho >= 1 else rho
        write = W * f0 + kvb * t0 + (o - 1) * (W * f1 + kvb)
        read = kvb * (cached + (o - 1) * i + (o - 1) * (o - 2) / 2)
        feats.append((o, write / bw, read / bw))
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
        o = g.step_overhead_s if step_overhead_s is None else step_overhead_s
        overhead = o
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
        blocks_y.append((y - o * F[:, 0]) * w)
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
