"""`agentflow simulate step` against measured A100 operator times composed the Vidur way.

    agentflow bench step_vs_profiles [--profiles ../shared/profiles/vidur-a100] [--all]

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

``hardware.OPERATOR_FIT`` is fitted on alternate rows (``fit_operators.halves``); each case
says which half its attention row is in ("fit" / "held"; linear layers: the token count's).
Groups of cases, every ratio sim / measured to be within 0.90-1.10:

* decode steps: every profiled decode row (B = 1-448, contexts 1.3k-12k);
* chunks with cached context: every profiled prefill chunk of >= 896 tokens after cached
  tokens, alone, and three beside decodes (1,024 after 4,096 cached beside 16 decodes at
  2k and at 12k; 2,048 after 8,192 beside 32 at 12k);
* linear layers at T = 64-512 tokens (the GEMMs' knee): GEMMs + element-wise + the KV
  write's fixed part, against the model's linear + element-wise operators;
* the earlier nine (decode B = 1 / 8 / 32 at 2k and 12k; 32 decodes at 12k beside a chunk
  of 512 / 2,048 / 8,192 tokens without cached context).

Last, the growth of a decode step from B = 1 to B = 32 at 12k (what a dispatcher learns per
co-runner) and the stall a chunk adds to 32 decodes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentflow.bench.fidelity.fit_operators import (
    DEFAULT_PROFILES,
    ELEMENTWISE,
    GEMMS,
    halves,
    load_decode,
    load_mlp,
    load_prefill,
)
from agentflow.cli.main import main as agentflow_main

LAYERS = 32  # Llama-3-8B
LO, HI = 0.90, 1.10


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
                quirk: bool = False, cached: int = 0) -> float:
        T = (decode[0] if decode else 0) + (chunk or 0)
        layer = self.tokenwise_ms(T) + self.kv_save_ms(T, quirk)
        if decode:
            layer += self.decode_ms(*decode)
        if chunk:
            layer += self.prefill_ms(chunk, cached)
        return layer * LAYERS

    def linear_ms(self, T: int) -> float:
        """The token-wise operators at ``T`` tokens and the KV write's fixed part."""
        return (self.tokenwise_ms(T) + self.save_fixed) * LAYERS


def simulate_step(decode: tuple[int, int] | None, chunk: int | None,
                  cached: int = 0) -> dict:
    """``agentflow simulate step ... --json``, run in-process."""
    argv = ["simulate", "step", "--gpu", "A100-80G", "--model", "Llama-3.1-8B", "--tp", "1",
            "--json"]
    if decode:
        argv += ["--decode", f"{decode[0]}:{decode[1]}"]
    if chunk:
        argv += ["--prefill", f"{chunk}:{cached}"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = agentflow_main(argv)
    if rc:
        raise RuntimeError(f"agentflow {' '.join(argv)} exited {rc}")
    return json.loads(buf.getvalue())


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    group: str
    name: str
    half: str  # "fit" / "held": the half of the rows its attention (or T) is in
    measured: float  # ms, layers
    quirk: float  # ms, layers, with Vidur's KV write as profiled
    sim_layers: float
    sim_step: float

    @property
    def ratio(self) -> float:
        return self.sim_layers / self.measured


def cases(comp: Composer, profiles: Path) -> list[Case]:
    fit_half, _ = halves(profiles)
    fit_dec = {(c, b) for c, b, _ in fit_half.decode}
    fit_pre = {(n, c) for n, c, _, _ in fit_half.prefill}
    out: list[Case] = []

    def add(group, name, half, dec, chunk, cached=0):
        s = simulate_step(dec, chunk, cached)
        out.append(Case(group, name, half, comp.step_ms(dec, chunk, cached=cached),
                        comp.step_ms(dec, chunk, quirk=True, cached=cached),
                        s["layers_ms"], s["step_ms"]))

    for ctx, b in sorted(comp.decode):
        add("decode", f"decode B={b} @ {ctx}", "fit" if (ctx, b) in fit_dec else "held",
            (b, ctx), None)
    for n, c, _, _ in sorted(comp.prefill):
        if n >= 896 and c > 0:
            add("cached chunk", f"chunk {n} after {c}", "fit" if (n, c) in fit_pre else "held",
                None, n, c)
    for dec, n, c in (((16, 2176), 1024, 4096), ((16, 12288), 1024, 4096),
                      ((32, 12288), 2048, 8192)):
        half = "fit" if (n, c) in fit_pre else "held"
        add("cached chunk", f"chunk {n} after {c} + {dec[0]} @ {dec[1]}", half, dec, n, c)
    for T in comp.T:
        T = int(T)
        if 64 <= T <= 512:
            ops = simulate_step(None, T)["operators_ms"]
            sim = ops["linear"] + ops["elementwise"]
            m = comp.linear_ms(T)
            out.append(Case("linear T=64-512", f"linear layers T={T}",
                            "fit" if T in fit_half.mlp else "held", m, m, sim, sim))
    for ctx, label in ((2176, "2k"), (12288, "12k")):
        for b in (1, 8, 32):
            add("earlier nine", f"decode B={b} @ {label}", "-", (b, ctx), None)
    for chunk in (512, 2048, 8192):
        add("earlier nine", f"decode 32 @ 12k + chunk {chunk}", "-", (32, 12288), chunk)
    return out


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", type=Path, default=DEFAULT_PROFILES)
    ap.add_argument("--all", action="store_true", help="print every case, not only those "
                    "outside the target and each group's extremes")
    args = ap.parse_args(argv)
    comp = Composer(args.profiles)
    all_cases = cases(comp, args.profiles)
    print("# agentflow simulate step (A100-80G, Llama-3.1-8B, TP1) vs Vidur-composed rows, ms")
    print(f"{'step':40} {'half':>4} {'measured':>9} {'sim layers':>10} {'ratio':>6}   "
          f"{'with quirk':>10} {'ratio':>6}   {'sim step_ms':>11}")
    groups = list(dict.fromkeys(c.group for c in all_cases))
    for g in groups:
        gc = [c for c in all_cases if c.group == g]
        rs = [c.ratio for c in gc]
        lo, hi = min(gc, key=lambda c: c.ratio), max(gc, key=lambda c: c.ratio)
        print(f"## {g}: {len(gc)} cases, ratio min {lo.ratio:.3f} median "
              f"{float(np.median(rs)):.3f} max {hi.ratio:.3f}; "
              f"{sum(LO <= r <= HI for r in rs)}/{len(rs)} within {LO:.2f}-{HI:.2f}")
        for c in gc:
            out = not LO <= c.ratio <= HI
            if args.all or out or c in (lo, hi) or g == "earlier nine":
                flag = f"  <-- outside {LO:.2f}-{HI:.2f}" if out else ""
                print(f"{c.name:40} {c.half:>4} {c.measured:9.2f} {c.sim_layers:10.2f} "
                      f"{c.ratio:6.3f}   {c.quirk:10.2f} {c.sim_layers / c.quirk:6.3f}   "
                      f"{c.sim_step:11.2f}{flag}")
    rs = [c.ratio for c in all_cases]
    held = [c.ratio for c in all_cases if c.half == "held"]
    print(f"all {len(rs)} ratios: min {min(rs):.3f} max {max(rs):.3f}; "
          f"{sum(LO <= r <= HI for r in rs)}/{len(rs)} within {LO:.2f}-{HI:.2f}; held-out "
          f"rows {sum(LO <= r <= HI for r in held)}/{len(held)}")
    by = {c.name: c for c in all_cases if c.group == "earlier nine"}
    g_sim = by["decode B=32 @ 12k"].sim_step - by["decode B=1 @ 12k"].sim_step
    g_meas = by["decode B=32 @ 12k"].measured - by["decode B=1 @ 12k"].measured
    print(f"decode step growth B=1 -> 32 at 12k: sim +{g_sim:.1f} ms, measured "
          f"+{g_meas:.1f} ms, ratio {g_sim / g_meas:.3f}")
    base = by["decode B=32 @ 12k"]
    for chunk in (512, 2048, 8192):
        c = by[f"decode 32 @ 12k + chunk {chunk}"]
        print(f"stall a {chunk}-token chunk adds to 32 decodes at 12k: sim "
              f"+{c.sim_step - base.sim_step:.1f} ms, measured "
              f"+{c.measured - base.measured:.1f} ms")


if __name__ == "__main__":
    main()
