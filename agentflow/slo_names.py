"""One SLO, two names: ``slo`` (Python, CLI ``--slo``) and ``slo_seconds`` (HTTP, MCP).

A user moving between interfaces types the other one; every interface takes both, as plain
aliases (neither is deprecated), and refuses a request that gives both with different values
rather than silently picking one.
"""

from __future__ import annotations

from agentflow.errors import InvalidRequest


def one_slo(slo: float | None, slo_seconds: float | None) -> float | None:
    if slo is not None and slo_seconds is not None and slo != slo_seconds:
        raise InvalidRequest(f"the SLO is given twice (slo={slo!r}, slo_seconds="
                             f"{slo_seconds!r}); they are the same setting: give one")
    return slo if slo is not None else slo_seconds
