"""Tenants: who asked a question, what they may see, and how much they may ask.

Why a principal per key instead of "a valid key": a service shared by several users must keep
each user's questions, answers, conversations and results away from the others. Everything a
query produces is tagged with its tenant's name (``QueryHandle.tenant``); whoever looks it up
later must be that tenant or an admin, and anyone else is told it does not exist — the same
answer as for an id never issued, so ids cannot be probed.

Two ways to configure them, both read by the HTTP server and the MCP server:

- a plain list of keys (``AGENTFLOW_API_KEYS="k1,k2"``, ``server.api_keys``): each key is its
  own tenant, with no limits; ``AGENTFLOW_ADMIN_KEYS``/``server.admin_keys`` are admins;
- a mapping (``server.tenants`` in a serve config, or a YAML/JSON file named by
  ``server.tenants_file`` or ``AGENTFLOW_TENANTS``)::

      tenants:
        - name: acme
          keys: [...]            # or key_env: ACME_KEYS (comma-separated, kept out of files)
          databases: [shop]      # omitted: every database
          rate_per_min: 60       # queries started per minute (token bucket, burst = 1 min)
          max_concurrent: 4      # queries in flight at once
          slo_class: interactive # carried with each of its queries
          weight: 2              # share of instance time beside the other tenants of its
                                 # class rank while both wait (default 1; > 0)
          db_roles: {shop: acme} # PostgreSQL: SET ROLE acme for its SQL on shop (RLS), or
                                 # a login of its own: {shop: {url: ..., password_env: ...}}
        - {name: ops, key_env: OPS_KEYS, admin: true}

In the Python API ``tenant=`` takes a name or a ``Tenant``; ``None`` means no tenant (a local
caller, who sees everything, as a server without keys does).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

API_KEYS_ENV = "AGENTFLOW_API_KEYS"
ADMIN_KEYS_ENV = "AGENTFLOW_ADMIN_KEYS"
TENANTS_ENV = "AGENTFLOW_TENANTS"

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,63}$"


class DatabaseLogin(BaseModel):
    """A tenant's own PostgreSQL login for one database (its own pool). Stronger than a role
    on the shared pool: a statement can only ever switch to roles *this* login is a member
    of, so no SQL — not even one the guard misses, such as a quoted ``set_config('role',
    ...)`` — reaches another tenant's role. The URL is never shown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(repr=False)
    password_env: str | None = None
    passfile: str | None = None


class Tenant(BaseModel):
    """A principal: the rights and limits behind one or more API keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME)
    admin: bool = False  # sees every tenant's queries; may read /metrics
    databases: tuple[str, ...] | None = None  # None: every database the server serves
    rate_per_min: float | None = Field(None, gt=0)
    burst: int | None = Field(None, ge=1)  # bucket size; default: one minute's worth
    max_concurrent: int | None = Field(None, ge=1)
    slo_class: str | None = Field(None, min_length=1, max_length=64)
    # share of instance time among the tenants of its class rank (scheduler.fairness):
    # weights 2 and 1, both with work waiting, get instance time 2 : 1
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    # database id -> a role to SET on the shared pool, or a login of its own (PostgreSQL)
    db_roles: dict[str, str | DatabaseLogin] = Field(default_factory=dict)

    def may_use(self, db: str) -> bool:
        return self.databases is None or db in self.databases

    def sees(self, owner: str | None) -> bool:
        return self.admin or owner == self.name

    def db_role(self, db: str) -> str | DatabaseLogin | None:
        return self.db_roles.get(db)


class TenantEntry(Tenant):
    """A tenant as configured: the tenant plus the keys that stand for it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys: tuple[str, ...] = ()
    key_env: str | None = None  # an environment variable holding comma-separated keys

    @model_validator(mode="after")
    def _has_keys(self) -> TenantEntry:
        if not self.keys and not self.key_env:
            raise ValueError(f"tenant {self.name!r} has no keys: give keys or key_env")
        return self

    def all_keys(self) -> list[str]:
        keys = [k.strip() for k in self.keys if k.strip()]
        if self.key_env:
            value = os.environ.get(self.key_env)
            if value is None:
                raise ValueError(f"tenant {self.name!r}: environment variable {self.key_env} "
                                 "(its API keys) is not set")
            keys += [k.strip() for k in value.split(",") if k.strip()]
        if not keys:
            raise ValueError(f"tenant {self.name!r} has no keys")
        return keys

    def tenant(self) -> Tenant:
        return Tenant(**self.model_dump(exclude={"keys", "key_env"}))


def as_tenant(tenant: str | Tenant | None) -> Tenant | None:
    """What the Python API accepts as ``tenant=``: a name, a ``Tenant`` or ``None``."""
    if tenant is None or isinstance(tenant, Tenant):
        return tenant
    if isinstance(tenant, str):
        return Tenant(name=tenant)
    raise TypeError(f"tenant must be a name or a Tenant, got {type(tenant).__name__}")


def sees(viewer: Tenant | None, owner: str | None) -> bool:
    """Whether ``viewer`` may see an object owned by ``owner`` (``None`` viewer: no keys)."""
    return viewer is None or viewer.sees(owner)


def owner_of(viewer: Tenant | None) -> str | None:
    """The owner name to store on an object ``viewer`` creates."""
    return viewer.name if viewer is not None else None


def key_of(headers: Any) -> str | None:
    """The API key a request sends: ``X-API-Key``, else an ``Authorization: Bearer`` token
    (``headers``: any case-insensitive mapping, e.g. Starlette's)."""
    key = headers.get("x-api-key")
    if key:
        return key
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def key_tenant_name(key: str) -> str:
    """The tenant name of a plain-list key: stable, and reveals nothing usable of the key."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:10]


class TenantTable:
    """API key -> tenant. Empty: keys are off (the server is open, as on a laptop)."""

    def __init__(self, entries: list[tuple[str, Tenant]] | None = None):
        self._entries: list[tuple[bytes, Tenant]] = []
        seen: dict[str, str] = {}
        for key, tenant in entries or []:
            if key in seen and seen[key] != tenant.name:
                raise ValueError(f"one API key is given to two tenants ({seen[key]!r} and "
                                 f"{tenant.name!r})")
            seen[key] = tenant.name
            self._entries.append((key.encode(), tenant))

    @classmethod
    def build(cls, keys: Sequence[str] = (), admin_keys: Sequence[str] = (),
              tenants: Sequence[TenantEntry] = (),
              admin_limits: Mapping[str, Any] | None = None) -> TenantTable:
        """``admin_limits`` (``rate_per_min``, ``max_concurrent``) go to every admin key and
        to each configured admin tenant that sets neither limit itself: an admin key
        flooding took B's P95 to 44 s when admins had no limits at all."""
        limits = {k: v for k, v in (admin_limits or {}).items() if v is not None}
        entries: list[tuple[str, Tenant]] = []
        for key in keys:
            entries.append((key, Tenant(name=key_tenant_name(key))))
        for key in admin_keys:
            entries.append((key, Tenant(name=key_tenant_name(key), admin=True, **limits)))
        names: set[str] = set()
        for entry in tenants:
            if entry.name in names:
                raise ValueError(f"tenant {entry.name!r} is configured twice")
            names.add(entry.name)
            tenant = entry.tenant()
            if tenant.admin and tenant.rate_per_min is None and tenant.max_concurrent is None:
                tenant = tenant.model_copy(update=limits)
            entries += [(key, tenant) for key in entry.all_keys()]
        return cls(entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: str) -> Tenant | None:
        """The tenant of ``key``, comparing against every key in constant time (timing must
        not reveal how much of a key matched, nor which one)."""
        candidate = key.encode()
        found = None
        for known, tenant in self._entries:
            if hmac.compare_digest(candidate, known):
                found = tenant
        return found

    def tenants(self) -> list[Tenant]:
        out: dict[str, Tenant] = {}
        for _, tenant in self._entries:
            out.setdefault(tenant.name, tenant)
        return list(out.values())


def check_against_catalog(table: TenantTable, catalog: Any,
                          slo_classes: Mapping[str, Any] | None = None) -> None:
    """Fail at start-up, naming the tenant, when a ``db_roles`` entry names a database the
    catalog does not serve or one that is not PostgreSQL (roles are PostgreSQL's), or when
    its ``slo_class`` is not one of ``slo_classes`` (the config's), rather than failing that
    tenant's first query."""
    for tenant in table.tenants():
        if (slo_classes is not None and tenant.slo_class is not None
                and tenant.slo_class not in slo_classes):
            raise ValueError(f"tenant {tenant.name!r}: unknown SLO class "
                             f"{tenant.slo_class!r}; choose from {', '.join(sorted(slo_classes))}")
        for db in tenant.db_roles:
            if db not in catalog.ids:
                raise ValueError(f"tenant {tenant.name!r}: db_roles names database {db!r}, "
                                 "which this server does not serve")
            engine = catalog.engine_of(db)
            if engine != "postgresql":
                raise ValueError(f"tenant {tenant.name!r}: db_roles for {db!r} needs "
                                 f"PostgreSQL (it is {engine})")


def share_weights(table: TenantTable) -> dict[str, float]:
    """Tenant name -> its share weight, for the tenants whose weight is not 1."""
    return {t.name: t.weight for t in table.tenants() if t.weight != 1.0}


def apply_share_weights(table: TenantTable, router: Any) -> None:
    """Give the scheduler the tenants' weights (``scheduler.fairness``); a router without a
    scheduler (calls sent straight to one backend) has no shares to weigh."""
    from agentflow.scheduler.serving import ScheduledRouter

    if isinstance(router, ScheduledRouter):
        router.coordinator.fairness.set_weights(share_weights(table))
    elif hasattr(router, "set_share_weights"):  # sharded: every shard weighs its tenants
        router.set_share_weights(share_weights(table))


def env_keys(name: str) -> list[str]:
    return [k.strip() for k in os.environ.get(name, "").split(",") if k.strip()]


def load_tenants_file(path: str | Path) -> list[TenantEntry]:
    """Read ``tenants:`` (a list of tenant entries) from a YAML/JSON file."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"tenants file not found: {path}")
    data: Any = yaml.safe_load(path.read_text()) or {}
    if isinstance(data, dict):
        data = data.get("tenants", [])
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected 'tenants:' with a list of tenants")
    try:
        return [TenantEntry.model_validate(item) for item in data]
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


# --------------------------------------------------------------------------- limits
class LimitExceeded(Exception):
    """A tenant is over its rate or concurrency limit; retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float, kind: str):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.kind = kind  # "rate" or "concurrency"


class _Bucket:
    def __init__(self, rate_per_s: float, size: float, now: float):
        self.rate_per_s = rate_per_s
        self.size = size
        self.tokens = size
        self.at = now

    def take(self, now: float) -> float:
        """Take a token; 0.0 if one was there, else the seconds until one will be."""
        self.tokens = min(self.size, self.tokens + (now - self.at) * self.rate_per_s)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate_per_s


class TenantLimits:
    """Per-tenant admission: a token bucket (queries per minute) and a bound on queries in
    flight. ``acquire`` either admits (the caller must ``release`` when the query ends) or
    raises ``LimitExceeded`` with how long to wait. Thread-safe; the clock is injected."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._inflight: dict[str, int] = {}
        self._lock = threading.Lock()
        self.rejected: dict[tuple[str, str], int] = {}

    def acquire(self, tenant: Tenant | None) -> bool:
        """Admit one query of ``tenant``; True when it holds a concurrency slot to release."""
        if tenant is None:
            return False
        with self._lock:
            held = self._inflight.get(tenant.name, 0)
            if tenant.max_concurrent is not None and held >= tenant.max_concurrent:
                self._count(tenant, "concurrency")
                raise LimitExceeded(
                    f"tenant {tenant.name!r} has {held} queries in flight, its limit; retry "
                    f"when one has finished", 1.0, "concurrency")
            if tenant.rate_per_min is not None:
                now = self.clock()
                bucket = self._buckets.get(tenant.name)
                rate = tenant.rate_per_min / 60.0
                size = float(tenant.burst or max(1, math.floor(tenant.rate_per_min)))
                if bucket is None or bucket.rate_per_s != rate or bucket.size != size:
                    bucket = self._buckets[tenant.name] = _Bucket(rate, size, now)
                wait = bucket.take(now)
                if wait > 0:
                    self._count(tenant, "rate")
                    raise LimitExceeded(
                        f"tenant {tenant.name!r} is over its rate limit of "
                        f"{tenant.rate_per_min:g} queries per minute", wait, "rate")
            if tenant.max_concurrent is None:
                return False
            self._inflight[tenant.name] = held + 1
            return True

    def release(self, tenant: Tenant | None) -> None:
        """Give back the slot ``acquire`` gave ``tenant`` (nothing for no tenant)."""
        if tenant is None:
            return
        with self._lock:
            left = self._inflight.get(tenant.name, 0) - 1
            if left > 0:
                self._inflight[tenant.name] = left
            else:
                self._inflight.pop(tenant.name, None)

    def inflight(self, name: str) -> int:
        with self._lock:
            return self._inflight.get(name, 0)

    def _count(self, tenant: Tenant, kind: str) -> None:
        key = (tenant.name, kind)
        self.rejected[key] = self.rejected.get(key, 0) + 1


__all__ = ["ADMIN_KEYS_ENV", "API_KEYS_ENV", "DatabaseLogin", "LimitExceeded", "TENANTS_ENV",
           "Tenant",
           "TenantEntry", "TenantLimits", "TenantTable", "apply_share_weights", "as_tenant",
           "check_against_catalog",
           "env_keys", "key_of", "key_tenant_name", "load_tenants_file", "owner_of", "sees"]
