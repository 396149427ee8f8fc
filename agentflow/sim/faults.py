"""Faults injected into a simulated cluster, so robustness can be compared in the simulator
with the same events real serving reacts to.

* ``down`` — the instance dies: every call on it is aborted and comes back to the coordinator
  as a retryable failure (as ``ScheduledRouter`` does when a backend fails), and the
  coordinator stops dispatching to it.
* ``up`` — it is back, empty; the coordinator may dispatch to it again.
* ``slow`` — from the next iteration its steps take ``factor`` times as long (``factor`` 1
  restores it). The coordinator is not told: it sees only longer calls, as in serving.

On the command line: ``KIND:INSTANCE@SECONDS`` with ``xFACTOR`` for ``slow``, e.g.
``down:a100-80g-0@60``, ``up:a100-80g-0@120``, ``slow:l40s-0@30x3``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("down", "up", "slow")
_SYNTAX = re.compile(r"^(?P<kind>[a-z]+):(?P<instance>[^@]+)@(?P<at>[0-9.]+)"
                     r"(?:x(?P<factor>[0-9.]+))?$")


@dataclass(frozen=True)
class Fault:
    at_s: float  # virtual seconds since the start of the run
    instance: str
    kind: str  # down | up | slow
    factor: float = 1.0  # slow only

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; choose from {', '.join(KINDS)}")
        if self.at_s < 0 or not self.factor > 0:
            raise ValueError("a fault needs a time >= 0 and a positive factor")

    @classmethod
    def parse(cls, text: str) -> Fault:
        m = _SYNTAX.match(text.strip())
        if m is None:
            raise ValueError(f"bad fault {text!r}; use KIND:INSTANCE@SECONDS[xFACTOR], e.g. "
                             "down:a100-80g-0@60 or slow:l40s-0@30x3")
        kind = m["kind"]
        if (m["factor"] is not None) != (kind == "slow"):
            raise ValueError(f"bad fault {text!r}: xFACTOR goes with slow, and only with it")
        return cls(float(m["at"]), m["instance"], kind, float(m["factor"] or 1.0))
