"""The machine's speed during a replay, from the replay's own calls that ran alone.

Why: this project's VM changes speed by 1.0-1.4x within an hour, so a real/sim error mixes
the engine model with the minute the replay ran in. Probes before and after a replay miss
what happens during it, and a third server for probes interleaved with the replay would
take a core the two servers need. What the replay itself offers: calls that ran alone on
their server from submit to finish. For those, llama-server's own ``timings`` (prompt and
decode milliseconds, no HTTP) against the simulator's time for the same call alone on a
fresh engine is the machine factor at that minute, and it says nothing about batching, the
part of the physics the replay is there to check.

Definition (fixed before the 30-query run was looked at; printed beside the raw figure,
which stays the headline): per instance, the factor is the sum over its lone calls of their
latency as the caller saw it (submit to last token, what the profile was calibrated on)
over the sum of their simulated latencies alone on a fresh engine; the simulated replay is
re-run with each instance's engine slowed by its factor (``SimInstance.slowdown``; an
instance with no lone call gets the median of the others, none at all: no figure). The lone
calls' own errors shrink by construction, so the normalised errors are also printed over the
calls that shared their server at some point (the ones that test batching).

A first definition took the median per call of llama-server's
own ``prompt_ms + predicted_ms`` over the simulated time. On an 8-query ``--quick`` run it
read 0.77-0.82 where the probes read 0.87-1.04: most lone calls are 27-31-token prompts with
one output token, where the profile is ~20% slow (a shape error on tiny calls, not the
machine), and the engine's timings leave out the caller-side milliseconds the profile
prices. A median of ratios lets those calls set the factor; a ratio of sums lets the calls
that carry the time set it, as the probes' 256- and 768-token shapes do.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from agentflow.bench.fidelity.attribution import calls_by_instance
from agentflow.bench.fidelity.probe import simulated_alone
from agentflow.sim.engine import SimInstance


def lone_calls(submit: dict[str, float], finish: dict[str, float],
               instance_of: dict[str, str]) -> set[str]:
    """Calls no other call on their instance overlapped (in flight from submit to finish)."""
    alone = set()
    for ids in calls_by_instance(instance_of).values():
        for cid in ids:
            a, b = submit[cid], finish[cid]
            if not any(o != cid and submit[o] < b and a < finish[o] for o in ids):
                alone.add(cid)
    return alone


def machine_factors(alone: set[str], instance_of: dict[str, str],
                    latency: dict[str, float], tokens: dict[str, tuple[int, int]],
                    fresh_engine: Callable[[str], SimInstance]
                    ) -> dict[str, list[tuple[str, float, float]]]:
    """Per instance, ``(call, real latency s, simulated s alone)`` of its lone calls;
    ``tokens`` is each call's (prompt as served, output)."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for cid in sorted(alone):
        inst = instance_of[cid]
        sim = simulated_alone(fresh_engine(inst), *tokens[cid])
        if latency[cid] > 0 and sim > 0:
            out.setdefault(inst, []).append((cid, latency[cid], sim))
    return out


def instance_slowdowns(factors: dict[str, list[tuple[str, float, float]]],
                       instances: list[str]) -> dict[str, float] | None:
    """Each instance's sum of real over sum of simulated lone latencies (others' median
    where it has none); None when no instance has a lone call."""
    ratios = {n: sum(r for _, r, _ in fs) / sum(s for _, _, s in fs)
              for n, fs in factors.items() if fs}
    if not ratios:
        return None
    fallback = float(np.median(list(ratios.values())))
    return {n: ratios.get(n, fallback) for n in instances}
