"""Tenants share fairly within a class: per-tenant virtual time in front of the queue keys.

Without it, one tenant's flood is everyone's latency: ``flowsage`` ranks the query most
likely to miss its deadline first, and under a flood the flooder's queries are exactly
those — they take the instances while a light tenant's fresh queries wait behind them.

Each (class, tenant) keeps a virtual time: the instance seconds its calls were admitted
with (the coordinator's own expected time on the chosen instance, what serving knows at
admission), divided by the tenant's weight. Among the tenants of a class with queries in
flight, one whose virtual time is more than ``quantum_s`` ahead of the least-served one is
*over its share*: its calls go in the band behind the in-share tenants of the same class
(``scheduler.classes``), with the policy's own order inside each band. Nothing is held back
— an over-share tenant's calls run whenever no in-share call waits (work-conserving), and an
idle cluster serves whoever asks. A tenant that comes back after being idle starts at the
least-served active tenant's virtual time (start-time fair queueing), so idling banks no
credit it could later flood with.

Pure bookkeeping: the coordinator calls ``arrive``/``leave``/``charge`` and re-keys the
waiting calls of the tenants whose share flag flipped (``rekey_tenants``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentflow.slo_classes import DEFAULT_CLASS

if TYPE_CHECKING:
    from agentflow.scheduler.call import QueryState

# How far ahead (weighted instance seconds) a tenant may get before it yields: a few calls'
# worth, so two equal tenants alternate in runs of calls rather than flip on every call.
QUANTUM_S = 10.0
ANONYMOUS = ""  # queries that name no tenant are one tenant

TenantKey = tuple[str, str]  # (class name, tenant name)


@dataclass
class _Tenant:
    vt: float = 0.0
    active: int = 0  # its queries in flight in this class
    over: bool = False


class TenantShares:
    """Per-(class, tenant) virtual time and the over-share flag derived from it."""

    def __init__(self, quantum_s: float = QUANTUM_S,
                 weights: Mapping[str, float] | None = None):
        if not quantum_s > 0:
            raise ValueError("quantum_s must be positive")
        self.quantum_s = quantum_s
        self.weights: dict[str, float] = dict(weights or {})
        self._tenants: dict[TenantKey, _Tenant] = {}

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

    def active_classes(self) -> set[str]:
        """Classes with a query in flight."""
        return {k[0] for k, t in self._tenants.items() if t.active > 0}

    # ------------------------------------------------------------------------------ events
    def arrive(self, query: QueryState) -> list[TenantKey]:
        """A query of the tenant was admitted; returns the tenants whose flag flipped."""
        key = self.key(query)
        t = self._tenants.setdefault(key, _Tenant())
        if t.active == 0:
            floor = self._least_active(key[0], exclude=key)
            if floor is not None and floor > t.vt:
                t.vt = floor  # no credit banked while idle
        t.active += 1
        return self._reflag(key[0])

    def leave(self, query: QueryState) -> list[TenantKey]:
        """A query of the tenant finished, failed or was cancelled."""
        key = self.key(query)
        t = self._tenants.get(key)
        if t is None or t.active == 0:
            return []
        t.active -= 1
        return self._reflag(key[0])

    def charge(self, query: QueryState, seconds: float) -> list[TenantKey]:
        """The tenant's call was admitted with ``seconds`` of expected instance time."""
        key = self.key(query)
        t = self._tenants.setdefault(key, _Tenant())
        t.vt += max(0.0, seconds) / self.weight(key[1])
        return self._reflag(key[0])

    # ---------------------------------------------------------------------------- internals
    def _least_active(self, cls: str, exclude: TenantKey | None = None) -> float | None:
        vts = [t.vt for k, t in self._tenants.items()
               if k[0] == cls and t.active > 0 and k != exclude]
        return min(vts) if vts else None

    def _reflag(self, cls: str) -> list[TenantKey]:
        floor = self._least_active(cls)
        flipped = []
        for k, t in self._tenants.items():
            if k[0] != cls:
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
