"""A host's local engines priced together: alone, a core does its work at another cost.

Why: on a CPU host the local instances (``llama_server`` backends, one pinned to each core)
share the last-level cache and the memory bus, so the CPU seconds a unit of work costs on
one core depend on whether its neighbours are busy. ``agentflow calibrate`` fits the host
profile with every local instance busy at once (as they serve), so the profile's constants
are prices *beside busy neighbours*; it then times a fixed probe on each instance alone and
beside its busy neighbours and stores the ratio, ``GPUProfile.cpu_alone_factor``
(``host_calibration.measure_corun``). A replay whose neighbours are often idle (a quiet
machine, where only the replay's servers run) is priced at the profile's constants only
while another local engine is busy, and at ``cpu_alone_factor`` times them while none is.

``CoRun.update(now)`` is called by whoever advances the engines (``real_vs_sim``'s replay)
after every change that can start or end an engine's work (a call added, events stepped):
an engine whose neighbours went from busy to idle or back gets its new factor from the
iteration after the one in flight (``SimInstance.set_slowdown``), on top of the slowdown
it already had. Engines whose profile's factor is 1 (every stored profile, every GPU) are
never touched, so a cluster without a measured factor replays exactly as before.

``background``: the share of the machine that other processes kept busy while the real side
ran (``bench.fidelity.environment``): a core beside another process's work is not alone
either, so the factor applies only to the rest, ``1 + (f - 1) * (1 - background)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class _Engine(Protocol):
    """What ``CoRun`` reads and sets on an engine (``agentflow.sim.engine.SimInstance``)."""

    slowdown: float

    @property
    def idle(self) -> bool: ...

    @property
    def gpu(self): ...  # noqa: ANN201 (a hardware.GPUProfile)

    def set_slowdown(self, factor: float, now: float) -> None: ...


def alone_factor(engine: _Engine, background: float = 0.0) -> float:
    """The factor an engine's iterations take while no other local engine is busy."""
    if not 0.0 <= background <= 1.0:
        raise ValueError(f"background share must be in [0, 1]: {background}")
    f = float(getattr(engine.gpu, "cpu_alone_factor", 1.0))
    if not f > 0:
        raise ValueError(f"cpu_alone_factor must be positive: {f}")
    return 1.0 + (f - 1.0) * (1.0 - background)


class CoRun:
    """The local engines of one host, each priced at its alone factor while the others are
    idle. Build it once the engines' own slowdowns are set (they are kept as the base)."""

    def __init__(self, engines: Mapping[str, _Engine], background: float = 0.0):
        self._engines = dict(engines)
        self._factor = {n: alone_factor(e, background) for n, e in self._engines.items()}
        self._base = {n: float(e.slowdown) for n, e in self._engines.items()}
        # Whether each engine is now priced alone (None: not yet decided)
        self._alone: dict[str, bool | None] = {n: None for n in self._engines}
        self.active = len(self._engines) > 1 and any(f != 1.0 for f in self._factor.values())
        self.switches = 0  # factor changes applied (a run that never switches priced nothing)
        # Seconds each engine's iterations ran while priced alone, summed at each switch
        # from its busy seconds (``SimInstance.busy_s``): what the factor touched
        self._alone_since: dict[str, float] = {}
        self.alone_busy_s: dict[str, float] = {n: 0.0 for n in self._engines}

    def factors(self) -> dict[str, float]:
        return dict(self._factor)

    def update(self, now: float) -> None:
        """Re-price every engine whose neighbours went from busy to idle or back."""
        if not self.active:
            return
        busy = {n: not e.idle for n, e in self._engines.items()}
        n_busy = sum(busy.values())
        for n, e in self._engines.items():
            alone = n_busy - busy[n] == 0
            if alone == self._alone[n]:
                continue
            self._alone[n] = alone
            if self._factor[n] == 1.0:
                continue
            e.set_slowdown(self._base[n] * (self._factor[n] if alone else 1.0), now)
            self.switches += 1
            busy_s = float(getattr(e, "busy_s", 0.0))
            if alone:
                self._alone_since[n] = busy_s
            elif n in self._alone_since:
                self.alone_busy_s[n] += busy_s - self._alone_since.pop(n)

    def finish(self) -> dict[str, float]:
        """At the end of a replay: per engine, the busy seconds it ran priced alone."""
        for n, start in list(self._alone_since.items()):
            self.alone_busy_s[n] += float(getattr(self._engines[n], "busy_s", 0.0)) - start
            del self._alone_since[n]
        return dict(self.alone_busy_s)
