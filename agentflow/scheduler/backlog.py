"""Admission by backlog: refuse a query the cluster cannot reach within its SLO.

A count limit (``max_active_queries``) says nothing about time: on a CPU cluster where one
pipeline takes minutes, 40 queries are an hour of work, yet all 40 were admitted and every
one of them missed its target. Here the coordinator estimates how long its up instances need
to clear the work already committed — calls waiting or running on each instance (``W_i``),
plus the expected LLM time of admitted queries that have not sent a call yet — and refuses a
new query when that alone exceeds its SLO (or ``max_backlog_s`` for a query without one):
whatever the order, it would wait out its whole budget behind work admitted before it. The
refusal carries a Retry-After of when the backlog should have shrunk enough.

Pure functions of the coordinator's state and the injected clock's ``now``; the simulator
drives the same code when its coordinator is built with the same settings.
"""

from __future__ import annotations

from typing import Any


def pending_query_s(coordinator: Any, query: Any, now: float) -> float:
    """Expected LLM seconds of an admitted query that has no call in a queue yet, by the
    coordinator's own estimate (its time models and length predictor, over the query's
    workflow graph): the work that is committed but not yet in any ``W_i``."""
    if query.calls or query.done_nodes or query.run is None:
        return 0.0  # its calls are in W (queued/running) or already done
    coordinator._critical_paths(query, now)  # sets work_left; cheap for a fresh query
    return float(query.work_left)


def backlog_clear_s(coordinator: Any, now: float) -> float:
    """Seconds the up instances need to clear the committed work, sharing it evenly."""
    up = coordinator.up_instances
    if not up:
        return float("inf")
    work = coordinator.work_vector(now)
    queued = sum(float(work[coordinator._index[name]]) for name in up)
    pending = sum(pending_query_s(coordinator, q, now) for q in coordinator.queries.values())
    return (queued + pending) / len(up)


def backlog_rejection(coordinator: Any, now: float, deadline: float | None,
                      max_backlog_s: float | None) -> tuple[str, float] | None:
    """(reason, retry_after_s) when a query arriving at ``now`` with ``deadline`` should be
    refused; None to admit it."""
    budget = (deadline - now) if deadline is not None else max_backlog_s
    if budget is None:
        return None
    clear = backlog_clear_s(coordinator, now)
    if clear <= budget:
        return None
    what = "its SLO" if deadline is not None else "the backlog limit"
    return (f"overloaded: the instances need about {clear:.0f} s to clear the work already "
            f"admitted, more than {what} ({budget:.0f} s)",
            max(1.0, min(clear - budget, 3600.0)))
