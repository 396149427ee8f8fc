"""The machine's speed just before a replay, fitted from lone requests (``real_vs_sim.py
--calibrate-first``).

Why: the CPU profile (``Xeon-core``) is a calibration stored once, and this project's VM runs
1.0-1.4x slower or faster from one hour to the next, so a replay's error mixes the engine
model with the minute it ran in. The GPU profiles are calibrated from single requests; the
same can be done for the machine at hand, right before the replay, on the servers the replay
then uses. Nothing here sees the replay's timings: it runs before the first arrival.

What it measures: on every instance at once (each server has its own core, and during the
replay both cores are busy, so both run here too), a few requests one at a time per
instance, of the workload's own call shapes (token counts, known before the replay: the
median prompt and output of each quarter of its calls sorted by prompt length, quarters of
equal simulated time on the stored profile), timed as the caller sees them (submit to first
token, submit to last token).

What it fits, per instance: three numbers on top of the stored profile, by least squares of
the simulated single-request times (relative error of the time to first token and of the
decode time): the core's compute speed (``peak_tflops``), its memory speed
(``mem_bw_gbs``) and the caller-side cost of one request (``request_overhead_s``: HTTP,
tokenisation, streaming). Every efficiency and the batching physics stay the stored
profile's: the pass says how fast this machine is now, not how the engine batches, which is
what the replay then checks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from agentflow import hardware

SPEED_FIELDS = ("peak_tflops", "mem_bw_gbs", "request_overhead_s")
# One row: (prompt tokens as served, output tokens, time to first token s, total s)
Row = tuple[int, int, float, float]
Simulate = Callable[[hardware.GPUProfile, int, int], tuple[float, float]]


def workload_shapes(shapes: Sequence[tuple[int, int]], weights: Sequence[float],
                    groups: int = 4) -> list[tuple[int, int]]:
    """``groups`` (prompt, output) shapes that stand for a workload's calls: its calls sorted
    by prompt length, cut into groups of equal total weight (each call's ``weights``: its
    time alone on the stored profile, so the calls that carry the time are represented, not
    the many one-token ones), each group's median prompt and output."""
    if not shapes or len(shapes) != len(weights):
        raise ValueError("need one weight per call, and at least one call")
    order = sorted(range(len(shapes)), key=lambda i: shapes[i])
    cum = np.cumsum([max(float(weights[i]), 0.0) for i in order])
    total = cum[-1] if cum[-1] > 0 else 1.0
    group = np.minimum((cum - 1e-12 * total) / total * groups, groups - 1).astype(int)
    out: list[tuple[int, int]] = []
    for g in range(groups):
        part = np.asarray([shapes[order[k]] for k in range(len(order)) if group[k] == g])
        if not len(part):
            continue
        shape = (int(np.median(part[:, 0])), max(1, int(np.median(part[:, 1]))))
        if shape not in out:
            out.append(shape)
    return out


async def measure_lone(backends: dict[str, Any], make_prompt: Callable[[int], str],
                       shapes: Sequence[tuple[int, int]], repeats: int) -> dict[str, list[Row]]:
    """Per instance, its rows: ``shapes`` x ``repeats``, one request at a time per instance,
    every instance at once."""
    from agentflow.llm.base import LLMRequest, SamplingParams

    async def one_instance(name: str) -> list[Row]:
        rows: list[Row] = []
        for _ in range(repeats):
            for p, o in shapes:
                request = LLMRequest(prompt=make_prompt(p), params=SamplingParams(
                    max_tokens=o, temperature=0.0), stage="calibrate-first")
                t = time.perf_counter()
                result = await backends[name].generate(request)
                total = time.perf_counter() - t
                rows.append((int(result.prompt_tokens), o, float(result.ttft_s), total))
        return rows

    names = list(backends)
    found = await asyncio.gather(*(one_instance(n) for n in names))
    return dict(zip(names, found, strict=True))


def residuals(g: hardware.GPUProfile, rows: Sequence[Row], simulate: Simulate) -> np.ndarray:
    """Relative errors of each row's time to first token and (output > 1) decode time."""
    out = []
    for p, o, ttft, total in rows:
        s_ttft, s_total = simulate(g, p, o)
        out.append((s_ttft - ttft) / ttft)
        if o > 1 and total > ttft:
            out.append(((s_total - s_ttft) - (total - ttft)) / (total - ttft))
    return np.asarray(out)


def fit_speed(rows: Sequence[Row], base: hardware.GPUProfile, simulate: Simulate
              ) -> tuple[hardware.GPUProfile, float, float]:
    """``base`` with ``SPEED_FIELDS`` fitted to ``rows``; with the median |relative error|
    of the rows' times under ``base`` and under the fit."""
    from scipy.optimize import least_squares

    if not rows:
        raise ValueError("no calibration rows to fit")

    def profile(x: np.ndarray) -> hardware.GPUProfile:
        return replace(base, **dict(zip(SPEED_FIELDS, np.exp(x).tolist(), strict=True)))


    x0 = np.log([max(getattr(base, f), 1e-4) for f in SPEED_FIELDS])
    # speeds within 4x of the stored profile either way; the overhead up to 1 s
    lo = np.asarray([x0[i] - np.log(4.0) if f != "request_overhead_s" else np.log(1e-6)
                     for i, f in enumerate(SPEED_FIELDS)])
    hi = np.asarray([x0[i] + np.log(4.0) if f != "request_overhead_s" else 0.0
                     for i, f in enumerate(SPEED_FIELDS)])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)
    fit = least_squares(lambda x: residuals(profile(x), rows, simulate), x0,
                        bounds=(lo, hi), diff_step=1e-3)
    before = float(np.median(np.abs(residuals(base, rows, simulate))))
    after = float(np.median(np.abs(residuals(profile(fit.x), rows, simulate))))
    return profile(fit.x), before, after


def describe(base: hardware.GPUProfile, fitted: hardware.GPUProfile) -> str:
    """The fitted speeds as multiples of the stored ones, and the overhead in ms."""
    return (f"compute x{fitted.peak_tflops / base.peak_tflops:.3f}, memory "
            f"x{fitted.mem_bw_gbs / base.mem_bw_gbs:.3f}, request overhead "
            f"{fitted.request_overhead_s * 1e3:.1f} ms")
