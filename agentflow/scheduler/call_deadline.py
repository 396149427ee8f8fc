"""How long an LLM call may run on an instance before it is cancelled and sent elsewhere.

The scheduler already has, for every call, a distribution of its output length and, for
every instance, a time model; together they give a distribution of the call's run time on
that instance. The call's limit is a high quantile of it times a safety factor, so a call
is only given up on when it is far later than almost every call like it — and, as a
query's deadline comes closer, the margin shrinks towards the plain quantile (never below:
cutting a call that is merely on time would only waste the work done).

An instance that has never finished a call (it hung from the start, or just joined) has an
uncorrected time model; for it the correction ratios of its peers (same GPU and model) that
have finished calls stand in, so a hung instance is found as fast as a slow one would be.

The time model's ratios correct the *mean* speed; calls on a batching engine spread around
it (a call alone runs at the mean or faster, one sharing every step with three others and
a newcomer's prompt runs several times longer). Measured on two llama-server instances on a
CPU: 3-8 healthy calls of 582 overran a deadline priced at the mean and were retried. So
the limit is also scaled by the instance's observed spread: a high quantile of observed /
expected time over its last finished calls (``HealthSettings.deadline_speed_quantile``).

A call also shares its engine: on a CPU (compute-bound, one core) a step costs about the sum
of its tokens, so a call that starts while other calls' prompts are still being processed
finishes only after their prompt tokens (measured on llama-server instances at tokens
x0.02: every deadline timeout was a sub-second call cut at the 1 s floor while a neighbour's
prompt chunk ran). So the priced time adds the prefill of the calls running beside it that
have not produced a token yet, as they stood when the call started (a later re-evaluation
keeps that figure: their prompts finishing must not shorten a limit already running; the
speed factor likewise never falls below its value at the call's start).

Functions of the coordinator's state and ``now``: no clock reads, no sleeping (the one
memory is that figure, per attempt). What an untried instance borrows from its peers is
kept per GPU and model until one of them learns (the coordinator's learn counts of their
peer groups, and ``_models_epoch`` for models replaced or edited in place): serving
re-evaluates every running call's limit about once a second, and a scan of every instance
for each of them was 4,096 x 4,096 model reads a second on a fleet that has just started.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING

from agentflow.scheduler.call import ScheduledCall
from agentflow.scheduler.health import HealthSettings
from agentflow.scheduler.time_model import InstanceTimeModel

if TYPE_CHECKING:
    from agentflow.scheduler.coordinator import Coordinator

Kin = tuple[str | None, str | None]  # (GPU, model): whose measurements an untried one reads


class CallDeadlines:
    def __init__(self, coordinator: Coordinator, settings: HealthSettings | None = None):
        self.coordinator = coordinator
        self.settings = settings or HealthSettings()
        # (call id, instance, started) -> (prefill seconds of its neighbours, speed factor),
        # both as they stood at the attempt's first evaluation; keyed by id so the memory
        # holds no finished call (and its query) alive
        self._at_start: OrderedDict[tuple[str, str, float], tuple[float, float]] = OrderedDict()
        # per (GPU, model): its instances' names and their peer groups (``peer_key``s,
        # whose learn counts stamp what was borrowed), built at the first use
        self._kin: dict[str, Kin] | None = None
        self._kin_peer_keys: dict[Kin, list[tuple[str | None, ...]]] = {}
        self._kin_members: dict[Kin, list[str]] = {}
        # (GPU, model) -> (stamp, the largest observed (prefill, decode) ratios or None)
        self._ratios: dict[Kin, tuple[object, tuple[float, float] | None]] = {}
        # (GPU, model, quantile, cap) -> (stamp, the largest speed factor of its instances)
        self._speeds: dict[tuple[object, ...], tuple[object, float]] = {}

    def _start_figures(self, call: ScheduledCall, instance: str,
                       started: float) -> tuple[float, float]:
        key = (call.id, instance, started)
        if key not in self._at_start:
            model = self.time_model(instance)
            queue = self.coordinator.queues[instance]
            ahead = sum(model.prefill_s(c.tokens_on(instance)) for c in queue.running
                        if c is not call and c.attained_tokens == 0)
            self._at_start[key] = (ahead, self.speed_factor(instance))
            while len(self._at_start) > 4096:
                self._at_start.popitem(last=False)
        return self._at_start[key]

    def prefill_ahead_s(self, call: ScheduledCall, instance: str, started: float) -> float:
        """Prompt time of the calls running beside ``call`` on ``instance`` that had not
        produced a token when it started (fixed at its first evaluation)."""
        return self._start_figures(call, instance, started)[0]

    def time_model(self, instance: str) -> InstanceTimeModel:
        """The instance's own model once it has observations, else one corrected like its
        observed peers of the same hardware (the most pessimistic of them)."""
        model = self.coordinator.time_models[instance]
        if model.observations:
            return model
        ratios = self._peer_ratios(instance)
        if ratios is None:
            return model
        return replace(model, prefill_ratio=ratios[0], decode_ratio=ratios[1])

    def _stamp(self, kin: Kin) -> object:
        """Moves whenever a time model of ``kin`` may have changed: any of its peer groups
        learned, or models were replaced or edited (``ClusterView._models_epoch``)."""
        c = self.coordinator
        learns = c._group_learns
        return c._models_epoch, tuple(learns[k] for k in self._kin_peer_keys[kin])

    def _kin_of(self, instance: str) -> Kin:
        """The instance's (GPU, model): who it borrows from while it has answered nothing."""
        if self._kin is None:
            self._kin = {}
            for name, q in self.coordinator.queues.items():
                kin = (q.spec.gpu, q.spec.model)
                self._kin[name] = kin
                self._kin_members.setdefault(kin, []).append(name)
                keys = self._kin_peer_keys.setdefault(kin, [])
                if q.spec.peer_key not in keys:
                    keys.append(q.spec.peer_key)
        return self._kin[instance]

    def _peer_ratios(self, instance: str) -> tuple[float, float] | None:
        """The largest (prefill, decode) ratios of the instances of ``instance``'s GPU and
        model that have answered (None: none has), kept until one of them learns. The
        instance itself has answered nothing, so it is never among them."""
        kin = self._kin_of(instance)
        stamp = self._stamp(kin)
        cached = self._ratios.get(kin)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        models = self.coordinator.time_models
        peers = [m for m in (models[n] for n in self._kin_members[kin]) if m.observations]
        ratios = None if not peers else (max(p.prefill_ratio for p in peers),
                                         max(p.decode_ratio for p in peers))
        self._ratios[kin] = (stamp, ratios)
        return ratios

    def speed_factor(self, instance: str) -> float:
        """How far this instance's healthy calls run over their priced time: the settings'
        quantile of its recent observed / expected ratios, within [1, cap]; its peers'
        (same GPU and model, the largest) while it has finished nothing."""
        q = self.settings.deadline_speed_quantile
        if q is None:
            return 1.0
        cap = self.settings.deadline_speed_cap
        ratios = list(self.coordinator.time_models[instance].call_ratios)
        if ratios:
            return _clamp(_quantile(sorted(ratios), q), cap)
        # none of its own (so it is not among the peers read): its GPU and model's largest,
        # kept until one of them learns
        kin = self._kin_of(instance)
        stamp, key = self._stamp(kin), (*kin, q, cap)
        cached = self._speeds.get(key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        models = self.coordinator.time_models
        peers = [sorted(m.call_ratios) for m in (models[n] for n in self._kin_members[kin])
                 if m.call_ratios]
        speed = max((_clamp(_quantile(r, q), cap) for r in peers), default=1.0)
        self._speeds[key] = (stamp, speed)
        return speed

    def expected_quantile_s(self, call: ScheduledCall, instance: str) -> float:
        """The quantile of the call's time there: time is increasing in the output length,
        so it is the time of the output length's quantile."""
        model = self.time_model(instance)
        tokens = float(call.output.quantile(self.settings.deadline_quantile))
        return model.expected_s(call.tokens_on(instance), tokens)

    def limit_s(self, call: ScheduledCall, instance: str, started: float) -> float:
        """Seconds the call may run on ``instance`` counted from ``started`` (when it was
        handed to the backend). Each earlier attempt doubles it, so a call re-dispatched
        after a timeout is not cut short again by the same too-tight estimate."""
        s = self.settings
        ahead, factor_at_start = self._start_figures(call, instance, started)
        # the speed factor may grow while the call runs, never shrink: fast calls finishing
        # meanwhile must not cut one that was priced at the slower speed it started under
        factor = max(factor_at_start, self.speed_factor(instance))
        quantile = (self.expected_quantile_s(call, instance) + ahead) * factor
        limit: float = s.deadline_safety * quantile
        deadline = call.query.deadline
        if deadline is not None:
            limit = min(limit, max(deadline - started, quantile))
        limit *= 2 ** min(call.attempts, 4)
        limit = max(limit, s.deadline_min_s)
        if s.deadline_max_s is not None:
            limit = min(limit, s.deadline_max_s)
        return limit


def _quantile(sorted_values: list[float], q: float) -> float:
    """The lower empirical quantile (a value that was observed; no interpolation)."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def _clamp(value: float, cap: float) -> float:
    return min(max(value, 1.0), cap)
