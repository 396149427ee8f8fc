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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


def resolve_class(name: str | None, classes: Mapping[str, SloClass] | None = None) -> SloClass:
    """The class called ``name`` (None: the default class); a clear error for an unknown one."""
    table = DEFAULT_SLO_CLASSES if classes is None else classes
    key = DEFAULT_CLASS if name is None else name
    if key not in table:
        raise ValueError(f"unknown SLO class {key!r}; choose from {', '.join(sorted(table))}")
    return table[key]


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
