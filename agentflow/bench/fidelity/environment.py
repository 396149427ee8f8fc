"""How quiet the machine was while real_vs_sim's real replay ran.

Why: on a small CPU host the engines share cores and caches with everything else, and a
server that got all of its core's time (share 0.99) can still run 10-15% slower when other
processes thrash the caches between its turns (seen on this project's 2-core VM: the same
calls alone on a server took 1.00x the calibrated time in one run and 1.12x in the next).
So each run says how much CPU went to processes other than the engines and this driver,
and the load average over the run, beside its errors.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path


def machine_busy_s() -> float | None:
    """CPU seconds all CPUs spent not idle since boot (``/proc/stat``), or None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(v) for v in fields[:8]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load_1m() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Quietness:
    """Start with ``begin``, sample the load with ``sample``, close with ``end``."""

    wall0: float = 0.0
    busy0: float | None = None
    own0: float = 0.0
    loads: list[float] = field(default_factory=list)
    result: dict[str, float] = field(default_factory=dict)

    def begin(self) -> None:
        self.wall0, self.busy0, self.own0 = time.perf_counter(), machine_busy_s(), own_cpu_s()
        self.sample()

    def sample(self) -> None:
        value = load_1m()
        if value is not None:
            self.loads.append(value)

    def end(self, engines_cpu_s: float | None) -> dict[str, float]:
        """Figures over the run; ``engines_cpu_s``: what the engine processes used."""
        self.sample()
        wall = time.perf_counter() - self.wall0
        busy = machine_busy_s()
        out = {"wall_s": wall, "driver_cpu_s": own_cpu_s() - self.own0,
               "cpus": float(os.cpu_count() or 1)}
        if busy is not None and self.busy0 is not None:
            out["machine_busy_s"] = busy - self.busy0
            if engines_cpu_s is not None:
                out["engines_cpu_s"] = engines_cpu_s
                out["others_cpu_s"] = max(0.0, out["machine_busy_s"] - engines_cpu_s
                                          - out["driver_cpu_s"])
        if self.loads:
            out["load_min"], out["load_max"] = min(self.loads), max(self.loads)
        self.result = out
        return out

    def line(self) -> str:
        r = self.result
        text = (f"machine during the real replay: driver {r['driver_cpu_s']:.1f} core-s")
        if "others_cpu_s" in r:
            text += (f", other processes {r['others_cpu_s']:.1f} core-s "
                     f"({r['others_cpu_s'] / (r['wall_s'] * r['cpus']) * 100:.1f}% of "
                     f"{r['cpus']:.0f} CPUs)")
        if "load_min" in r:
            text += f", load average {r['load_min']:.2f}-{r['load_max']:.2f}"
        return text
