"""Fit the step-time model's operator classes once, on measured A100 operator times.

    agentflow bench fit_operators [--profiles ../shared/profiles/vidur-a100]

The rows are Vidur's profiles of Llama-3-8B on an A100 (TP 1; see the profiles' README):
every non-attention operator of a layer at ``num_tokens`` tokens (``mlp.csv``), decode
attention at (context, batch) and prefill attention with the KV-cache write at (chunk,
cached context). Each operator class of ``agentflow.step_time`` gets one fit (least squares
of the relative error, alternating between the rows on the compute and on the bandwidth
side of a roofline), and the script prints per class the fit error median / max against
the rows, with the stored constants (``agentflow.hardware.OPERATOR_FIT``) and with the fresh fit:

* linear: the four GEMMs (qkv, output projection, MLP gate+up, MLP down), every
  ``num_tokens`` row: a kernel latency, a compute and a weight-streaming efficiency, the
  knee's p-norm and the cost of a partial wave of output tiles; each GEMM's relative error
  weighted by its share of the four's time at that token count (the step charges their
  sum: a 10% miss of the output projection, 5% of the sum, weighs what 0.5% of the sum does);
* element-wise: the sum of the two norms, rope, activation and residual add per row: a
  latency per kernel, a bandwidth efficiency and one thread block's streaming rate (the
  norms and the activation run a block per token, in waves of SMs x blocks per SM);
* decode attention: a latency, a KV-read bandwidth efficiency and the cost of a partial
  round of (sequence, KV head) blocks;
* prefill attention: a latency and a compute efficiency (its bytes at the decode one).

Vidur's KV-cache write (``kv_cache_save``) grows by ~0.55 us per token and layer: 4 KiB of
keys and values per token in 0.55 us is 7.4 GB/s, 1/275 of the A100's HBM bandwidth, where
vLLM's ``reshape_and_cache`` kernel moves those bytes at memory speed. It is treated as a
quirk of that profiling build: only its fixed part is fitted (the median of the rows of at
most 80 tokens, where the per-token part is < 0.05 us), and the per-token part is bytes at
the element-wise bandwidth. The per-token quirk is printed for reference.

The same constants are then checked, without refitting, on the rows the fit did not use:
Llama-3-8B GEMMs and element-wise operators at TP 2/4/8 and Llama-3-70B's at TP 1/2/4/8.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from agentflow import hardware
from agentflow.bench.paths import SHARED
from agentflow.step_time import OperatorModel

DEFAULT_PROFILES = SHARED / "profiles" / "vidur-a100"
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
# Vidur's model names -> agentflow's profiles (same architecture: Llama 3 = Llama 3.1).
MODELS = {"Meta-Llama-3-8B": "Llama-3.1-8B", "Meta-Llama-3-70B": "Llama-3.1-70B"}


# ------------------------------------------------------------------------------ the rows
def load_mlp(path: Path) -> dict[int, dict[int, dict[str, float]]]:
    """TP -> num_tokens -> operator -> median ms (median over repeated rows)."""
    acc: dict[int, dict[int, dict[str, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    with path.open() as f:
        for r in csv.DictReader(f):
            tp, T = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
            for op in GEMMS + ELEMENTWISE:
                acc[tp][T][op].append(float(r[f"time_stats.{op}.median"]))
    return {tp: {T: {op: float(np.median(v)) for op, v in ops.items()}
                 for T, ops in by_t.items()} for tp, by_t in acc.items()}


def _table(path: Path, ncols: int) -> list[tuple[float, ...]]:
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            vals = tuple(float(x) for x in line.split())
            if len(vals) != ncols:
                raise ValueError(f"{path}: expected {ncols} columns in {line!r}")
            rows.append(vals)
    return rows


def load_decode(path: Path) -> list[tuple[int, int, float]]:
    """(context, batch, ms)."""
    return [(int(c), int(b), ms) for c, b, ms in _table(path, 3)]


def load_prefill(path: Path) -> list[tuple[int, int, float, float]]:
    """(chunk, cached context, attention ms, KV-cache save ms)."""
    return [(int(n), int(c), a, s) for n, c, a, s in _table(path, 4)]


# ------------------------------------------------------------------------- the halves
@dataclass(frozen=True)
class Rows:
    """One half of the Llama-3-8B TP1 rows: GEMM and element-wise rows by token count,
    decode attention (context, batch, ms), prefill attention (chunk, cached, ms, KV ms)."""

    mlp: dict[int, dict[str, float]]
    decode: list[tuple[int, int, float]]
    prefill: list[tuple[int, int, float, float]]


def halves(profiles: Path) -> tuple[Rows, Rows]:
    """The rule that keeps the check honest: sort every table by its key (token count;
    context, batch; chunk, cached context) and take alternate rows, the even ones to fit,
    the odd ones held out. Both halves span the same range, so the held-out error is an
    interpolation error, which is what the simulator asks of the model."""
    mlp = load_mlp(profiles / "Meta-Llama-3-8B-mlp.csv")[1]
    Ts = sorted(mlp)
    dec = sorted(load_decode(profiles / "Meta-Llama-3-8B-attention-decode.txt"))
    pre = sorted(load_prefill(profiles / "Meta-Llama-3-8B-attention-prefill.txt"))
    return tuple(Rows({T: mlp[T] for T in Ts[k::2]}, dec[k::2], pre[k::2])  # type: ignore
                 for k in (0, 1))


# ------------------------------------------------------------------------------ the fit
def _least_squares(model, x0, lo, hi, measured, weight=None) -> np.ndarray:
    """Least squares of the relative error ``model(x) / measured - 1`` (times ``weight``)."""
    from scipy.optimize import least_squares

    meas = np.asarray(measured, float)
    w = 1.0 if weight is None else np.asarray(weight, float)
    res = least_squares(lambda x: (np.asarray(model(x), float) / meas - 1.0) * w, x0,
                        bounds=(lo, hi), x_scale="jac")
    return res.x


def fit(rows: Rows) -> dict[str, float]:
    """Every operator class's constants from the rows given (``halves(...)[0]``)."""
    base = hardware.gpu("A100-80G")
    model = hardware.model("Llama-3.1-8B")
    out: dict[str, float] = {}

    def om(**kw) -> OperatorModel:
        return OperatorModel(replace(base, **{**out, **kw}), model)

    Ts = sorted(rows.mlp)
    # linear: latency, compute and weight-streaming efficiencies, and the knee's p-norm
    names = ("linear_latency_s", "compute_efficiency", "bw_efficiency", "gemm_knee_p",
             "gemm_wave_penalty", "gemm_half_tile_efficiency")

    meas = np.array([rows.mlp[T][op] * 1e-3 for T in Ts for op in GEMMS])
    # each GEMM's relative error weighted by its share of the four's time (the step's sum)
    share = meas / np.repeat([sum(rows.mlp[T][op] for op in GEMMS) * 1e-3 for T in Ts],
                             len(GEMMS))

    def linear(x):
        o = om(**dict(zip(names, x)))
        return [o.gemm(i, T) for T in Ts for i in range(len(GEMMS))]

    x = _least_squares(linear, [4e-6, 0.7, 0.75, 3.0, 0.3, 0.8],
                       [0, 0.05, 0.05, 1.0, 0.0, 0.3], [1e-4, 1.0, 1.0, 50.0, 1.0, 1.0],
                       meas, share)
    out.update(zip(names, (float(v) for v in x)))
    # element-wise: the five operators' sum per row: a latency per kernel, a bandwidth,
    # and one thread block's streaming rate (what a few tokens' rows cost)
    names = ("elementwise_latency_s", "elementwise_bw_efficiency", "elementwise_block_bw_gbs")

    def elementwise(x):
        o = om(**dict(zip(names, x)))
        return [o.norms_act(T) for T in Ts]

    x = _least_squares(elementwise, [3e-6, 0.5, 10.0], [0, 0.05, 0.1], [1e-4, 1.0, 1e3],
                       [sum(rows.mlp[T][op] for op in ELEMENTWISE) * 1e-3 for T in Ts])
    out.update(zip(names, (float(v) for v in x)))
    # decode attention: latency, KV-read bandwidth, the partial wave's cost
    names = ("decode_attn_latency_s", "attn_bw_efficiency", "attn_wave_penalty")

    def decode(x):
        o = om(**dict(zip(names, x)))
        return [o.decode_attention(B, B * (c + 1)) for c, B, _ in rows.decode]

    x = _least_squares(decode, [1.7e-5, 0.8, 0.3], [0, 0.05, 0.0], [1e-3, 1.0, 1.0],
                       [ms * 1e-3 for *_, ms in rows.decode])
    out.update(zip(names, (float(v) for v in x)))
    # prefill attention (bytes at the decode kernel's bandwidth): the kernel latency from
    # the short chunks without cached context (their compute is < 3% of their time), then
    # the compute efficiency and the chunk size at which it reaches half of it, on the
    # chunks of >= 512 tokens (below, other kernels and split-KV take over; see errors)
    short = [a for n, c, a, _ in rows.prefill if n <= 80 and c == 0]
    out["prefill_attn_latency_s"] = float(np.median(short)) * 1e-3
    names = ("prefill_attn_efficiency", "prefill_attn_half_tokens")
    long_ = [r for r in rows.prefill if r[0] >= 512]

    def prefill(x):
        o = om(**dict(zip(names, x)))
        return [o.prefill_attention(n, n * c + n * (n + 1) // 2, c + n)
                for n, c, _, _ in long_]

    x = _least_squares(prefill, [0.6, 500.0], [0.05, 0.0], [1.0, 1e5],
                       [a * 1e-3 for _, _, a, _ in long_])
    out.update(zip(names, (float(v) for v in x)))
    # KV-cache write: the fixed part only (see the module docstring)
    small = [s for n, _, _, s in rows.prefill if n <= 80]
    out["kv_write_latency_s"] = float(np.median(small)) * 1e-3
    return {k: float(v) for k, v in out.items()}


# --------------------------------------------------------------------------- the errors
def _err(pred, meas) -> tuple[float, float, int]:
    e = np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)
    return float(np.median(e)), float(e.max()), len(e)


def errors(rows: Rows, consts: dict[str, float]) -> list[tuple[str, tuple]]:
    """Per operator class: (median, max, rows) of |model / measured - 1| on ``rows``."""
    gpu = replace(hardware.gpu("A100-80G"), **consts)
    out: list[tuple[str, tuple]] = []
    om = OperatorModel(gpu, hardware.model("Llama-3.1-8B"))
    mlp = rows.mlp
    Ts = sorted(mlp)
    for i, op in enumerate(GEMMS):
        out.append((f"linear: {op}", _err([om.gemm(i, T) for T in Ts],
                                          [mlp[T][op] * 1e-3 for T in Ts])))
    for lo, hi, label in ((1, 1 << 30, "all T"), (1, 63, "decode sizes T<64"),
                          (64, 512, "knee 64<=T<=512"), (513, 1 << 30, "T>512")):
        sel = [T for T in Ts if lo <= T <= hi]
        out.append((f"linear: sum of 4 GEMMs, {label}", _err(
            [om.linear(T) for T in sel], [sum(mlp[T][o] for o in GEMMS) * 1e-3 for T in sel])))
    out.append(("element-wise: sum of the 5 ops", _err(
        [om.norms_act(T) for T in Ts], [sum(mlp[T][o] for o in ELEMENTWISE) * 1e-3
                                        for T in Ts])))
    out.append(("decode attention", _err([om.decode_attention(B, B * (c + 1))
                                          for c, B, _ in rows.decode],
                                         [m * 1e-3 for *_, m in rows.decode])))
    pre = rows.prefill
    for label, sel in (("chunks >= 512", [r for r in pre if r[0] >= 512]),
                       ("chunks <= 80", [r for r in pre if r[0] <= 80])):
        out.append((f"prefill attention, {label}", _err(
            [om.prefill_attention(n, n * c + n * (n + 1) // 2, c + n) for n, c, _, _ in sel],
            [a * 1e-3 for _, _, a, _ in sel])))
    out.append(("KV write, chunks <= 80 tokens", _err(
        [om.kv_write(n) for n, _, _, _ in pre if n <= 80],
        [s * 1e-3 for n, _, _, s in pre if n <= 80])))
    out.append(("KV write vs Vidur's quirk (all)", _err(
        [om.kv_write(n) for n, _, _, _ in pre], [s * 1e-3 for *_, s in pre])))
    return out


def other_models(profiles: Path, consts: dict[str, float]) -> list[tuple[str, tuple]]:
    """Held out whole: the GEMM sums at other TP degrees and of the 70B model."""
    gpu = replace(hardware.gpu("A100-80G"), **consts)
    out: list[tuple[str, tuple]] = []
    for name, by_tp in ((n, load_mlp(profiles / f"{n}-mlp.csv")) for n in MODELS):
        model = hardware.model(MODELS[name])
        for tp in sorted(by_tp):
            if name == "Meta-Llama-3-8B" and tp == 1:
                continue
            omt = OperatorModel(gpu, model, tp)
            r = by_tp[tp]
            Tt = sorted(r)
            out.append((f"{name} TP{tp} GEMM sum", _err(
                [omt.linear(T) for T in Tt], [sum(r[T][o] for o in GEMMS) * 1e-3
                                              for T in Tt])))
            out.append((f"{name} TP{tp} element-wise sum", _err(
                [omt.norms_act(T) for T in Tt], [sum(r[T][o] for o in ELEMENTWISE) * 1e-3
                                                 for T in Tt])))
    return out


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    args = ap.parse_args(argv)
    fit_half, held = halves(args.profiles)
    fresh = fit(fit_half)
    stored = dict(hardware.OPERATOR_FIT)
    print("# Operator-class constants, A100 (Vidur Llama-3-8B TP1 rows, even half)")
    print(f"{'constant':28} {'stored (hardware.OPERATOR_FIT)':>22} {'fit now':>12}")
    for k in fresh:
        print(f"{k:28} {stored.get(k, float('nan')):22.4g} {fresh[k]:12.4g}")
    print()
    print("# Error |model / measured - 1| of the stored constants: median, max (rows)")
    print(f"{'operator class':38} {'held-out half':>21}   {'fitted half':>21}")
    for (name, e_h), (_, e_f) in zip(errors(held, stored), errors(fit_half, stored)):
        print(f"{name:38} {e_h[0]*100:6.1f}% {e_h[1]*100:7.1f}% ({e_h[2]:3d})  "
              f"{e_f[0]*100:6.1f}% {e_f[1]*100:7.1f}% ({e_f[2]:3d})")
    print("# held out whole (GEMM and element-wise sums, every row)")
    for name, e in other_models(args.profiles, stored):
        print(f"{name:38} {e[0]*100:6.1f}% {e[1]*100:7.1f}% ({e[2]:3d})")
    print()
    print("# for agentflow/hardware.py:")
    print("OPERATOR_FIT: dict[str, float] = {")
    for k, v in fresh.items():
        print(f'    "{k}": {v:.4g},')
    print("}")


if __name__ == "__main__":
    main()
