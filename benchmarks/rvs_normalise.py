"""The machine's speed during a replay, from the replay's own calls that ran alone.

Why: this project's VM changes speed by 1.0-1.4x within an hour, so a real/sim error mixes
the engine model with the minute the replay ran in. Probes before and after a replay miss
what happens during it, and a third server for probes interleaved with the replay would
take a core the two servers need. What the replay itself offers: calls that ran alone on
their server from submit to finish. For those, llama-server's own ``timings`` (prompt and
decode milliseconds, no HTTP) against the simulator's time for the same call alone on a
fresh engine is the machine factor at that minute, and it says nothing about batching, the
part of the physics the replay is there to check.

Definition (fixed before any result was looked at, and printed beside the raw figure, which
stays the headline): per instance, the factor is the median over its lone calls of
``(prompt_ms + predicted_ms) / simulated latency alone``; the simulated replay is re-run
with each instance's engine slowed by its factor (``SimInstance.slowdown``; an instance
with no lone call gets the median of the others, none at all: no figure). The lone calls'
own errors shrink by construction, so the normalised errors are also printed over the
calls that shared their server at some point (the ones that test batching).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from rvs_probe import simulated_alone

from agentflow.sim.engine import SimInstance


def lone_calls(submit: dict[str, float], finish: dict[str, float],
               instance_of: dict[str, str]) -> set[str]:
    """Calls no other call on their instance overlapped (in flight from submit to finish)."""
    by_instance: dict[str, list[str]] = {}
    for cid, inst in instance_of.items():
        by_instance.setdefault(inst, []).append(cid)
    alone = set()
    for ids in by_instance.values():
        for cid in ids:
            a, b = submit[cid], finish[cid]
            if not any(o != cid and submit[o] < b and a < finish[o] for o in ids):
                alone.add(cid)
    return alone


def machine_factors(alone: set[str], instance_of: dict[str, str],
                    timings: dict[str, dict[str, Any] | None],
                    tokens: dict[str, tuple[int, int]],
                    fresh_engine: Callable[[str], SimInstance]
                    ) -> dict[str, list[tuple[str, float]]]:
    """Per instance, ``(call, real engine s / simulated s alone)`` of its lone calls that
    carry llama-server timings; ``tokens`` is each call's (prompt as served, output)."""
    out: dict[str, list[tuple[str, float]]] = {}
    for cid in sorted(alone):
        t = timings.get(cid)
        if not t or "prompt_ms" not in t or "predicted_ms" not in t:
            continue
        real = (float(t["prompt_ms"]) + float(t["predicted_ms"])) / 1000
        inst = instance_of[cid]
        sim = simulated_alone(fresh_engine(inst), *tokens[cid])
        if real > 0 and sim > 0:
            out.setdefault(inst, []).append((cid, real / sim))
    return out


def instance_slowdowns(factors: dict[str, list[tuple[str, float]]],
                       instances: list[str]) -> dict[str, float] | None:
    """The median factor of each instance (others' median where it has none); None when
    no instance has a lone call."""
    medians = {n: float(np.median([f for _, f in fs])) for n, fs in factors.items() if fs}
    if not medians:
        return None
    fallback = float(np.median(list(medians.values())))
    return {n: medians.get(n, fallback) for n in instances}
