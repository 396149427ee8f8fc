"""Admission by backlog: refuse a query the cluster cannot reach within its SLO.

A count limit (``max_active_queries``) says nothing about time: on a CPU cluster where one
pipeline takes minutes, 40 queries are an hour of work, yet all 40 were admitted and every
one of them missed its target. Here the coordinator estimates how long its up instances need
to clear the work already committed — calls waiting or running on each instance (``W_i``),
plus the expected LLM time of admitted queries that have not sent a call yet — and refuses a
new query when that alone exceeds its SLO (or ``max_backlog_s`` for a query without one):
whatever the order, it would wait out its whole budget behind work admitted before it. The
refusal carries a Retry-After of when the backlog should have shrunk enough.

With SLO classes ranked in the queue (``scheduler.classes``) a query waits only behind work
of its own class or a higher one, so only that counts against its budget: a batch flood
fills the backlog of batch, and batch is refused first, while an interactive query still
gets in. A query of a class with no deadline (batch) is held to ``max_backlog_s``.

Deadline-aware admission (``deadline_admission``, off by default) goes one step further:
a query whose own remaining critical path, started once the work ahead of it has cleared,
ends past its deadline is refused at once with ``would_miss_deadline`` and the earliest SLO
that would be feasible now (``DeadlineRejected``) — or moved to the lowest class — instead
of taking capacity from queries that can still make it.

Pure functions of the coordinator's state and the injected clock's ``now``; the simulator
drives the same code when its coordinator is built with the same settings.
"""

from __future__ import annotations

import math
from typing import Any

from agentflow.scheduler.call import CallState
from agentflow.scheduler.classes import call_band, ranks_by_class
from agentflow.scheduler.decisions import QueryRejected


def pending_query_s(coordinator: Any, query: Any, now: float) -> float:
    """Expected LLM seconds of an admitted query that has no call in a queue yet, by the
    coordinator's own estimate (its time models and length predictor, over the query's
    workflow graph): the work that is committed but not yet in any ``W_i``."""
    if query.calls or query.done_nodes or query.run is None:
        return 0.0  # its calls are in W (queued/running) or already done
    coordinator._critical_paths(query, now)  # sets work_left; cheap for a fresh query
    return float(query.work_left)


def measured_factor(model: Any) -> float | None:
    """Observed over priced seconds of an instance's last finished calls
    (``InstanceTimeModel.recent_calls``), each priced by the model as it stands now; None
    before its first answer. Sums, not a mean of ratios: the long calls, which hold the
    backlog, weigh the most."""
    seen = priced = 0.0
    for uncached, output, total_s in model.recent_calls:
        seen += total_s
        priced += model.expected_s(uncached, output)
    if not model.recent_calls or priced <= 0.0:
        return None
    return seen / priced


def measured_speed_factors(coordinator: Any, up: list[str]) -> dict[str, float]:
    """Per up instance of guessed speed (``InstanceSpec.speed_known`` false), what its
    priced seconds are worth in measured ones (``measured_factor``; an instance that has
    answered nothing takes its answered peers' pooled factor); instances not listed count
    at 1.

    Why: the learned ratios stop at ``RATIO_FLOOR`` / ``RATIO_CEILING`` so that no single
    odd call swings a real engine's estimate 20x. A scripted backend answering in 5 ms is
    priced by the CPU constants at >= 5% of llama.cpp's speed anyway, ~15x what it takes,
    and 60 simultaneous queries on two such instances made a backlog of minutes and were
    refused. Where the speed was a guess to begin with, what the instance measured is the
    only price there is."""
    models = coordinator.time_models
    factors: dict[str, float] = {}
    missing: list[str] = []
    seen = priced = 0.0
    for name in up:
        if coordinator.queues[name].spec.speed_known:
            continue
        model = models[name]
        f = measured_factor(model)
        if f is None:
            missing.append(name)
            continue
        factors[name] = f
        for uncached, output, total_s in model.recent_calls:
            seen += total_s
            priced += model.expected_s(uncached, output)
    if missing and priced > 0.0:
        pooled = seen / priced
        for name in missing:
            factors[name] = pooled
    return factors


def backlog_clear_s(coordinator: Any, now: float, band: int | None = None) -> float:
    """Seconds the up instances need to clear the committed work, sharing it evenly; with
    ``band``, only the work a query in that band waits behind
    (``work_ahead_excluded_s``). Instances of guessed speed count at what they measured
    (``measured_speed_factors``); work not yet on an instance at the up instances' mean."""
    up = coordinator.up_instances
    if not up:
        return float("inf")
    work = coordinator.work_vector(now)
    factors = measured_speed_factors(coordinator, up)
    queued = sum(float(work[coordinator._index[name]]) * factors.get(name, 1.0)
                 for name in up)
    spread = (sum(factors.values()) + len(up) - len(factors)) / len(up) if factors else 1.0
    pending = spread * sum(pending_query_s(coordinator, q, now)
                           for q in coordinator.queries.values())
    if band is not None:
        excluded = work_ahead_excluded_s(coordinator, band, now, factors, spread)
        if excluded > 0:
            return max(0.0, queued + pending - excluded) / len(up)
    return (queued + pending) / len(up)


def work_ahead_excluded_s(coordinator: Any, band: int, now: float,
                          factors: dict[str, float] | None = None,
                          spread: float = 1.0) -> float:
    """Expected seconds of committed work a new query in ``band`` does not wait behind (0
    unless the queue ranks by class): waiting calls of worse bands (lower classes, tenants
    over their share), and such queries with no call out yet. Running calls count — they
    hold their slots. ``factors`` / ``spread``: as ``backlog_clear_s`` prices them."""
    if not ranks_by_class(coordinator._queue_policy):
        return 0.0
    factors = factors or {}
    excluded = 0.0
    for query in coordinator.queries.values():
        if call_band(coordinator, query) <= band:
            continue
        for call in query.calls:
            if call.state == CallState.WAITING and call.instance is not None:
                excluded += (coordinator.expected_s(call, call.instance)
                             * factors.get(call.instance, 1.0))
        excluded += spread * pending_query_s(coordinator, query, now)
    return excluded


def speed_unmeasured(coordinator: Any) -> bool:
    """Whether an up instance's speed is still a guess: no hardware profile and a backend the
    CPU constants were not measured on (``InstanceSpec.speed_known``), and neither it nor a
    peer of it (``ClusterView._borrowed``) has finished a call. Then the backlog in
    seconds is a guess too — the CPU constants price a scripted instance that answers in
    0.2 s at several seconds a call (issue 39: 2 and 4 of 10 queries refused on a near-idle
    scripted cluster) — so nothing is refused on it; the count limits still hold, and the
    first answer makes the estimate real for the instance and its peers."""
    models = coordinator.time_models
    return any(not q.spec.speed_known and not models[name].observations
               and coordinator._borrowed(coordinator._index[name], models[name]) is None
               for name, q in coordinator.queues.items() if q.up)


def backlog_rejection(coordinator: Any, now: float, deadline: float | None,
                      max_backlog_s: float | None, band: int | None = None
                      ) -> tuple[str, float] | None:
    """(reason, retry_after_s) when a query arriving at ``now`` with ``deadline`` (of class
    ``band``, ``scheduler.classes.call_band``) should be refused; None to admit it."""
    budget = (deadline - now) if deadline is not None else max_backlog_s
    if budget is None or speed_unmeasured(coordinator):
        return None
    clear = backlog_clear_s(coordinator, now, band)
    if clear <= budget:
        return None
    what = "its SLO" if deadline is not None else "the backlog limit"
    return (f"overloaded: the instances need about {clear:.0f} s to clear the work already "
            f"admitted, more than {what} ({budget:.0f} s)",
            max(1.0, min(clear - budget, 3600.0)))


WOULD_MISS_DEADLINE = "would_miss_deadline"


def deadline_verdict(coordinator: Any, query: Any, now: float
                     ) -> tuple[float, float] | None:
    """(earliest feasible SLO seconds, expected finish after arrival) when ``query`` —
    registered with the coordinator's time models but not yet admitted — cannot meet its
    deadline at the current load; None when it can (or has no deadline).

    Expected finish: the work ahead of it (``backlog_clear_s`` for its band) cleared,
    then its own remaining critical path at expected lengths. Both are the coordinator's
    own estimates, the ones its queue keys use."""
    if query.deadline is None or query.run is None or speed_unmeasured(coordinator):
        return None  # (a guessed speed refuses nothing: ``speed_unmeasured``)
    coordinator._critical_paths(query, now)
    path = float(query.path_cache.get(None, 0.0))
    up = coordinator.up_instances
    factors = measured_speed_factors(coordinator, up)
    if factors:  # its own path at what the instances measured, as the work ahead of it
        path *= (sum(factors.values()) + len(up) - len(factors)) / len(up)
    wait = backlog_clear_s(coordinator, now, call_band(coordinator, query))
    finish = wait + path
    if now + finish <= query.deadline:
        return None
    return float(math.ceil(finish)), finish



class DeadlineRejected(QueryRejected):
    """A query that would miss its deadline at the current load: ``reason`` starts with
    ``would_miss_deadline`` (``code``); ``earliest_slo_s`` is the SLO that would be
    feasible now, for the API's answer."""

    code = WOULD_MISS_DEADLINE

    def __init__(self, earliest_slo_s: float, finish_s: float, budget_s: float):
        super().__init__(f"{WOULD_MISS_DEADLINE}: expected to finish in about {finish_s:.0f} s "
                         f"at the current load, past its deadline ({budget_s:.0f} s); an SLO "
                         f"of {earliest_slo_s:.0f} s would be feasible now",
                         retry_after_s=max(1.0, min(finish_s - budget_s, 3600.0)))
        self.earliest_slo_s = earliest_slo_s


def rejection_details(err: QueryRejected) -> dict[str, Any]:
    """What a rejected answer carries for its client: when to retry, and for a deadline
    refusal its code and the earliest SLO that would be feasible now, so the client can
    resubmit with it instead of guessing."""
    details: dict[str, Any] = {"retry_after_s": err.retry_after_s}
    if isinstance(err, DeadlineRejected):
        details.update(code=err.code, earliest_slo_s=round(err.earliest_slo_s, 3))
    return details
