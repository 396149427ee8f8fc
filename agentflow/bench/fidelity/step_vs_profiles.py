"""`agentflow simulate step` against measured A100 operator times composed the Vidur way.

    agentflow bench step_vs_profiles [--profiles ../shared/profiles/vidur-a100]

The measured side composes Vidur's Llama-3-8B A100 TP1 rows as Vidur composes a step: per
layer the sum of the operators — every ``mlp.csv`` operator (qkv / output projection, rope,
two norms, MLP up / activation / down, residual add) at the step's total token count
(linear interpolation between the profiled counts), decode attention at (batch, context)
(profiled rows), prefill attention at (chunk, cached context) (the profiled row, or linear
interpolation in query-key pairs between the nearest rows without cached context), and the
KV-cache write — times the 32 layers; no LM head and no CPU overhead (Vidur profiles neither
here). The simulated side is ``agentflow simulate step --json``'s ``layers_ms`` (the same
terms: the model's layers), with its full ``step_ms`` (+ LM head + per-step overhead) shown
beside it.

Vidur's KV-cache write grows ~0.55 us per token and layer, 1/275 of HBM bandwidth for the
bytes it moves (see agentflow bench fit_operators): the target column ("measured") keeps only
its fixed part (the median of the rows of at most 80 tokens); "with the quirk" adds the
write as profiled, for reference.

Cases: decode B = 1 / 8 / 32 at context 2,176 and 12,288 (the profiled contexts; "2k",
"12k"), and 32 decodes at 12,288 plus one prefill chunk of 512 / 2,048 / 8,192 tokens
without cached context. Target: every ratio sim / measured in 0.85-1.15. Last, the growth of
a decode step from B = 1 to B = 32 at 12k (what a dispatcher learns per co-runner).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import numpy as np

from agentflow.bench.fidelity.fit_operators import (
    DEFAULT_PROFILES,
    ELEMENTWISE,
    GEMMS,
    load_decode,
    load_mlp,
    load_prefill,
)
from agentflow.cli.main import main as agentflow_main

LAYERS = 32  # Llama-3-8B
LO, HI = 0.85, 1.15


class Composer:
    """Vidur-style step times (ms) from the measured rows."""

    def __init__(self, profiles: Path):
        mlp = load_mlp(profiles / "Meta-Llama-3-8B-mlp.csv")[1]
        self.T = np.array(sorted(mlp), float)
        self.tokenwise = np.array([sum(mlp[int(T)][op] for op in GEMMS + ELEMENTWISE)
                                   for T in self.T])
        self.decode = {(c, b): ms for c, b, ms in
                       load_decode(profiles / "Meta-Llama-3-8B-attention-decode.txt")}
        self.prefill = load_prefill(profiles / "Meta-Llama-3-8B-attention-prefill.txt")
        save: dict[int, list[float]] = {}
        for n, _, _, s in self.prefill:
            save.setdefault(n, []).append(s)
        self.save_n = np.array(sorted(save), float)
        self.save_ms = np.array([np.median(save[int(n)]) for n in self.save_n])
        self.save_fixed = float(np.median([s for n, _, _, s in self.prefill if n <= 80]))

    def tokenwise_ms(self, T: int) -> float:
        if not self.T[0] <= T <= self.T[-1]:
            raise ValueError(f"{T} tokens outside the profiled range")
        return float(np.interp(T, self.T, self.tokenwise))

    def decode_ms(self, batch: int, ctx: int) -> float:
        try:
            return self.decode[(ctx, batch)]
        except KeyError:
            raise ValueError(f"no decode row at context {ctx}, batch {batch}") from None

    def prefill_ms(self, chunk: int, ctx: int) -> float:
        for n, c, a, _ in self.prefill:
            if (n, c) == (chunk, ctx):
                return a
        if ctx != 0:
            raise ValueError(f"no prefill row at chunk {chunk}, context {ctx}")
        rows = sorted((n * (n + 1) / 2, a) for n, c, a, _ in self.prefill if c == 0)
        pairs = chunk * (chunk + 1) / 2
        return float(np.interp(pairs, [p for p, _ in rows], [a for _, a in rows]))

    def kv_save_ms(self, T: int, quirk: bool) -> float:
        if not quirk:
            return self.save_fixed
        return float(np.interp(T, self.save_n, self.save_ms))

    def step_ms(self, decode: tuple[int, int] | None, chunk: int | None,
                quirk: bool = False) -> float:
        T = (decode[0] if decode else 0) + (chunk or 0)
        layer = self.tokenwise_ms(T) + self.kv_save_ms(T, quirk)
        if decode:
            layer += self.decode_ms(*decode)
        if chunk:
            layer += self.prefill_ms(chunk, 0)
        return layer * LAYERS


def simulate_step(decode: tuple[int, int] | None, chunk: int | None) -> dict:
    """``agentflow simulate step ... --json``, run in-process."""
    argv = ["simulate", "step", "--gpu", "A100-80G", "--model", "Llama-3.1-8B", "--tp", "1",
            "--json"]
    if decode:
        argv += ["--decode", f"{decode[0]}:{decode[1]}"]
    if chunk:
        argv += ["--prefill", str(chunk)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = agentflow_main(argv)
    if rc:
        raise RuntimeError(f"agentflow {' '.join(argv)} exited {rc}")
    return json.loads(buf.getvalue())


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    args = ap.parse_args(argv)
    comp = Composer(args.profiles)
    cases: list[tuple[str, tuple[int, int] | None, int | None]] = []
    for ctx, label in ((2176, "2k"), (12288, "12k")):
        for b in (1, 8, 32):
            cases.append((f"decode B={b} @ {label}", (b, ctx), None))
    for chunk in (512, 2048, 8192):
        cases.append((f"decode 32 @ 12k + chunk {chunk}", (32, 12288), chunk))
    print("# agentflow simulate step (A100-80G, Llama-3.1-8B, TP1) vs Vidur-composed rows, ms")
    print(f"{'step':30} {'measured':>9} {'sim layers':>10} {'ratio':>6}   "
          f"{'with quirk':>10} {'ratio':>6}   {'sim step_ms':>11}")
    ratios = []
    sims: dict[str, float] = {}
    meas: dict[str, float] = {}
    for name, dec, chunk in cases:
        m = comp.step_ms(dec, chunk)
        mq = comp.step_ms(dec, chunk, quirk=True)
        s = simulate_step(dec, chunk)
        r = s["layers_ms"] / m
        ratios.append(r)
        sims[name], meas[name] = s["step_ms"], m
        flag = "" if LO <= r <= HI else "  <-- outside 0.85-1.15"
        print(f"{name:30} {m:9.2f} {s['layers_ms']:10.2f} {r:6.3f}   {mq:10.2f} "
              f"{s['layers_ms'] / mq:6.3f}   {s['step_ms']:11.2f}{flag}")
    print(f"ratios: min {min(ratios):.3f} max {max(ratios):.3f}; "
          f"{sum(LO <= r <= HI for r in ratios)}/{len(ratios)} within {LO}-{HI}")
    g_sim = sims["decode B=32 @ 12k"] - sims["decode B=1 @ 12k"]
    g_meas = meas["decode B=32 @ 12k"] - meas["decode B=1 @ 12k"]
    print(f"decode step growth B=1 -> 32 at 12k: sim +{g_sim:.1f} ms, measured "
          f"+{g_meas:.1f} ms, ratio {g_sim / g_meas:.3f}")
    for chunk in (512, 2048, 8192):
        key = f"decode 32 @ 12k + chunk {chunk}"
        print(f"stall a {chunk}-token chunk adds to 32 decodes at 12k: sim "
              f"+{sims[key] - sims['decode B=32 @ 12k']:.1f} ms, measured "
              f"+{meas[key] - meas['decode B=32 @ 12k']:.1f} ms")


if __name__ == "__main__":
    main()
