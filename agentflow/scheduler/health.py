"""Instance health: which instances may get work, decided from what their calls did.

Why a state machine next to the coordinator rather than a flag: an instance can fail in
ways a single "up" bit cannot tell apart. It can die (connection refused: take it out at
once), hang (calls never answer: each costs a deadline, so stop sending after the first),
or answer every call with an error that is not retryable (a broken model server: a circuit
breaker opens after ``failures_to_open`` consecutive failures or a failure ratio over a
window). In every case it is probed with one tiny call before it gets work again, and a
failed probe doubles its cool-down (up to ``revive_after_s``).

States:

    healthy  takes work
    suspect  a call timed out or stalled: no new work, its running calls go on (they may
             still finish), a probe decides
    down     failed (died, circuit open, or timed out again): no work, running calls are
             moved to other instances, a probe decides
    probing  a probe call is in flight

Timeouts never take out the last healthy instance: with nowhere else to send a call, a
slow answer beats none (its calls are still retried by deadline and fail with the reason
when ``max_attempts`` is spent). Errors do take it out, as before: the server then answers
503 until a probe succeeds.

Clock-free like the coordinator: every event carries ``now``; the asyncio router calls it
and acts on the returned transitions.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class HealthSettings(BaseModel):
    """Per-call deadlines and instance health (the ``scheduler.health`` config section)."""

    model_config = ConfigDict(extra="forbid")

    # A call's deadline on an instance: ``deadline_safety`` x the ``deadline_quantile`` of
    # its predicted time there (output-length distribution through the instance's time
    # model), never under ``deadline_min_s``, and shortened towards the query's own
    # deadline (but never below the plain quantile: a call is only late once it is late).
    deadline_quantile: float = Field(0.99, gt=0, lt=1)
    deadline_safety: float = Field(3.0, ge=1)
    deadline_min_s: float = Field(1.0, gt=0)
    deadline_max_s: float | None = Field(3600.0, gt=0)
    # ... times how far the instance's healthy calls have been running over their priced
    # time: the ``deadline_speed_quantile`` of observed / expected over its last finished
    # calls (at least 1, at most ``deadline_speed_cap``; None: off). On a loaded CPU host
    # a call sharing its engine's step with three others runs several times its priced
    # time and is still healthy; a hung instance finishes nothing, so it cannot widen its
    # own deadlines (and the cap bounds a merely slow one).
    deadline_speed_quantile: float | None = Field(0.9, gt=0, le=1)
    deadline_speed_cap: float = Field(8.0, ge=1)
    # A call that has streamed tokens and then produces none for this long has stalled.
    stall_s: float | None = Field(30.0, gt=0)
    # Circuit breaker: consecutive failed calls, or a failure ratio over the last
    # ``window`` calls (once at least ``min_calls`` were seen), open it.
    failures_to_open: int = Field(5, ge=1)
    window: int = Field(20, ge=1)
    failure_ratio: float = Field(0.5, gt=0, le=1)
    min_calls: int = Field(10, ge=1)
    # Consecutive timeouts that turn "suspect" into "down" (its running calls are moved).
    timeouts_to_down: int = Field(2, ge=1)
    # First probe this long after an instance leaves service; each failed probe doubles the
    # wait, up to the scheduler's ``revive_after_s`` (None there: never probe again).
    probe_after_s: float = Field(1.0, gt=0)
    probe_timeout_s: float = Field(10.0, gt=0)


class HealthState(str, Enum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    DOWN = "down"
    PROBING = "probing"


@dataclass(frozen=True)
class Transition:
    """An instance changed state; ``probe_in_s`` is set when a probe should be scheduled."""

    instance: str
    old: HealthState
    new: HealthState
    reason: str
    probe_in_s: float | None = None


@dataclass
class InstanceHealth:
    name: str
    state: HealthState = HealthState.HEALTHY
    reason: str = ""
    since: float = 0.0
    consecutive_failures: int = 0
    consecutive_timeouts: int = 0
    recent: deque[bool] = field(default_factory=deque)  # True = call succeeded
    cooldown_s: float = 0.0
    # counters since start, for /metrics (calls by outcome: the router's ``counts``)
    opened: int = 0  # times it left service
    probes_ok: int = 0
    probes_failed: int = 0


class HealthTracker:
    def __init__(self, names: list[str], settings: HealthSettings | None = None, *,
                 revive_after_s: float | None = 30.0):
        self.settings = settings or HealthSettings()
        self.revive_after_s = revive_after_s
        self.instances = {n: InstanceHealth(n, recent=deque(maxlen=self.settings.window))
                          for n in names}

    # ------------------------------------------------------------------ view
    def state(self, name: str) -> HealthState:
        return self.instances[name].state

    def healthy(self) -> list[str]:
        return [n for n, h in self.instances.items() if h.state == HealthState.HEALTHY]

    # ------------------------------------------------------------------ events
    def on_success(self, name: str, now: float) -> Transition | None:
        h = self.instances[name]
        h.consecutive_failures = h.consecutive_timeouts = 0
        h.recent.append(True)
        return None  # a suspect instance still needs its probe to come back

    def on_failure(self, name: str, now: float, reason: str, *,
                   retryable: bool) -> Transition | None:
        """A call failed with an error. A retryable error means the instance could not
        serve at all (died, refused): out at once. Otherwise the circuit breaker decides."""
        h = self.instances[name]
        h.consecutive_failures += 1
        h.consecutive_timeouts = 0
        h.recent.append(False)
        if h.state not in (HealthState.HEALTHY, HealthState.SUSPECT):
            return None
        s = self.settings
        if retryable:
            return self._leave(h, HealthState.DOWN, now, f"call failed: {reason}")
        if h.consecutive_failures >= s.failures_to_open:
            return self._leave(h, HealthState.DOWN, now,
                               f"circuit open: {h.consecutive_failures} consecutive failed "
                               f"calls (last: {reason})")
        bad = h.recent.count(False)
        if len(h.recent) >= s.min_calls and bad / len(h.recent) >= s.failure_ratio:
            return self._leave(h, HealthState.DOWN, now,
                               f"circuit open: {bad} of the last {len(h.recent)} calls failed "
                               f"(last: {reason})")
        return None

    def on_timeout(self, name: str, now: float, reason: str) -> Transition | None:
        """A call ran past its deadline or stalled (the router has cancelled it)."""
        h = self.instances[name]
        h.consecutive_timeouts += 1
        h.recent.append(False)
        if h.state == HealthState.HEALTHY:
            if not any(n != name for n in self.healthy()):
                return None  # the last healthy instance: slow beats nothing
            return self._leave(h, HealthState.SUSPECT, now, f"call timed out: {reason}")
        if h.state == HealthState.SUSPECT and \
                h.consecutive_timeouts >= self.settings.timeouts_to_down:
            return self._move(h, HealthState.DOWN, now,
                              f"{h.consecutive_timeouts} calls timed out in a row (last: "
                              f"{reason})")
        return None

    def on_probe_started(self, name: str, now: float) -> Transition | None:
        h = self.instances[name]
        if h.state not in (HealthState.SUSPECT, HealthState.DOWN):
            return None
        return self._move(h, HealthState.PROBING, now, "probing", keep_reason=True)

    def on_probe(self, name: str, now: float, ok: bool, reason: str = "") -> Transition | None:
        h = self.instances[name]
        if h.state != HealthState.PROBING:
            return None
        if ok:
            h.probes_ok += 1
            h.consecutive_failures = h.consecutive_timeouts = 0
            h.recent.clear()
            h.cooldown_s = 0.0
            return self._move(h, HealthState.HEALTHY, now, "probe answered")
        h.probes_failed += 1
        h.cooldown_s = self._next_cooldown(h.cooldown_s * 2)
        return self._move(h, HealthState.DOWN, now, f"probe failed: {reason}",
                          probe_in_s=h.cooldown_s)

    # ------------------------------------------------------------------ internals
    def _next_cooldown(self, wanted: float) -> float:
        wanted = max(wanted, self.settings.probe_after_s)
        if self.revive_after_s is not None:
            wanted = min(wanted, max(self.revive_after_s, self.settings.probe_after_s))
        return wanted

    def _leave(self, h: InstanceHealth, new: HealthState, now: float,
               reason: str) -> Transition:
        """Out of service: schedule the first probe (already scheduled when it was only
        suspect)."""
        if h.state != HealthState.HEALTHY:
            return self._move(h, new, now, reason)
        h.opened += 1
        h.cooldown_s = self._next_cooldown(self.settings.probe_after_s)
        return self._move(h, new, now, reason, probe_in_s=h.cooldown_s)

    def _move(self, h: InstanceHealth, new: HealthState, now: float, reason: str, *,
              probe_in_s: float | None = None, keep_reason: bool = False) -> Transition:
        old = h.state
        h.state, h.since = new, now
        if not keep_reason:
            h.reason = reason
        if self.revive_after_s is None:
            probe_in_s = None  # configured never to come back on its own
        return Transition(h.name, old, new, reason, probe_in_s)
