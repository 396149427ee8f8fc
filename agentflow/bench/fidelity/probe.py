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


# --------------------------------------------------------------- load matching (CPU clock)
async def speed_probes(backends: dict[str, Any], make_prompt: Callable[[int], str]
                       ) -> dict[str, float]:
    """Per instance with a CPU clock, the server CPU seconds of ``host_calibration.
    SPEED_PROBE`` (the instances in parallel: each has its own core)."""
    from agentflow.sim.host_calibration import speed_probe

    names = list(backends)
    got = await asyncio.gather(*(speed_probe(backends[n], make_prompt) for n in names))
    return {n: v for n, v in zip(names, got, strict=True) if v is not None}


def speed_references(cluster_path: str) -> dict[str, float]:
    """Per local instance whose host profile stored a speed probe of today's shapes: its CPU
    seconds at calibration, the speed its simulated engine is priced at (the median of the
    instance's own probes over every try, ``HostProfile.instance_reference``; stores
    written before those: the fitted rows' probe)."""
    from agentflow.sim import host_profiles
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.host_calibration import SPEED_PROBE

    out = {}
    for name, cfg in load_cluster(cluster_path).expanded():
        if (cfg.backend or {}).get("type") != "llama_server":
            continue
        entry = host_profiles.lookup(str(cfg.gpu), str(cfg.model))
        ref = entry.instance_reference(name, SPEED_PROBE) if entry is not None else None
        if ref is not None:
            out[name] = ref
    return out


def load_factors(before: dict[str, float], after: dict[str, float],
                 references: dict[str, float]) -> dict[str, float]:
    """Per instance, the CPU seconds the same work cost around the replay over what it cost
    at calibration: the mean of the probes before and after over the stored one."""
    return {n: (before[n] + after[n]) / 2 / references[n]
            for n in references if n in before and n in after and references[n] > 0}


def load_matched(sim_busy: dict[str, float], real_cpu: dict[str, float],
                 factors: dict[str, float]) -> dict[str, float]:
    """Engine work sim/real with the real CPU seconds taken back to the calibration's
    load: simulated busy seconds x the load factor over the server's CPU seconds."""
    return {n: sim_busy[n] * factors[n] / real_cpu[n] for n in factors
            if real_cpu.get(n) and n in sim_busy}


def load_matched_line(matched: dict[str, float], factors: dict[str, float]) -> str:
    return ("engine work sim/real, load-matched per instance: "
            + ", ".join(f"{v:.3f}" for v in matched.values()) + f" ({', '.join(matched)}; "
            "the speed probe's CPU per work around the replay x"
            + ", x".join(f"{factors[n]:.3f}" for n in matched) + " the calibration's)")


# --------------------------------------------------------------- the headline's pricing
# How much of the speed the probe found just before a replay the headline prices in. The
# replay's own speed is unknown when it starts (nothing measured during or after it may
# price the headline); two estimates of it are at hand: the instance's typical speed over
# its calibration (``speed_references``: a median of ~15 probes over minutes) and the probe
# just before (one ~3 CPU-s sample of the phase the machine is in). On this project's VM the
# speed moves ~20% within minutes and a quick replay lasts 2-3: the probes just before and
# just after one replay correlate ~0.4, so the phase at the start only partly holds over the
# replay. Neither estimate is known to be the better, so each weighs the same.
BEFORE_WEIGHT = 0.5


def predicted_factors(before: dict[str, float], references: dict[str, float],
                      weight: float = BEFORE_WEIGHT) -> dict[str, float]:
    """Per instance with a reference and a probe before the replay: the factor its
    simulated engine (priced at the reference) is slowed by for the headline, the
    predicted probe CPU-s (``weight`` x the probe before + the rest x the reference) over
    the reference."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"the probe's weight must be in [0, 1]: {weight}")
    out = {}
    for n, ref in references.items():
        if n in before and ref > 0 and before[n] > 0:
            out[n] = (weight * before[n] + (1.0 - weight) * ref) / ref
    return out


def instance_priced(engines: dict[str, SimInstance]) -> bool:
    """Whether any engine is priced at its instance's own speed (``GPUProfile.
    cpu_instance_speed``, from a host profile that kept its probes)."""
    return any(n in dict(e.gpu.cpu_instance_speed) for n, e in engines.items())


def pricing_note(factors: dict[str, float], typical: bool) -> str:
    """What the headline's engine work is priced at, for its line: ``factors`` from
    ``predicted_factors`` (empty: no probe before the replay); ``typical``: the engines
    are priced at each instance's typical speed (``instance_priced``)."""
    speed = "each instance's typical calibration speed" if typical else \
        "the profile's constants"
    if factors:
        return (f"priced at the mean of {speed} and the speed probe just before the replay: "
                "x" + ", x".join(f"{factors[n]:.3f}" for n in factors) + " the former")
    return f"priced at {speed}, no probe before the replay"
