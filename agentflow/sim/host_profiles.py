"""Hardware profiles fitted on the machine at hand, keyed by what the machine is.

A CPU profile (``hardware.GPUS["Xeon-core"]``) holds one core's efficiencies and overheads as
fitted on one CPU; on another CPU the same llama-server runs at other speeds (on this
project's AMD EPYC VMs the stored Sapphire Rapids fit put engine work 1.42-1.51x off). So
``agentflow calibrate --cluster FILE`` times single and batched requests on the cluster's
instances and stores the fit here, keyed by the host's CPU model (and GPU model / driver
where ``nvidia-smi`` answers), and the simulator builds a local instance (a
``llama_server`` backend: its hardware is this host) from the host's profile when one is
stored. Where none is and the named profile was fitted on other hardware, it warns, naming
both, once per process.

The store is one JSON file, ``<cache>/host-profiles.json`` (``AGENTFLOW_HOST_PROFILES``:
another path, or ``off`` for none), a list of entries; a later fit for the same key
replaces the earlier one.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from statistics import median
from typing import Any

from agentflow import hardware

ENV = "AGENTFLOW_HOST_PROFILES"


class HostMismatchWarning(UserWarning):
    """A local instance is simulated with a profile fitted on other hardware."""


@dataclass(frozen=True)
class HostIdentity:
    """What a profile's numbers depend on: the CPU model, and the GPU and its driver."""

    cpu: str
    gpu: str = ""
    driver: str = ""

    @property
    def key(self) -> str:
        return " | ".join(p for p in (self.cpu, self.gpu, self.driver) if p)

    def describe(self) -> str:
        gpu = f", {self.gpu} (driver {self.driver})" if self.gpu else ""
        return f"{self.cpu}{gpu}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _gpu_and_driver() -> tuple[str, str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "", ""
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "", ""
    first = out.strip().splitlines()[0] if out.strip() else ""
    name, _, driver = first.partition(",")
    return name.strip(), driver.strip()


@lru_cache(maxsize=1)
def this_host() -> HostIdentity:
    """This machine's identity (read once per process)."""
    return HostIdentity(_cpu_model(), *_gpu_and_driver())


@dataclass(frozen=True)
class HostProfile:
    """One fit: the named profile ``base`` for ``model`` on ``host``, with the constants
    the fit changed, how well it fitted, and when."""

    base: str
    model: str
    host: HostIdentity
    constants: dict[str, float]
    fit_error: dict[str, float] = field(default_factory=dict)  # median / max |rel err|
    instances: tuple[str, ...] = ()
    fitted_at: str = ""
    # CPU seconds of ``host_calibration.SPEED_PROBE`` on one of these instances while the
    # rows were timed (mean of before and after; 0: not measured), and the probe's shapes:
    # a replay that times the same probe knows how much more CPU the same work costs then
    speed_probe_cpu_s: float = 0.0
    speed_probe_shapes: tuple[tuple[int, int], ...] = ()
    # The co-run factor (``hardware.GPUProfile.cpu_alone_factor``: CPU seconds of work on an
    # instance with every other local instance idle over the same beside busy ones, which
    # is how the constants were fitted) and the probe's (alone, beside busy) CPU-s pairs it
    # is the median ratio of (``host_calibration.measure_corun``). Kept apart from
    # ``constants`` so a store written with it still loads in code that predates it.
    alone_factor: float = 1.0
    corun_pairs: tuple[tuple[float, float], ...] = ()
    # Per instance, every CPU-s of the speed probe (same shapes) the calibration timed on it
    # with its neighbours busy, over all its tries (before and after its rows, and beside
    # busy neighbours in the co-run rounds): the distribution each instance's speed
    # reference is the median of (``instance_reference``). Why not the fitted try's mean
    # alone: on this project's VM the speed moves ~20% within minutes, and a calibration
    # that retries until its probe is stable keeps a calm phase, which was a fast one (the
    # replays after stop 49's ran the same work ~16% slower); and one pinned core's probe
    # ran ~7% slower than the other's. Empty (stores written before it): no per-instance
    # reference, every instance priced at the fit's constants as before.
    instance_probes: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def speed_reference(self, shapes: tuple[tuple[int, int], ...]) -> float | None:
        """The stored probe's CPU seconds while the fitted rows were timed (the speed the
        constants price) if it was the probe of ``shapes``, else None."""
        if self.speed_probe_cpu_s > 0 and tuple(map(tuple, self.speed_probe_shapes)) \
                == tuple(map(tuple, shapes)):
            return self.speed_probe_cpu_s
        return None

    def instance_reference(self, instance: str, shapes: tuple[tuple[int, int], ...]
                           ) -> float | None:
        """The typical CPU seconds of the probe of ``shapes`` on ``instance``: the median of
        its ``instance_probes``; without them (an older store, an instance not timed) the
        fit's own reference (``speed_reference``), or None."""
        fit = self.speed_reference(shapes)
        got = self.instance_probes.get(instance)
        if fit is None or not got:
            return fit
        return float(median(got))

    def instance_speeds(self) -> dict[str, float]:
        """Per instance with probes: its typical probe CPU-s over the fit's, the factor the
        simulator multiplies its engine's iterations by (``GPUProfile.cpu_instance_speed``)."""
        if self.speed_probe_cpu_s <= 0:
            return {}
        return {n: float(median(v)) / self.speed_probe_cpu_s
                for n, v in sorted(self.instance_probes.items()) if v}

    def profile(self) -> hardware.GPUProfile:
        """The named profile with this host's constants."""
        known = {f.name for f in fields(hardware.GPUProfile)}
        bad = sorted(set(self.constants) - known)
        if bad:
            raise ValueError(f"host profile for {self.base}: unknown constants {bad}")
        constants: dict[str, Any] = dict(self.constants)
        return replace(hardware.gpu(self.base), **constants,
                       cpu_alone_factor=float(self.alone_factor),
                       cpu_instance_speed=tuple(self.instance_speeds().items()))

    def to_json(self) -> dict:
        d = asdict(self)
        d["instances"] = list(self.instances)
        d["speed_probe_shapes"] = [list(x) for x in self.speed_probe_shapes]
        d["corun_pairs"] = [list(x) for x in self.corun_pairs]
        d["instance_probes"] = {n: list(v) for n, v in self.instance_probes.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> HostProfile:
        try:
            return cls(base=d["base"], model=d["model"], host=HostIdentity(**d["host"]),
                       constants={k: float(v) for k, v in d["constants"].items()},
                       fit_error={k: float(v) for k, v in d.get("fit_error", {}).items()},
                       instances=tuple(d.get("instances", ())),
                       fitted_at=d.get("fitted_at", ""),
                       speed_probe_cpu_s=float(d.get("speed_probe_cpu_s", 0.0)),
                       speed_probe_shapes=tuple((int(p), int(o)) for p, o in
                                                d.get("speed_probe_shapes", ())),
                       alone_factor=float(d.get("alone_factor", 1.0)),
                       corun_pairs=tuple((float(a), float(b)) for a, b in
                                         d.get("corun_pairs", ())),
                       instance_probes={str(n): tuple(float(x) for x in v) for n, v in
                                        d.get("instance_probes", {}).items()})
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed host profile entry {d!r}: {err}") from None


def store_path() -> Path | None:
    """Where host profiles live (None: ``AGENTFLOW_HOST_PROFILES=off``)."""
    env = os.environ.get(ENV)
    if env == "off":
        return None
    if env:
        return Path(env)
    from agentflow.datasets.types import cache_dir

    return cache_dir() / "host-profiles.json"


def load(path: Path | None = None) -> list[HostProfile]:
    path = path or store_path()
    if path is None or not path.exists():
        return []
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a host-profile store ({err})") from None
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a list of host profiles")
    return [HostProfile.from_json(d) for d in raw]


def save(entry: HostProfile, path: Path | None = None) -> Path:
    """Add ``entry``, replacing any earlier fit of the same profile, model and host."""
    path = path or store_path()
    if path is None:
        raise ValueError(f"{ENV}=off: no host-profile store to save to")
    if not entry.fitted_at:
        entry = replace(entry, fitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    kept = [e for e in load(path) if (e.base, e.model, e.host.key)
            != (entry.base, entry.model, entry.host.key)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([e.to_json() for e in [*kept, entry]], indent=1))
    tmp.replace(path)
    return path


def lookup(base: str, model: str, host: HostIdentity | None = None) -> HostProfile | None:
    """The stored fit of ``base`` for ``model`` on ``host`` (default: this one)."""
    host = host or this_host()
    for e in load():
        if (e.base, e.model, e.host.key) == (base, model, host.key):
            return e
    return None


def fitted_elsewhere(base: str, host: HostIdentity | None = None) -> str | None:
    """What hardware the stored profile ``base`` was fitted on, if that is not ``host``
    (``hardware.FITTED_ON``: a description and the words a matching CPU names)."""
    known = hardware.FITTED_ON.get(base)
    if known is None:
        return None
    description, words = known
    cpu = (host or this_host()).cpu.lower()
    return None if all(w.lower() in cpu for w in words) else description


_warned: set[tuple[str, str]] = set()


def local_profile(base: str, model: str) -> hardware.GPUProfile | None:
    """For an instance running on this host: its host profile if one is stored; otherwise
    None, with a ``HostMismatchWarning`` (once per profile and host) where the named
    profile was fitted on other hardware."""
    host = this_host()
    entry = lookup(base, model, host)
    if entry is not None:
        return entry.profile()
    other = fitted_elsewhere(base, host)
    if other is not None and (base, host.key) not in _warned:
        _warned.add((base, host.key))
        warnings.warn(f"profile {base} was fitted on {other}; this host is "
                      f"{host.describe()} and has no profile of its own: run agentflow "
                      f"calibrate --cluster FILE", HostMismatchWarning, stacklevel=3)
    return None
