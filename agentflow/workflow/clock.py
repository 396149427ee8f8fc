"""Clocks are injected so the same runtime and scheduler run in real time and in virtual time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic timeline (origin unspecified)."""


class MonotonicClock:
    """Real time: ``time.monotonic``."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to: tests and the simulator's virtual time."""

    def __init__(self, start: float = 0.0):
        self._t = start

    def now(self) -> float:
        return self._t

    def advance_to(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"time cannot go backwards ({t} < {self._t})")
        self._t = t

    def advance(self, dt: float) -> None:
        self.advance_to(self._t + dt)
