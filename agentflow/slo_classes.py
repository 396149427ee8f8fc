"""SLO classes: what kind of wait a query's user is in.

An ``agentflow eval`` run (hundreds of questions, nobody watching each) and a person waiting on
the page share one cluster. Treating them alike lets the run's flood become everyone's latency;
a class says which is which, so the scheduler can rank, budget and shed by it. Every query
carries one class name (request field, the tenant's default, ``eval --slo-class``); the
scheduler resolves it here.

Lower ``rank`` is served first and shed last; it is also the per-request ``priority`` sent to
vLLM (whose priority scheduling handles lower values first). ``slo_seconds`` is the deadline a
query of the class gets when its request names none (None: no deadline). ``weight`` is the
class's share of instance time when classes of equal rank compete: each (class, tenant) is
charged instance seconds over class weight x tenant weight (``scheduler.fairness``), so with
one tenant each, classes of weights 2 and 1 at one rank get instance time 2 : 1 while both
wait. Classes of different ranks never share: rank is strict.

Which class and deadline a query gets is chosen here too (``choose_class``, ``deadline_s``):
the HTTP server, the MCP server, the Python API and ``agentflow eval`` all build queries, and
each must answer the same way — the request's class, else the tenant's from its API key, else
the default; the request's SLO, else the class's ``slo_seconds``, else the configured default —
or a query's class would depend on the door it came in by. How the scheduler ranks, budgets
and sheds by class is ``agentflow.scheduler.classes``.

One SLO has two names: ``slo`` (Python, CLI ``--slo``) and ``slo_seconds`` (HTTP, MCP). A
user moving between interfaces types the other one; every interface takes both, as plain
aliases (neither is deprecated), and refuses a request that gives both with different values
(``one_slo``) rather than silently picking one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentflow.errors import InvalidRequest

# the metrics label (``slo_class``) of every class a server is not configured with; no class
# may take the name, or its queries would be counted with the unconfigured ones
UNKNOWN_CLASS = "unknown"


class SloClass(BaseModel):
    """One class of service (configurable under ``scheduler.slo_classes``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    rank: int = Field(0, ge=0, le=100, description="lower is served first and shed last")
    slo_seconds: float | None = Field(None, gt=0, description="default deadline; None: none")
    weight: float = Field(1.0, gt=0, allow_inf_nan=False,
                          description="share of instance time among equal ranks")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name == UNKNOWN_CLASS:
            raise ValueError(f"the class name {UNKNOWN_CLASS!r} is reserved: it labels, in "
                             "/metrics, queries of classes the server is not configured with")
        return name


DEFAULT_CLASS = "standard"
DEFAULT_SLO_CLASSES: dict[str, SloClass] = {
    c.name: c for c in (
        SloClass(name="interactive", rank=0, weight=1.0),
        SloClass(name="standard", rank=1, weight=1.0),
        SloClass(name="batch", rank=2, weight=1.0),
    )
}


class UnknownSloClassError(InvalidRequest):
    """A request (or a tenant's configuration) names a class the server does not have."""

    def __init__(self, name: str, classes: Mapping[str, SloClass]):
        self.name = name
        self.classes = sorted(classes)
        super().__init__(f"unknown SLO class {name!r}; choose from {', '.join(self.classes)}")


def resolve_class(name: str | None, classes: Mapping[str, SloClass] | None = None) -> SloClass:
    """The class called ``name`` (None: the default class); ``UnknownSloClassError`` (a
    ``ValueError``) for an unknown one."""
    table = DEFAULT_SLO_CLASSES if classes is None else classes
    key = DEFAULT_CLASS if name is None else name
    if key not in table:
        raise UnknownSloClassError(key, table)
    return table[key]


class SloClassNotAllowedError(InvalidRequest):
    """A tenant asked for a class ranked above its own: its class is a ceiling."""

    def __init__(self, name: str, ceiling: str):
        self.name = name
        self.ceiling = ceiling
        super().__init__(f"SLO class {name!r} is ranked above this key's class {ceiling!r}; "
                         f"a request may ask for {ceiling!r} or a class ranked below it")


def choose_class(requested: str | None, tenant_class: str | None,
                 classes: Mapping[str, SloClass], *, ceiling: bool = False) -> SloClass:
    """The request's class, else the tenant's default, else ``DEFAULT_CLASS``.

    With ``ceiling`` (a tenant's request, not an admin's) the tenant's class (else the
    default) is the best it may have: a ``standard`` key asking for ``interactive`` would
    otherwise be served ahead of every standard tenant. Asking for a lower class is fine."""
    chosen = resolve_class(requested if requested is not None else tenant_class, classes)
    if ceiling and requested is not None:
        own = classes.get(tenant_class or DEFAULT_CLASS)
        if own is not None and chosen.rank < own.rank:
            raise SloClassNotAllowedError(chosen.name, own.name)
    return chosen


def check_weight(value: Any, what: str) -> float:
    """A share weight as a float, or a clear error: a weight is a positive, finite number
    (0 would mean "never served", which work-conservation contradicts; use a class rank)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{what}: weight {value!r} is not a number")
    try:
        w = float(value)
    except ValueError:
        raise ValueError(f"{what}: weight {value!r} is not a number") from None
    if not (w > 0 and math.isfinite(w)):
        raise ValueError(f"{what}: weight must be a positive number, got {value!r}")
    return w


def deadline_s(requested_slo: float | None, slo_class: SloClass,
               default_slo: float | None) -> float | None:
    """The query's SLO in seconds: given, else the class's, else the configured default."""
    if requested_slo is not None:
        return requested_slo
    if slo_class.slo_seconds is not None:
        return slo_class.slo_seconds
    return default_slo


def class_table(configured: Mapping[str, Mapping[str, Any]] | None) -> dict[str, SloClass]:
    """``scheduler.slo_classes`` (name -> SloClass fields) over the defaults.

    A configured name that is also a default changes only the fields it gives (``batch:
    {slo_seconds: 900}`` keeps batch's rank); a new name starts from SloClass's own defaults.
    The default class must stay: a query that names none runs in it."""
    table = dict(DEFAULT_SLO_CLASSES)
    for name, fields in (configured or {}).items():
        if not isinstance(fields, Mapping):
            raise ValueError(f"slo_classes.{name}: expected a mapping of SloClass fields "
                             f"(rank, slo_seconds, weight), got {type(fields).__name__}")
        if "name" in fields and fields["name"] != name:
            raise ValueError(f"slo_classes.{name}: its name field says {fields['name']!r}")
        base = table[name].model_dump() if name in table else {}
        table[name] = SloClass.model_validate({**base, **fields, "name": name})
    return table


def one_slo(slo: float | None, slo_seconds: float | None) -> float | None:
    if slo is not None and slo_seconds is not None and slo != slo_seconds:
        raise InvalidRequest(f"the SLO is given twice (slo={slo!r}, slo_seconds="
                             f"{slo_seconds!r}); they are the same setting: give one")
    return slo if slo is not None else slo_seconds
