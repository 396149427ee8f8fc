"""Which SLO class a query runs in, and the deadline that follows from it.

Why one place: the HTTP server, the MCP server, the Python API and ``agentflow eval`` all
build queries, and each must answer the same two questions the same way — which class (the
request's, else the tenant's from its API key, else the default) and which deadline (the
request's SLO, else the class's ``slo_seconds``, else the configured default) — or a query's
class would depend on the door it came in by. The class table itself lives in
``agentflow.slo_classes`` (the scheduler reads it); this module only chooses from it and
builds it from configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflow.errors import InvalidRequest
from agentflow.slo_classes import DEFAULT_CLASS, DEFAULT_SLO_CLASSES, SloClass


class UnknownSloClassError(InvalidRequest):
    """A request (or a tenant's configuration) names a class the server does not have."""

    def __init__(self, name: str, classes: Mapping[str, SloClass]):
        self.name = name
        self.classes = sorted(classes)
        super().__init__(f"unknown SLO class {name!r}; choose from {', '.join(self.classes)}")


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
    name = requested if requested is not None else tenant_class
    key = DEFAULT_CLASS if name is None else name
    if key not in classes:
        raise UnknownSloClassError(key, classes)
    chosen = classes[key]
    if ceiling and requested is not None:
        own = classes.get(tenant_class or DEFAULT_CLASS)
        if own is not None and chosen.rank < own.rank:
            raise SloClassNotAllowedError(chosen.name, own.name)
    return chosen


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


__all__ = ["SloClassNotAllowedError", "UnknownSloClassError", "choose_class", "class_table",
           "deadline_s"]
