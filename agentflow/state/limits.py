"""Tenant limits enforced across replicas: the same ``acquire``/``release`` as
``agentflow.tenants.TenantLimits``, with the bucket and the slots in the state store and
each check-and-take one transaction there, so N replicas admit N in flight, not N each."""

from __future__ import annotations

import threading

from agentflow.state.store import StateStore
from agentflow.tenants import LimitExceeded, Tenant


class StoreLimits:
    def __init__(self, store: StateStore, replica: str, lease_s: float):
        self.store = store
        self.replica = replica
        self.lease_s = lease_s
        self._held: dict[str, list[str]] = {}  # tenant -> slot tokens this replica holds
        self._lock = threading.Lock()
        self.rejected: dict[tuple[str, str], int] = {}

    def acquire(self, tenant: Tenant | None) -> bool:
        """Admit one query of ``tenant``; True when it holds a slot to ``release``."""
        if tenant is None or (tenant.max_concurrent is None and tenant.rate_per_min is None):
            return False
        token, kind, wait = self.store.acquire(
            tenant.name, replica=self.replica, lease_s=self.lease_s,
            max_concurrent=tenant.max_concurrent,
            rate_per_s=tenant.rate_per_min / 60.0 if tenant.rate_per_min else None,
            burst=tenant.burst)
        if kind:
            key = (tenant.name, kind)
            with self._lock:
                self.rejected[key] = self.rejected.get(key, 0) + 1
            if kind == "concurrency":
                raise LimitExceeded(f"tenant {tenant.name!r} has {tenant.max_concurrent} "
                                    "queries in flight (across replicas), its limit; retry "
                                    "when one has finished", wait, kind)
            raise LimitExceeded(f"tenant {tenant.name!r} is over its rate limit of "
                                f"{tenant.rate_per_min:g} queries per minute", wait, kind)
        if token is None:
            return False
        with self._lock:
            self._held.setdefault(tenant.name, []).append(token)
        return True

    def hold(self, tenant: str) -> None:
        """Take a slot without a check (a query moved here after its replica died)."""
        token = self.store.take_slot(tenant, self.replica)
        with self._lock:
            self._held.setdefault(tenant, []).append(token)

    def release(self, tenant: Tenant | str | None) -> None:
        if tenant is None:
            return
        name = tenant if isinstance(tenant, str) else tenant.name
        with self._lock:
            tokens = self._held.get(name)
            token = tokens.pop() if tokens else None
            if tokens == []:
                self._held.pop(name, None)
        if token is not None:  # queued: the engine's loop releases it as a query ends
            self.store.release(token, wait=False)

    def inflight(self, name: str) -> int:
        return self.store.inflight(name, self.lease_s)
