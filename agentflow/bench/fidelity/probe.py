"""How fast each real engine is right now, against the profile, from single requests.

Why: the hardware profile was calibrated once; the machine the replay runs on may not be as
fast at the moment (on this project's 2-core VM, calls alone on a server ran 1.00x their
calibrated time in one replay and 1.3x in another while other jobs ran, though the servers got
0.97 of their cores: the other jobs evict the weights from the shared caches). A few single
requests per instance just before and just after the replay, timed as the caller sees them
and simulated alone on the profile, say how far the machine was from its calibration over
the run, without looking at the replay itself. They also warm each server before the first
arrival (its first requests are not the replay's).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from agentflow.sim.engine import SimInstance

# (prompt, output) tokens: a short and a long prompt, a few decode steps each
PROBE_SHAPES = ((256, 8), (768, 8))


def simulated_alone(engine: SimInstance, prompt: int, output: int) -> float:
    """Latency of one request alone on a fresh simulated engine."""
    engine.add("probe", prompt, output, 0, 0.0)
    end = 0.0
    while (t := engine.next_event_time()) is not None:
        for ev in engine.step_until(t):
            if ev.kind == "finished":
                end = ev.time
    return end


async def probe(backends: dict[str, Any], make_prompt: Callable[[int], str],
                fresh_engine: Callable[[str], SimInstance]) -> dict[str, float]:
    """Per instance, real / simulated time of ``PROBE_SHAPES`` run one at a time (the
    instances in parallel: each has its own core)."""
    from agentflow.llm.base import LLMRequest, SamplingParams

    async def one_instance(name: str) -> float:
        real = sim = 0.0
        for p, o in PROBE_SHAPES:
            request = LLMRequest(prompt=make_prompt(p), params=SamplingParams(
                max_tokens=o, temperature=0.0), stage="probe")
            t = time.perf_counter()
            result = await backends[name].generate(request)
            real += time.perf_counter() - t
            sim += simulated_alone(fresh_engine(name), result.prompt_tokens, o)
        return real / sim

    names = list(backends)
    factors = await asyncio.gather(*(one_instance(n) for n in names))
    return dict(zip(names, factors, strict=True))
