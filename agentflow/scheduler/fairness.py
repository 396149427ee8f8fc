"""Tenants share fairly within a class: per-tenant virtual time in front of the queue keys.

Without it, one tenant's flood is everyone's latency: ``flowsage`` ranks the query most
likely to miss its deadline first, and under a flood the flooder's queries are exactly
those — they take the instances while a light tenant's fresh queries wait behind them.

Each (class, tenant) keeps a virtual time: the instance seconds its calls were admitted
with (the coordinator's own expected time on the chosen instance, what serving knows at
admission), divided by its weight — the tenant's ``weight`` (tenants config, ``--tenant
...:WEIGHT``) times its class's ``weight`` (``scheduler.slo_classes``). Pairs compete with the
other pairs of the same class *rank*: with the default classes (one per rank) that is within
a class, and classes configured at an equal rank share it by their weights. Among the pairs of
a rank with queries in flight, one whose virtual time is more than ``quantum_s`` ahead of the
least-served one is *over its share*: its calls go in the band behind the in-share pairs of
that rank (``scheduler.classes``), with the policy's own order inside each band. Nothing is
held back — an over-share tenant's calls run whenever no in-share call waits
(work-conserving), and an idle cluster serves whoever asks. So while all of them keep work
waiting, pairs of weights 2 and 1 get instance time 2 : 1 (each is admitted while it is
within a quantum of the least-served). A tenant that comes back after being idle starts
where it stood against the least-served active pair when it left, as EEVDF places a waking
task by the lag it slept with: a tenant that left behind comes back behind by as much, at most
``LAG_CAP_QUANTA`` quanta, and one that left ahead (or was never seen) starts no earlier than
the least-served. Idling itself earns nothing (the lag is frozen while it is away) and the
cap bounds what a tenant can bring back, so it cannot later flood with credit banked. Why
keep the lag at all: start-time fair queueing re-entered every returning tenant at the
least-served one's virtual time, so a light tenant whose queries come and go came back level
with a flooder that had used far more than its share meanwhile, and the flooder stayed in
the same band, beside the light tenant's calls, until it had run a quantum ahead again, on
every return (tenant grid, paper-4gpu fairness: 59% of the flooder's admissions in share).

A call stopped for a better class (``scheduler.preemption``), or retried after its instance
failed it, gets its admission charge back (``refund``): it is charged again when it is
admitted again, so its tenant pays once for the work, in the simulator and in serving alike
(both stop and retry calls through the coordinator).

A pair is also *present* between its queries, until it has been silent for a few of its own
mean gaps between arrivals (``present_pairs``), and ``outranked`` holds the over-share test
against the present pairs, each at the virtual time it would come back with: the fast lane
(``scheduler.fast_lane``) caps an outranked tenant's calls on the fastest instance while the
tenant it yields to is present, not only while that one is in flight.

Pure bookkeeping: the coordinator calls ``arrive``/``leave``/``charge`` and re-keys the
waiting calls of the tenants whose share flag flipped (``rekey_tenants``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentflow.slo_classes import DEFAULT_CLASS, SloClass, check_weight

if TYPE_CHECKING:
    from agentflow.scheduler.call import QueryState, ScheduledCall

# How far ahead (weighted instance seconds) a tenant may get before it yields: a few calls'
# worth, so two equal tenants alternate in runs of calls rather than flip on every call. The
# lag between two tenants that both keep work waiting is at most this plus one call. It is
# not what keeps a light tenant beside a flood above its time alone: on the tenant grid's
# fairness cells (agentflow bench tenant_cells --quantum) 1e-6, 10, 30 s and one query's work
# moved the light tenant's P95 / alone by up to 0.3 with no common direction; its LLM stages
# wait only 0.02-0.56 s in queue against 0.2-1.8 s more run time (co-running in the flood's
# batches, slower GPUs) than alone.
QUANTUM_S = 10.0
# How far behind the least-served pair a returning tenant may come back, in quanta: more than
# one, so that a pair that ran a quantum ahead while it was away is over its share the moment
# it returns (and yields to it until it has caught up), and bounded, so that idling banks at
# most this much (Linux's EEVDF clamps a sleeping task's lag at two slices for the same
# reason).
LAG_CAP_QUANTA = 2.0
ANONYMOUS = ""  # queries that name no tenant are one tenant
# A pair stays *present* (``present_pairs``) while it has a query in flight, and after its
# last one left until it has been silent for this many of its own mean gaps between arrivals:
# a tenant sending at its usual pace is still there in the pauses between its queries (in a
# Poisson stream 5% of gaps exceed three means), one that stopped sending leaves within a few
# of its own gaps, whatever its rate. Read by the fast lane (``scheduler.fast_lane``).
PRESENCE_GAPS = 3.0
GAP_SMOOTHING = 0.125  # weight of the newest gap in the mean (TCP's smoothed RTT weight)

TenantKey = tuple[str, str]  # (class name, tenant name)


@dataclass
class _Tenant:
    vt: float = 0.0
    active: int = 0  # its queries in flight in this class
    over: bool = False
    lag: float = 0.0  # how far behind the least-served active pair it left (>= 0, capped)
    last_arrival: float | None = None  # when its latest query arrived (presence)
    mean_gap: float | None = None  # smoothed gap between its arrivals (presence)


class TenantShares:
    """Per-(class, tenant) virtual time and the over-share flag derived from it."""

    def __init__(self, quantum_s: float = QUANTUM_S,
                 weights: Mapping[str, float] | None = None,
                 classes: Callable[[], Mapping[str, SloClass]] | None = None,
                 lag_cap_quanta: float = LAG_CAP_QUANTA):
        """``weights``: tenant name -> weight (absent: 1); ``classes``: the SLO classes in
        force (a callable: the coordinator's table may be replaced after it is built), for
        their ranks and weights; None: every class is its own rank, of weight 1;
        ``lag_cap_quanta``: the most a returning tenant brings back (0: start-time fair
        queueing, every return level with the least-served)."""
        if not quantum_s > 0:
            raise ValueError("quantum_s must be positive")
        if not lag_cap_quanta >= 0:
            raise ValueError("lag_cap_quanta must be >= 0")
        self.quantum_s = quantum_s
        self.lag_cap_quanta = lag_cap_quanta
        self.weights: dict[str, float] = {}
        self.set_weights(weights or {})
        self._classes = classes
        self._tenants: dict[TenantKey, _Tenant] = {}
        # pairs with a query in flight (``len(active_pairs())``, kept as ``active`` moves:
        # the coordinator asks at every admission whether two could meet)
        self._pairs_in_flight = 0
        # per group, the least-served virtual time when its last pair in flight left
        self._idle_floor: dict[object, float] = {}

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Tenant weights (name -> weight; others 1), each checked (``check_weight``)."""
        self.weights = {name: check_weight(w, f"tenant {name!r}") for name, w in
                        weights.items()}

    def group(self, cls: str) -> object:
        """Who a class's tenants compete with: every class of the same rank."""
        table = self._classes() if self._classes is not None else None
        if table is not None and cls in table:
            return ("rank", table[cls].rank)
        return ("class", cls)

    def class_weight(self, cls: str) -> float:
        table = self._classes() if self._classes is not None else None
        return table[cls].weight if table is not None and cls in table else 1.0

    @staticmethod
    def key(query: QueryState) -> TenantKey:
        return (query.slo_class or DEFAULT_CLASS, query.tenant or ANONYMOUS)

    def weight(self, tenant: str) -> float:
        w = self.weights.get(tenant, 1.0)
        if not w > 0:
            raise ValueError(f"tenant {tenant!r} has weight {w}; weights must be positive")
        return w

    def virtual_time(self, query: QueryState) -> float:
        t = self._tenants.get(self.key(query))
        return 0.0 if t is None else t.vt

    def over_share(self, query: QueryState) -> bool:
        return self.over_share_key(self.key(query))

    def over_share_key(self, key: TenantKey) -> bool:
        t = self._tenants.get(key)
        return t is not None and t.over

    def virtual_times(self) -> dict[TenantKey, float]:
        """Every (class, tenant) pair's virtual time so far (inspection, benchmarks)."""
        return {k: t.vt for k, t in self._tenants.items()}

    def pair_weight(self, key: TenantKey) -> float:
        return self.class_weight(key[0]) * self.weight(key[1])

    def active_classes(self) -> set[str]:
        """Classes with a query in flight."""
        return {cls for cls, _ in self.active_pairs()}

    def active_pairs(self) -> set[TenantKey]:
        """(class, tenant) pairs with a query in flight."""
        return {k for k, t in self._tenants.items() if t.active > 0}

    def pairs_in_flight(self) -> int:
        """``len(active_pairs())``, without building the set."""
        return self._pairs_in_flight

    def present_pairs(self, now: float) -> list[TenantKey]:
        """Pairs with a query in flight, or silent for less than ``PRESENCE_GAPS`` of their
        mean gap between arrivals (a pair seen once is present only while in flight)."""
        return [k for k, t in self._tenants.items() if t.active > 0 or (
            t.mean_gap is not None and t.last_arrival is not None
            and now - t.last_arrival < PRESENCE_GAPS * t.mean_gap)]

    def outranked(self, key: TenantKey, now: float) -> bool:
        """Whether another present pair comes before ``key``'s: one of a better class rank,
        or one of its rank that is more than a quantum behind it in virtual time (the
        over-share test, held against the pairs still present between their queries, each
        at the virtual time it would come back with: ``arrive``'s placement by its lag)."""
        me = self._tenants.get(key)
        if me is None:
            return False
        table = self._classes() if self._classes is not None else None
        my_rank = table[key[0]].rank if table is not None and key[0] in table else None
        group = self.group(key[0])
        floor = self._return_floor(group)  # where a pair not in flight would come back
        for other in self.present_pairs(now):
            if other == key:
                continue
            if self.group(other[0]) == group:
                t = self._tenants[other]
                back = t.vt if t.active > 0 or floor is None else max(t.vt, floor - t.lag)
                if back + self.quantum_s < me.vt:
                    return True
            elif my_rank is not None and table is not None and other[0] in table \
                    and table[other[0]].rank < my_rank:
                return True
        return False

    # ------------------------------------------------------------------------------ events
    def arrive(self, query: QueryState, now: float | None = None) -> list[TenantKey]:
        """A query of the tenant was admitted (at ``now``: for presence); returns the
        tenants whose flag flipped."""
        key = self.key(query)
        group = self.group(key[0])
        t = self._tenants.setdefault(key, _Tenant())
        if now is not None:
            if t.last_arrival is not None:
                gap = max(0.0, now - t.last_arrival)
                t.mean_gap = gap if t.mean_gap is None else \
                    (1 - GAP_SMOOTHING) * t.mean_gap + GAP_SMOOTHING * gap
            t.last_arrival = now
        if t.active == 0:
            floor = self._return_floor(group, exclude=key)
            if floor is not None and floor - t.lag > t.vt:
                t.vt = floor - t.lag  # its lag at leaving, no credit for the idle time
            t.lag = 0.0
            self._pairs_in_flight += 1
        t.active += 1
        return self._reflag(group)

    def leave(self, query: QueryState) -> list[TenantKey]:
        """A query of the tenant finished, failed or was cancelled."""
        key = self.key(query)
        t = self._tenants.get(key)
        if t is None or t.active == 0:
            return []
        t.active -= 1
        group = self.group(key[0])
        if t.active == 0:  # idle from now on: remember how far behind it leaves
            self._pairs_in_flight -= 1
            floor = self._least_active(group, exclude=key)
            if floor is None:  # the last one out: a tenant that comes back to the empty
                # group is placed against this, or it would bring back all it fell behind
                self._idle_floor[group] = max(t.vt, self._idle_floor.get(group, t.vt))
            behind = 0.0 if floor is None else floor - t.vt
            t.lag = min(max(0.0, behind), self.lag_cap_quanta * self.quantum_s)
        return self._reflag(group)

    def charge(self, query: QueryState, seconds: float) -> list[TenantKey]:
        """The tenant's call was admitted with ``seconds`` of expected instance time."""
        return self._add(self.key(query), max(0.0, seconds) / self.pair_weight(self.key(query)))

    def charge_call(self, call: ScheduledCall, seconds: float) -> list[TenantKey]:
        """``charge`` for an admitted call, remembered on it so that ``refund`` can take
        back exactly this charge (weights may have changed since)."""
        key = self.key(call.query)
        call.share_charge = max(0.0, seconds) / self.pair_weight(key)
        return self._add(key, call.share_charge)

    def refund(self, call: ScheduledCall) -> list[TenantKey]:
        """The call's run was stopped for a better class (``scheduler.preemption``) or
        failed and is retried, and will be admitted, and charged, again from its prompt:
        without this its tenant would pay twice for one unit of work, and fall behind its
        share for being preempted or for a broken instance."""
        charge, call.share_charge = call.share_charge, 0.0
        return self._add(self.key(call.query), -charge) if charge else []

    # ---------------------------------------------------------------------------- internals
    def _add(self, key: TenantKey, vt: float) -> list[TenantKey]:
        t = self._tenants.setdefault(key, _Tenant())
        t.vt += vt
        return self._reflag(self.group(key[0]))

    def _least_active(self, group: object, exclude: TenantKey | None = None) -> float | None:
        vts = [t.vt for k, t in self._tenants.items()
               if t.active > 0 and k != exclude and self.group(k[0]) == group]
        return min(vts) if vts else None

    def _return_floor(self, group: object, exclude: TenantKey | None = None) -> float | None:
        """What a pair coming back to ``group`` is placed against: the least-served pair in
        flight, else where the group stood when it emptied (None: never)."""
        floor = self._least_active(group, exclude=exclude)
        return self._idle_floor.get(group) if floor is None else floor

    def _reflag(self, group: object) -> list[TenantKey]:
        floor = self._least_active(group)
        flipped = []
        for k, t in self._tenants.items():
            if self.group(k[0]) != group:
                continue
            over = floor is not None and t.active > 0 and t.vt - floor > self.quantum_s
            if over != t.over:
                t.over = over
                flipped.append(k)
        return flipped


def rekey_tenants(coordinator: Any, flipped: Iterable[TenantKey], now: float) -> None:
    """Re-place the waiting calls of the tenants whose share flag flipped (their keys'
    band changed); every other key is untouched."""
    from agentflow.scheduler.call import CallState

    flipped = set(flipped)
    if not flipped:
        return
    shares: TenantShares = coordinator.fairness
    load = coordinator._class_load  # waiting work by band (scheduler.classes.ClassLoad)
    for query in list(coordinator.queries.values()):
        if shares.key(query) not in flipped:
            continue
        seen: set[str] = set()
        for call in sorted(query.calls, key=lambda c: c.seq):
            if call.state != CallState.WAITING or call.instance is None:
                continue
            if load is not None:
                load.move(call)
            if coordinator._queue_policy.per_query:
                if call.instance in seen:
                    continue
                seen.add(call.instance)
            coordinator.queues[call.instance].rekey(call, now, coordinator)
