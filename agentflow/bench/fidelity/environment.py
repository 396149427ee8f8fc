"""How quiet the machine was while real_vs_sim's real replay ran.

Why: on a small CPU host the engines share cores and caches with everything else, and a
server that got all of its core's time (share 0.99) can still run 10-15% slower when other
processes thrash the caches between its turns (seen on this project's 2-core VM: the same
calls alone on a server took 1.00x the calibrated time in one run and 1.12x in the next).
So each run says how much CPU went to processes other than the engines and this driver,
the load average over the run, and the hypervisor's steal time, beside its errors.

Steal is kept apart from "other processes": on a VM it is time the host gave this vCPU's
physical core to someone else, and it comes with a neighbour on the core's caches and
memory bus that no process list inside the VM shows (on this project's EPYC VM the same
replay's engines took 1.29-1.41x the CPU seconds at 22:50 than at 01:06, at load 1-3 both
times; the first runs' "other processes", steal included, were 11.6-25.3 core-s, the
second's 0.4-1.0).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path


def cpu_times(stat_text: str, ticks_per_s: float) -> tuple[float, float]:
    """(busy, steal) CPU seconds of all CPUs from ``/proc/stat``'s text. Busy is user,
    nice, system, irq and softirq (work done inside this machine); steal (the 8th field)
    is time the hypervisor ran something else on the vCPUs' cores."""
    lines = stat_text.splitlines()
    fields = lines[0].split() if lines else []
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        raise ValueError(f"not /proc/stat's aggregate cpu line: {stat_text[:60]!r}")
    ticks = [int(v) for v in fields[1:9]]
    steal = ticks[7] if len(ticks) > 7 else 0
    busy = sum(ticks[:7]) - ticks[3] - ticks[4]  # less idle and iowait
    return busy / ticks_per_s, steal / ticks_per_s


def _proc_stat() -> tuple[float, float] | None:
    try:
        return cpu_times(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def machine_busy_s() -> float | None:
    """CPU seconds all CPUs spent working since boot (``/proc/stat``, steal not counted),
    or None."""
    got = _proc_stat()
    return got[0] if got is not None else None


def steal_s() -> float | None:
    """CPU seconds the hypervisor has stolen from all vCPUs since boot, or None."""
    got = _proc_stat()
    return got[1] if got is not None else None


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
    steal0: float | None = None
    own0: float = 0.0
    loads: list[float] = field(default_factory=list)
    result: dict[str, float] = field(default_factory=dict)

    def begin(self) -> None:
        self.wall0, self.busy0, self.own0 = time.perf_counter(), machine_busy_s(), own_cpu_s()
        self.steal0 = steal_s()
        self.sample()

    def sample(self) -> None:
        value = load_1m()
        if value is not None:
            self.loads.append(value)

    def end(self, engines_cpu_s: float | None) -> dict[str, float]:
        """Figures over the run; ``engines_cpu_s``: what the engine processes used."""
        self.sample()
        wall = time.perf_counter() - self.wall0
        busy, steal = machine_busy_s(), steal_s()
        out = {"wall_s": wall, "driver_cpu_s": own_cpu_s() - self.own0,
               "cpus": float(os.cpu_count() or 1)}
        if busy is not None and self.busy0 is not None:
            out["machine_busy_s"] = busy - self.busy0
            if engines_cpu_s is not None:
                out["engines_cpu_s"] = engines_cpu_s
                out["others_cpu_s"] = max(0.0, out["machine_busy_s"] - engines_cpu_s
                                          - out["driver_cpu_s"])
        if steal is not None and self.steal0 is not None:
            out["steal_s"] = steal - self.steal0
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
        if "steal_s" in r:
            text += (f", hypervisor steal {r['steal_s']:.1f} core-s "
                     f"({r['steal_s'] / (r['wall_s'] * r['cpus']) * 100:.1f}%)")
        if "load_min" in r:
            text += f", load average {r['load_min']:.2f}-{r['load_max']:.2f}"
        return text


def background_share(environment: dict) -> float:
    """The share of the machine's CPU time that processes other than the engines and the
    driver used over a replay (``Quietness.end``'s figures; 0 where not recorded): how often
    a core had work beside its own engine's even while the other engines were idle, which
    the co-run pricing counts as not alone (``agentflow.sim.host_corun``)."""
    others, wall, cpus = (environment.get(k) for k in ("others_cpu_s", "wall_s", "cpus"))
    if not others or not wall or not cpus:
        return 0.0
    return float(min(1.0, max(0.0, others / (wall * cpus))))
