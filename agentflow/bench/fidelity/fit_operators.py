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
  ``num_tokens`` row: a kernel latency, a compute and a weight-streaming efficiency;
* element-wise: the sum of the two norms, rope, activation and residual add per row: a
  latency per kernel and a bandwidth efficiency;
* decode attention: a latency and a KV-read bandwidth efficiency;
* prefill attention: a latency and a compute efficiency (its bytes at the decode one).

Vidur's KV-cache write (``kv_cache_save``) grows by ~0.55 us per token and layer: 4 KiB of
keys and values per token in 0.55 us is 7.4 GB/s, 1/275 of the A100's HBM bandwidth, where
vLLM's ``reshape_and_cache`` kernel moves those bytes at memory speed. It is treated as a
quirk of that profiling build: only its fixed part is fitted (the median of the rows of at
most 80 tokens, where the per-token part is < 0.05 us), and the per-token part is bytes at
the element-wise bandwidth. The per-token quirk is printed for reference.

The same constants are then checked, without refitting, on the rows the fit did not use:
Llama-3-8B GEMMs at TP 2/4/8 and Llama-3-70B GEMMs at TP 1/2/4/8.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from dataclasses import replace
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


# ------------------------------------------------------------------------------ the fit
KNEE = 2.0


def fit_roofline(x: np.ndarray, y: np.ndarray, measured: np.ndarray,
                 fixed_b: float | None = None) -> tuple[float, float, float]:
    """Least squares of the relative error of ``lat + max(a * x, b * y)``; returns (lat, a,
    b). ``x``/``y``: seconds at 100% of peak FLOP/s / bandwidth. Alternates: assign each row
    to its larger branch, fit ``lat`` and ``b`` on the rows clearly on the bandwidth side,
    then ``a`` on the rows clearly on the compute side with that ``lat``; repeat until the
    assignment is stable. "Clearly": one branch at least ``KNEE`` times the other. Rows in
    the knee, where real kernels are slower than either asymptote, are left out of the fit
    (and in the error report), so they do not bend both asymptotes. ``fixed_b``: keep ``b``
    and fit ``lat`` with ``a`` on the compute side."""
    w = 1.0 / measured
    a = 1.5
    b = 1.5 if fixed_b is None else fixed_b
    lat = 0.0
    side = None
    for _ in range(50):
        new = np.sign(np.log(a * x + 1e-30) - np.log(b * y + 1e-30)) * (
            np.abs(np.log((a * x + 1e-30) / (b * y + 1e-30))) >= np.log(KNEE))
        if side is not None and np.array_equal(new, side):
            break
        side = new
        mem, cmp_ = side < 0, side > 0
        if fixed_b is None and mem.sum() >= 2:
            X = np.column_stack([np.ones(mem.sum()), y[mem]]) * w[mem, None]
            lat, b = (float(v) for v in np.linalg.lstsq(X, np.ones(mem.sum()), rcond=None)[0])
            lat = max(lat, 0.0)
            if cmp_.any():
                r = (measured[cmp_] - lat) * w[cmp_]
                xx = x[cmp_] * w[cmp_]
                a = float(xx @ r / (xx @ xx))
        elif cmp_.sum() >= 2:
            X = np.column_stack([np.ones(cmp_.sum()), x[cmp_]]) * w[cmp_, None]
            lat, a = (float(v) for v in np.linalg.lstsq(X, np.ones(cmp_.sum()), rcond=None)[0])
            lat = max(lat, 0.0)
    return lat, a, b


def fit(profiles: Path) -> dict[str, float]:
    gpu = hardware.gpu("A100-80G")
    model = hardware.model("Llama-3.1-8B")
    peak, bw = gpu.peak_tflops * 1e12, gpu.mem_bw_gbs * 1e9
    om = OperatorModel(gpu, model)
    mlp = load_mlp(profiles / "Meta-Llama-3-8B-mlp.csv")[1]
    out: dict[str, float] = {}
    # linear
    xs, ys, ms = [], [], []
    for T, ops in mlp.items():
        for i, op in enumerate(GEMMS):
            flops, nbytes = om.gemm_work(i, T)
            xs.append(flops / peak)
            ys.append(nbytes / bw)
            ms.append(ops[op] * 1e-3)
    x, y, m = np.array(xs), np.array(ys), np.array(ms)
    lat, a, b = fit_roofline(x, y, m)
    out.update(linear_latency_s=lat, compute_efficiency=1 / a, bw_efficiency=1 / b)
    # element-wise: the five operators' sum per row
    Ts = np.array(sorted(mlp))
    m = np.array([sum(mlp[T][op] for op in ELEMENTWISE) * 1e-3 for T in Ts])
    y = np.array([om.norms_act_bytes(T) / bw for T in Ts])
    X = np.column_stack([np.full_like(m, len(ELEMENTWISE)), y]) / m[:, None]
    lat, b = np.linalg.lstsq(X, np.ones_like(m), rcond=None)[0]
    out.update(elementwise_latency_s=max(float(lat), 0.0), elementwise_bw_efficiency=1 / b)
    # decode attention
    dec = load_decode(profiles / "Meta-Llama-3-8B-attention-decode.txt")
    xs, ys, ms = [], [], []
    for c, B, ms_ in dec:
        flops, nbytes = om.attention_work(B, B * (c + 1), B * (c + 1))
        xs.append(flops / peak)
        ys.append(nbytes / bw)
        ms.append(ms_ * 1e-3)
    lat, a, b = fit_roofline(np.array(xs), np.array(ys), np.array(ms))
    out.update(decode_attn_latency_s=lat, attn_bw_efficiency=1 / b)
    # prefill attention, bytes at the decode kernel's bandwidth efficiency
    pre = load_prefill(profiles / "Meta-Llama-3-8B-attention-prefill.txt")
    xs, ys, ms = [], [], []
    for n, c, att, _ in pre:
        flops, nbytes = om.attention_work(n, n * c + n * (n + 1) // 2, c + n)
        xs.append(flops / peak)
        ys.append(nbytes / bw)
        ms.append(att * 1e-3)
    lat, a, _ = fit_roofline(np.array(xs), np.array(ys), np.array(ms),
                             fixed_b=1 / out["attn_bw_efficiency"])
    out.update(prefill_attn_latency_s=lat, prefill_attn_efficiency=1 / a)
    # KV-cache write: the fixed part only (see the module docstring)
    small = [s for n, _, _, s in pre if n <= 80]
    out["kv_write_latency_s"] = float(np.median(small)) * 1e-3
    return {k: float(v) for k, v in out.items()}


# --------------------------------------------------------------------------- the errors
def _err(pred, meas) -> tuple[float, float, int]:
    e = np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)
    return float(np.median(e)), float(e.max()), len(e)


def errors(profiles: Path, consts: dict[str, float]) -> list[tuple[str, tuple]]:
    """Per operator class: (median, max, rows) of |model / measured - 1|."""
    gpu = replace(hardware.gpu("A100-80G"), **consts)
    rows: list[tuple[str, tuple]] = []
    all_mlp = {name: load_mlp(profiles / f"{name}-mlp.csv") for name in MODELS}
    om = OperatorModel(gpu, hardware.model("Llama-3.1-8B"))
    mlp = all_mlp["Meta-Llama-3-8B"][1]
    Ts = sorted(mlp)
    for i, op in enumerate(GEMMS):
        rows.append((f"linear: {op}", _err([om.gemm(i, T) for T in Ts],
                                           [mlp[T][op] * 1e-3 for T in Ts])))
    rows.append(("linear: sum of the 4 GEMMs", _err([om.linear(T) for T in Ts],
                                                   [sum(mlp[T][o] for o in GEMMS) * 1e-3
                                                    for T in Ts])))
    small = [T for T in Ts if T <= 64]
    rows.append(("linear: sum, decode sizes T<=64", _err(
        [om.linear(T) for T in small], [sum(mlp[T][o] for o in GEMMS) * 1e-3 for T in small])))
    for lo, hi, label in ((65, 511, "knee 64<T<512"), (512, 1 << 30, "T>=512")):
        sel = [T for T in Ts if lo <= T <= hi]
        rows.append((f"linear: sum, {label}", _err(
            [om.linear(T) for T in sel], [sum(mlp[T][o] for o in GEMMS) * 1e-3 for T in sel])))
    rows.append(("element-wise: sum of the 5 ops", _err(
        [om.norms_act(T) for T in Ts], [sum(mlp[T][o] for o in ELEMENTWISE) * 1e-3
                                        for T in Ts])))
    dec = load_decode(profiles / "Meta-Llama-3-8B-attention-decode.txt")
    rows.append(("decode attention", _err([om.decode_attention(B, B * (c + 1))
                                           for c, B, _ in dec], [m * 1e-3 for *_, m in dec])))
    pre = load_prefill(profiles / "Meta-Llama-3-8B-attention-prefill.txt")
    rows.append(("prefill attention", _err(
        [om.prefill_attention(n, n * c + n * (n + 1) // 2, c + n) for n, c, _, _ in pre],
        [a * 1e-3 for _, _, a, _ in pre])))
    rows.append(("KV write, chunks <= 80 tokens", _err(
        [om.kv_write(n) for n, _, _, _ in pre if n <= 80],
        [s * 1e-3 for n, _, _, s in pre if n <= 80])))
    rows.append(("KV write vs Vidur's quirk (all)", _err(
        [om.kv_write(n) for n, _, _, _ in pre], [s * 1e-3 for *_, s in pre])))
    # held out: other TP degrees and the 70B model, GEMMs only
    for name, by_tp in all_mlp.items():
        model = hardware.model(MODELS[name])
        for tp in sorted(by_tp):
            if name == "Meta-Llama-3-8B" and tp == 1:
                continue
            omt = OperatorModel(gpu, model, tp)
            r = by_tp[tp]
            Tt = sorted(r)
            rows.append((f"held out: {name} TP{tp} GEMM sum", _err(
                [omt.linear(T) for T in Tt], [sum(r[T][o] for o in GEMMS) * 1e-3
                                              for T in Tt])))
    return rows


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    args = ap.parse_args(argv)
    fresh = fit(args.profiles)
    stored = dict(hardware.OPERATOR_FIT)
    print("# Operator-class constants, A100 (Vidur Llama-3-8B TP1 rows)")
    print(f"{'constant':28} {'stored (hardware.OPERATOR_FIT)':>22} {'fit now':>12}")
    for k in fresh:
        print(f"{k:28} {stored.get(k, float('nan')):22.4g} {fresh[k]:12.4g}")
    print()
    print("# Fit error |model / measured - 1| against the rows: median, max (rows)")
    print(f"{'operator class':38} {'stored consts':>20}   {'fresh fit':>20}")
    for (name, e_s), (_, e_f) in zip(errors(args.profiles, stored),
                                     errors(args.profiles, fresh)):
        print(f"{name:38} {e_s[0]*100:6.1f}% {e_s[1]*100:7.1f}% ({e_s[2]:3d})  "
              f"{e_f[0]*100:6.1f}% {e_f[1]*100:7.1f}% ({e_f[2]:3d})")
    print()
    print("# for agentflow/hardware.py:")
    print("OPERATOR_FIT: dict[str, float] = {")
    for k, v in fresh.items():
        print(f'    "{k}": {v:.4g},')
    print("}")


if __name__ == "__main__":
    main()
