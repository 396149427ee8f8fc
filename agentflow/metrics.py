"""The one vocabulary of serving metrics: percentiles, SLO attainment, throughput, goodput.

Every report (the simulator's summary, ``agentflow eval`` in both modes, the server's
/metrics) computes these here, so "met the SLO" means one thing everywhere:

* A query **meets** a latency limit when it was answered (``done``, or ``unsure``: the
  answer came back below the caller's ``min_confidence``, its SQL and rows attached) and its
  latency is within the limit. A failed, rejected or cancelled query never meets an SLO,
  however fast it came back (a quick failure is not a success).
* **Attainment** at scale ``s`` is the share of *all* queries (failed and rejected included)
  that meet ``s`` x their idle latency; the table keys are ``scale_key(s)`` ("1", "1.5",
  "2", "1.25" — one format for every report).
* **Goodput** is the highest arrival rate at which attainment at the chosen scale reaches a
  target (90% by default); ``meets_goodput_target`` is the test at one rate, the rate search
  lives with whoever can run a load (``agentflow.sim.experiment.goodput``).
* Latency percentiles are over the queries answered (``done`` or ``unsure``), numpy's
  linear rule.
* **Throughput** is answered queries per second of serving time: from the first arrival to
  the last answer, per session (a resumed evaluation does not count the time between).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SLO_SCALES = (1.0, 1.5, 2.0, 3.0, 5.0)
GOODPUT_TARGET = 0.9
MET_STATUS = "done"
# Statuses of a query that came back with an answer: an "unsure" one is served, only flagged.
ANSWERED = (MET_STATUS, "unsure")
_EPS = 1e-9  # a latency equal to its limit (up to float noise) meets it


@dataclass(frozen=True)
class Outcome:
    """What the metrics need of one query."""

    status: str  # done | failed | rejected | cancelled | ...
    latency_s: float | None
    idle_latency_s: float | None = None  # alone on an idle cluster (scaled SLOs)
    slo_s: float | None = None  # an absolute target, when the query had one

    @classmethod
    def of(cls, record: Any) -> Outcome:
        """From a dict (evaluation records) or an object with the same attributes."""
        get = record.get if isinstance(record, dict) else \
            (lambda key, default=None: getattr(record, key, default))
        return cls(str(get("status", "?")), get("latency_s"), get("idle_latency_s"),
                   get("slo_s"))


def scale_key(scale: float) -> str:
    """The key of an SLO scale in every attainment table: ``1``, ``1.5``, ``1.25``."""
    return f"{float(scale):g}"


def meets(status: str, latency_s: float | None, limit_s: float | None) -> bool:
    """Done within ``limit_s`` (see the module docstring)."""
    return (status in ANSWERED and latency_s is not None and limit_s is not None
            and latency_s <= limit_s + _EPS)


def met_slo(outcome: Outcome) -> bool | None:
    """Whether the query met its absolute SLO; None when it had none."""
    if outcome.slo_s is None:
        return None
    return meets(outcome.status, outcome.latency_s, outcome.slo_s)


def attainment(outcomes: Sequence[Outcome], scale: float) -> float | None:
    """Share of all ``outcomes`` done within ``scale`` x idle latency; None for none."""
    if not outcomes:
        return None
    met = sum(1 for o in outcomes if o.idle_latency_s is not None
              and meets(o.status, o.latency_s, scale * o.idle_latency_s))
    return met / len(outcomes)


def attainment_table(outcomes: Sequence[Outcome],
                     scales: Iterable[float] = SLO_SCALES) -> dict[str, float | None]:
    return {scale_key(s): attainment(outcomes, s) for s in scales}


def absolute_attainment(outcomes: Sequence[Outcome]) -> dict[str, Any] | None:
    """Met / total among the queries that had an absolute SLO (None if none had)."""
    with_slo = [o for o in outcomes if o.slo_s is not None]
    if not with_slo:
        return None
    met = sum(1 for o in with_slo if met_slo(o))
    return {"n": len(with_slo), "met": met, "attainment": met / len(with_slo)}


def meets_goodput_target(outcomes: Sequence[Outcome], scale: float,
                         target: float = GOODPUT_TARGET) -> bool:
    value = attainment(outcomes, scale)
    return value is not None and value >= target


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def latency_stats(values: Iterable[float | None]) -> dict[str, Any]:
    """n, mean, p50, p95, p99 and max of the values given (None entries skipped)."""
    vals = [float(v) for v in values if v is not None]
    return {"n": len(vals), "mean": float(np.mean(vals)) if vals else None,
            "p50": percentile(vals, 50), "p95": percentile(vals, 95),
            "p99": percentile(vals, 99), "max": max(vals) if vals else None}


def throughput(queries: Iterable[tuple[str, float | None, float | None, str]]
               ) -> tuple[float | None, float]:
    """(answered queries per second, serving seconds) from ``(session, arrival, finish,
    status)`` tuples; None when no time passed."""
    spans: dict[str, list[float]] = {}
    answered = 0
    for session, arrival, finish, status in queries:
        if arrival is None:
            continue
        span = spans.setdefault(str(session), [float("inf"), float("-inf")])
        span[0] = min(span[0], arrival)
        if status in ANSWERED and finish is not None:
            answered += 1
            span[1] = max(span[1], finish)
    total = sum(max(0.0, b - a) for a, b in spans.values() if b > float("-inf"))
    return (answered / total if total > 0 else None), total


def completed_latencies(outcomes: Sequence[Outcome]) -> list[float]:
    return [o.latency_s for o in outcomes if o.status in ANSWERED and o.latency_s is not None]
