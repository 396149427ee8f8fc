"""SLO classes in the scheduler: who is served first, who waits behind whom, who is shed first.

A query's class (``agentflow.slo_classes``) acts in four places, all here so the coordinator
only calls in:

* **deadline** — a query sent without one gets its class's ``slo_seconds`` (batch: none);
* **queue keys** — for the queue policies that rank by class (``CLASS_RANKED``), the class
  rank goes in front of the policy's own key: every waiting call of a higher class runs
  before any of a lower one, and within a class the policy (and, for ``flowsage``, tenant
  fairness, ``scheduler.fairness``) decides. Why strict rank and not a weighted mix: the
  batch class has no deadline and nobody waiting on each query, so any share of instance
  time it takes while an interactive call waits is pure delay for the person watching;
  work-conservation (an idle slot always serves whoever waits) keeps batch from starving
  while the higher classes leave capacity, which is what the isolation measurement checks;
* **work ahead** — under class ranking a query waits only behind work of its own class or a
  higher one, so admission by backlog counts only that (``backlog.work_ahead_excluded_s``);
* **shedding** — count limits refuse the classes ranked below the default class earlier
  (``shed_limit``): a batch flood is refused while there is still room for standard and
  interactive queries.

Tiers: a policy's key keeps its own tiers (small non-negative integers) inside a band per
(class rank, fair-share flag): ``tier' = (position * 2 + over_share) * TIER_BAND + tier``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import Segment, segment_at
from agentflow.scheduler.risk import hold_for_rank, ranks_by_risk
from agentflow.scheduler.savable import lost_z_of, savable_running
from agentflow.slo_classes import DEFAULT_CLASS, SloClass, resolve_class

if TYPE_CHECKING:
    from agentflow.scheduler.call import QueryState, ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key

# Queue policies that rank by class, and whether tenants share fairly within a class.
# ``fcfs`` is the ``vllm`` preset's queue: vLLM's priority scheduling is first come, first
# served within a priority level, which is the "vllm with class priority" baseline.
# The other baselines (hexgen-flow's urgency, sagesched's gittins, llf, edf) stay as their
# papers describe them: class-blind.
# ``flowsage-savable`` (``scheduler.savable``, registered at run time by the benchmarks that
# measure it) is flowsage's queue with one option: ranked and shared alike.
CLASS_RANKED: dict[str, bool] = {"fcfs": False, "flowsage": True,  # name -> fair
                                 "flowsage-savable": True}

TIER_BAND = 32  # a policy's own tiers must lie in [0, TIER_BAND)
SHED_STEP = 0.8  # each class position below the default class: count limits x this
# Deadline-aware admission (``scheduler.backlog``): refuse, or move to the lowest class, a
# query that cannot meet its deadline; None: off.
DEADLINE_ADMISSION = ("reject", "batch")


# The last classes asked about, their values then, and their positions (``class_positions``).
_LAST_POSITIONS: tuple[Mapping[str, SloClass], tuple[SloClass, ...], dict[int, int]] | None = None


def class_positions(classes: Mapping[str, SloClass]) -> dict[int, int]:
    """Distinct ranks in order (0 for the best): bands stay small whatever ranks are used.

    Kept for the last mapping asked about: every LLM call asks ~6 times (dispatch's band
    checks, the engine priority, the class load) and a set plus a sort each time was ~5% of
    a fleet-sized simulation. The values are compared too (identity first, so it costs a
    tuple), so a mapping edited in place is not answered from before its edit. Callers
    must not edit the dict returned."""
    global _LAST_POSITIONS
    values = tuple(classes.values())
    last = _LAST_POSITIONS
    if last is not None and last[0] is classes and last[1] == values:
        return last[2]
    positions = {rank: i for i, rank in enumerate(sorted({c.rank for c in values}))}
    _LAST_POSITIONS = (classes, values, positions)
    return positions


def class_of(query: QueryState, classes: Mapping[str, SloClass]) -> SloClass:
    return resolve_class(query.slo_class, classes)


def default_deadline(cls: SloClass, now: float, deadline: float | None) -> float | None:
    """The query's deadline: its own, else its class's default (None: none)."""
    if deadline is not None or cls.slo_seconds is None:
        return deadline
    return now + cls.slo_seconds


def shed_limit(limit: int | None, cls: SloClass, classes: Mapping[str, SloClass]
               ) -> int | None:
    """The count limit a query of ``cls`` is refused at: the full limit for the default
    class and those above it; ``SHED_STEP`` less per position below (at least 1)."""
    if limit is None:
        return None
    positions = class_positions(classes)
    default = classes.get(DEFAULT_CLASS)
    base = positions[default.rank] if default is not None else 0
    below = positions[cls.rank] - base
    if below <= 0:
        return limit
    return max(1, math.floor(limit * SHED_STEP ** below))


def lowest_class(classes: Mapping[str, SloClass]) -> SloClass:
    """The class served last (``batch`` by default): where admission moves a query that
    cannot make its deadline, when it moves rather than refuses."""
    return max(classes.values(), key=lambda c: (c.rank, c.name))


class ClassRankedQueue(QueuePolicy):
    """A queue policy's keys, in bands by class rank (and fair share, ``fair``)."""

    def __init__(self, inner: QueuePolicy, *, fair: bool):
        self.inner = inner
        self.fair = fair
        self.name = inner.name
        self.query_dependent = inner.query_dependent
        self.per_query = inner.per_query
        self._positions: tuple[object, dict[int, int]] | None = None

    def __getattr__(self, item: str) -> Any:  # the inner policy's own settings and helpers
        # copy/deepcopy/pickle build the object without __init__ and look up __setstate__ and
        # friends before ``inner`` is set: those must be AttributeError, not KeyError, or a
        # simulation under a class-ranked queue cannot fork (the alpha tuner forks).
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(item)
        return getattr(inner, item)

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        key = self.inner.rank(call, now, view)
        coordinator: Any = view
        classes = coordinator.slo_classes
        cached = self._positions
        if cached is None or cached[0] is not classes:
            cached = self._positions = (classes, class_positions(classes))
        band = cached[1][class_of(call.query, classes).rank] * 2
        if self.fair and coordinator.fairness.over_share(call.query):
            band += 1
        if band == 0:
            return key
        shift = band * TIER_BAND
        out = []
        for seg in key:
            if not 0 <= seg.tier < TIER_BAND:
                raise ValueError(f"queue policy {self.name!r} uses tier {seg.tier}, outside "
                                 f"[0, {TIER_BAND})")
            out.append(Segment(seg.start, seg.tier + shift, seg.a, seg.s))
        return tuple(out)


def with_classes(queue: QueuePolicy) -> QueuePolicy:
    """``queue`` ranked by class when its policy is one of ``CLASS_RANKED``, else as is."""
    fair = CLASS_RANKED.get(queue.name)
    if fair is None:
        return queue
    return ClassRankedQueue(queue, fair=fair)


def ranks_by_class(queue: QueuePolicy) -> bool:
    return isinstance(queue, ClassRankedQueue)


# The backend priority of an admitted call (vLLM: lower runs first, and a lower value
# preempts a higher one when KV runs short): its band first, then its place in the queue order.
PRIORITY_BAND = 1_000_000_000  # per band: TIER_BAND slices of the queue key (queue_rank)
# Share of an instance's call slots and KV tokens kept free of lower-band calls while a
# higher band has queries in flight: a higher-class call that becomes ready finds room at
# once, and co-runs with fewer lower-class calls (decode slows with every co-runner).
HEADROOM = 0.25
ISOLATE_PREFILL = True
LOWER_PENDING_PREFILL = 1


def call_band(coordinator: Any, query: QueryState) -> int:
    """The query's band: class position x 2, plus 1 while its tenant is over its share."""
    queue = coordinator._queue_policy
    classes = coordinator.slo_classes
    band = class_positions(classes)[class_of(query, classes).rank] * 2
    if isinstance(queue, ClassRankedQueue) and queue.fair and \
            coordinator.fairness.over_share(query):
        band += 1
    return band


def arrival_band(coordinator: Any, cls: SloClass, tenant: str | None) -> int:
    """The band a query of ``cls`` from ``tenant`` arrives in (``call_band`` before the
    query exists): its tenant may already be over its share."""
    band = class_positions(coordinator.slo_classes)[cls.rank] * 2
    queue = coordinator._queue_policy
    if isinstance(queue, ClassRankedQueue) and queue.fair and \
            coordinator.fairness.over_share_key((cls.name, tenant or "")):
        band += 1
    return band


def engine_priority(coordinator: Any, call: ScheduledCall, now: float) -> int:
    """What the backend is told: band-major, then the call's place in the queue's own order
    (``queue_rank``), counted from the default class's band so a query that names no class
    sits in [0, PRIORITY_BAND) (higher classes go negative: still "lower runs first").

    Why the queue's key and not the admission number: calls are admitted to an engine long
    before they contend (under ``marginal_delay`` 18 of 2,460 admissions had two calls to
    choose from), and the contention then happens inside the engine — its waiting queue and
    which sequence it preempts when KV runs short — which orders by this number. Admission
    order made that first-come-first-served within a class whatever the queue policy; the
    key makes it the policy's order (flowsage: the query most likely to miss first)."""
    classes = coordinator.slo_classes
    default = classes.get(DEFAULT_CLASS)
    base = class_positions(classes)[default.rank] * 2 if default is not None else 0
    return (call_band(coordinator, call.query) - base) * PRIORITY_BAND + queue_rank(call, now)


# Monotone squash of a key value into its tier's share of a band (``queue_rank``): signed
# log1p of |value| / _RANK_UNIT, over +-_RANK_SPAN e-folds (|value| up to ~1e12 units).
_RANK_UNIT = 1e-3
_RANK_SPAN = 36.0


def queue_rank(call: ScheduledCall, now: float) -> int:
    """The call's queue key at ``now``, read as an instant (below), as an integer in
    [0, PRIORITY_BAND), order-preserving: its policy's tier (the class band's shift
    removed) picks one of ``TIER_BAND`` equal slices, the key's value a place within it (a
    signed log scale: about 2e-6 relative resolution, so seconds-valued keys of a long run
    and z-scores alike stay in order). A call without a key (admitted without being ranked)
    goes last in its band."""
    if not call.rank_key:
        return PRIORITY_BAND - 1
    seg = segment_at(call.rank_key, now)
    tier = seg.tier
    # A key falling with time (``a - s t``, s > 0: flowsage's z, llf's laxity) is told as the
    # instant it reaches 0 (flowsage: the latest start at the mean path, D - R), not as its
    # value now: the engine keeps the number while it waits, and a value taken at admission
    # makes every call admitted earlier look less urgent than it has since become — measured
    # on paper-4gpu with no engine-side bound, flowsage / md+fcfs P95 1.066 read at admission
    # (a last-come-first tilt). A flat key (fcfs's ready time, a no-deadline finish tag) is
    # an instant already.
    value = seg.a / seg.s if seg.s > 0 else seg.a - seg.s * now
    width = PRIORITY_BAND // TIER_BAND
    if not math.isfinite(value):
        place = 0 if value < 0 else width - 1
    else:
        g = math.copysign(math.log1p(abs(value) / _RANK_UNIT), value)
        place = int((min(max(g, -_RANK_SPAN), _RANK_SPAN) + _RANK_SPAN)
                    / (2 * _RANK_SPAN) * (width - 1))
    return (tier % TIER_BAND) * width + place


def best_active_band(coordinator: Any) -> int | None:
    """The best band any query in flight is in (in each class with queries in flight the
    least-served tenant is in share, so that is class position x 2)."""
    positions = class_positions(coordinator.slo_classes)
    ranks = [coordinator.slo_classes[c].rank if c in coordinator.slo_classes else None
             for c in coordinator.fairness.active_classes()]
    known = [positions[r] * 2 for r in ranks if r is not None]
    return min(known) if known else None


def headroom_gate(coordinator: Any) -> Any:
    """``InstanceQueue.gate``: whether the best waiting call may start beside the running
    ones — always, unless a better band has queries in flight, then only within
    ``1 - HEADROOM`` of the instance's slots and KV tokens. An instance running nothing
    always admits (the queue checks), and with no better band present nothing is held.
    First, the fast lane's cap (``scheduler.fast_lane``), which holds while a better tenant
    is present, in flight or not; then, under flowsage, the rank-aware hold
    (``scheduler.risk.hold_for_rank``: a slack-rich prefill waits while calls of less slack
    decode here; under ``flowsage-savable`` it reads the instance without the running calls
    of lost queries, ``scheduler.savable``)."""
    z_lost = lost_z_of(coordinator)

    def gate(queue: Any, call: ScheduledCall, need: int) -> bool:
        lane = coordinator.fast_lane
        if lane is not None and lane.holds(queue, call):
            return False
        if ranks_by_risk(coordinator):
            now = coordinator.clock.now()
            seen = queue if z_lost is None else savable_running(coordinator, queue, now,
                                                                  z_lost)
            if hold_for_rank(coordinator, seen, call, now):
                return False
        best = best_active_band(coordinator)
        if best is None:
            return True
        band = call_band(coordinator, call.query)
        if band <= best:
            return True
        if ISOLATE_PREFILL and any(call_band(coordinator, c.query) < band
                                   for c in queue.running):
            return False
        if queue.pending_prefill() >= LOWER_PENDING_PREFILL:
            return False
        spec = queue.spec
        if len(queue.running) + 1 > (1 - HEADROOM) * spec.max_inflight:
            return False
        budget = spec.kv_token_budget
        return budget is None or queue.kv_tokens_in_use + need <= (1 - HEADROOM) * budget
    return gate



class ClassLoad:
    """Waiting calls' token totals and running calls per (band, instance), kept beside the
    ``LoadBook``: under class ranking a call waits only behind calls of its own band or a
    better one, so dispatch must not count a batch backlog (or an over-share tenant's)
    against an interactive call (or an in-share one) — it would send it to a slower,
    emptier GPU to avoid a queue it jumps — nor price the delay it inflicts on co-runners it
    outranks. Each call is counted in the band it had when it was enqueued or admitted
    (``move`` when its tenant's share flag flips while it waits)."""

    def __init__(self, coordinator: Any, n_instances: int):
        self._coordinator = coordinator
        self.n_wait = np.zeros((1, n_instances))  # rows added as bands show up
        self.wait_prompt = np.zeros((1, n_instances))
        self.wait_output = np.zeros((1, n_instances))
        self.n_run = np.zeros((1, n_instances))
        self._waiting: dict[ScheduledCall, tuple[int, int, int]] = {}  # (band, index, prompt)
        self._running: dict[ScheduledCall, tuple[int, int]] = {}  # (band, index)

    def band(self, call: ScheduledCall) -> int:
        b = call_band(self._coordinator, call.query)
        if b >= self.n_wait.shape[0]:  # a band seen for the first time
            pad = np.zeros((b + 1 - self.n_wait.shape[0], self.n_wait.shape[1]))
            self.n_wait, self.wait_prompt, self.wait_output, self.n_run = (
                np.vstack([a, pad]) for a in (self.n_wait, self.wait_prompt, self.wait_output,
                                              self.n_run))
        return b

    def running(self, index: int, call: ScheduledCall, sign: int) -> None:
        if sign > 0:
            band = self.band(call)
            self._running[call] = (band, index)
        else:
            entry = self._running.pop(call, None)
            if entry is None:
                return
            band, index = entry
        self.n_run[band, index] += sign

    def account(self, index: int, call: ScheduledCall, sign: int, prompt_tokens: int) -> None:
        if sign > 0:
            band = self.band(call)
            self._waiting[call] = (band, index, prompt_tokens)
        else:
            entry = self._waiting.pop(call, None)
            if entry is None:
                return
            band, index, prompt_tokens = entry
        self.n_wait[band, index] += sign
        self.wait_prompt[band, index] += sign * prompt_tokens
        self.wait_output[band, index] += sign * call.mean_output

    def move(self, call: ScheduledCall) -> None:
        """Re-count a waiting call whose band changed (its tenant's share flag flipped)."""
        entry = self._waiting.get(call)
        if entry is None or self.band(call) == entry[0]:
            return
        band, index, prompt = entry
        self.account(index, call, -1, prompt)
        self.account(index, call, +1, prompt)

    def peers_running(self, call: ScheduledCall) -> np.ndarray:
        """Per instance, running calls of ``call``'s band or a better one: the co-runners
        whose delay counts against admitting it (an outranked one's does not decide)."""
        peers: np.ndarray = self.n_run[:self.band(call) + 1].sum(axis=0)
        return peers

    def worse_in_flight(self, call: ScheduledCall) -> bool:
        """Whether calls of a worse band than ``call``'s run or wait anywhere: then the
        headroom gate holds their new admissions off any instance ``call`` runs on."""
        p = self.band(call) + 1
        return p < self.n_wait.shape[0] and bool(self.n_run[p:].any() or self.n_wait[p:].any())

    def behind_s(self, call: ScheduledCall, coefs: tuple[np.ndarray, np.ndarray, np.ndarray]
                 ) -> np.ndarray | None:
        """Per instance, expected seconds of waiting work ``call`` would not wait behind
        (worse bands); None when there is none."""
        p = self.band(call) + 1
        if p >= self.n_wait.shape[0] or not self.n_wait[p:].any():
            return None
        oh, pf, df = coefs
        behind: np.ndarray = (self.n_wait[p:].sum(axis=0) * oh + self.wait_prompt[p:].sum(axis=0)
                              * pf + self.wait_output[p:].sum(axis=0) * df)
        return behind
