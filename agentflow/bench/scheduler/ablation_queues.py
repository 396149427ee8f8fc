"""The ablation queue policies: earlier flowsage designs and their parts alone.

They answer "which part of flowsage matters" (``flowsage_ablations.py``) and are not shipped:
a benchmark calls ``register_ablation_queues()`` before it simulates, which adds them to the
scheduler's registry (``agentflow.scheduler.policies.register_queue``) for that process only,
so ``DISPATCH+NAME`` policy names work and ``agentflow simulate --help`` stays the product's.

* ``flowsage_v1`` — the first flowsage: calls at risk of missing their stage budget
  (HexGen-Flow urgency above ``-risk_margin * budget``) go first, most urgent first; every
  other call is ordered by the Gittins index of its *query's* remaining workflow cost. With
  the budget share fixed between events, "at risk" starts at a known instant
  ``D - t / ((1 - margin) * share)``. ``query_gittins`` is its Gittins half alone.
* The second design, deadline feasibility tiers from length distributions with query-level
  keys (``FlowSageTiersQueue``). Each query's state at its last event gives its remaining
  critical paths with every unfinished stage at its P10 and P90 predicted length, averaged
  over the cluster (``critical_paths``), and its remaining LLM work. From
  ``at_risk = D - path_P90`` a pessimistic run no longer fits unless served now; from
  ``hopeless = D - path_P10`` even an optimistic run misses. A waiting call's key moves
  through three tiers, lower first: at risk but savable (least laxity first), safe (least
  remaining work of the whole query first — query-level SRPT — or by laxity, or by the
  call's own Gittins index), hopeless (oldest query first: they miss anyway, so they stop
  taking capacity from queries that can still make it, yet their lateness stays bounded).
  Nothing here promotes a query *because* it is late. Its variants: ``query_srpt`` (no
  tiers), ``flowsage_laxity`` (safe queries by laxity), ``flowsage_call`` (by the call's
  Gittins index). The quantile levels are a symmetric 80% band, not fitted to any trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentflow.scheduler.call import ScheduledCall
from agentflow.scheduler.gittins import GittinsRanker
from agentflow.scheduler.policies import register_queue
from agentflow.scheduler.policies.base import QueuePolicy, SchedulerView, stage_share
from agentflow.scheduler.policies.queue_gittins import GittinsQueue
from agentflow.scheduler.ranking import Key, Segment

_NEG_INF = float("-inf")
AT_RISK, SAFE, HOPELESS = 0, 1, 2


class FlowSageV1Queue(QueuePolicy):
    name = "flowsage_v1"

    def __init__(self, risk_margin: float = 0.0, urgency: bool = True):
        if not 0.0 <= risk_margin < 1.0:
            raise ValueError("risk_margin must be in [0, 1)")
        self.risk_margin = risk_margin
        self.urgency = urgency  # False keeps only the query-level Gittins order
        self.ranker = GittinsRanker()

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        index = self.ranker.index(view.remaining_cost(call.query), 0.0)
        safe = Segment(_NEG_INF, 1, -index, 0.0)
        if call.deadline is None or not self.urgency:
            return (safe,)
        t, share = stage_share(call, now, view)
        if share <= 0:
            return (safe,)
        at_risk_from = call.deadline - t / ((1.0 - self.risk_margin) * share)
        risky = Segment(at_risk_from, 0, share * call.deadline - t, share)
        if at_risk_from <= now:
            return (Segment(_NEG_INF, 0, risky.a, risky.s),)
        return (safe, risky)


class FlowSageTiersQueue(QueuePolicy):
    name = "flowsage_tiers"
    per_query = True

    def __init__(self, *, feasibility: bool = True, safe_order: str = "work"):
        # ``feasibility=False`` drops the at-risk/hopeless tiers; ``safe_order`` orders safe
        # queries by their remaining ``work`` (query-level SRPT), by ``laxity``, or by the
        # ``call``'s own Gittins index (SageSched's rule, per call).
        if safe_order not in ("work", "laxity", "call"):
            raise ValueError(f"unknown safe_order {safe_order!r}")
        self.feasibility = feasibility
        self.safe_order = safe_order
        self.per_query = safe_order != "call"
        if safe_order == "call":
            self.gittins = GittinsQueue()

    def _safe_value(self, call: ScheduledCall, remaining: float,
                    view: SchedulerView) -> float:
        query = call.query
        if self.safe_order == "call":
            return -self.gittins.index(call, view)
        if self.safe_order == "laxity" and query.deadline is not None:
            return query.deadline - remaining
        return query.work_left if query.run is not None else remaining

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        query = call.query
        remaining = view.remaining_s(query, now)
        deadline = query.deadline
        safe = Segment(_NEG_INF, SAFE, self._safe_value(call, remaining, view), 0.0)
        if deadline is None or not self.feasibility:
            return (safe,)
        at_risk = deadline - query.path_hi
        hopeless = deadline - query.path_lo
        risky = Segment(at_risk, AT_RISK, deadline - remaining, 0.0)
        late = Segment(hopeless, HOPELESS, query.arrival, 0.0)
        segments = [safe]
        if at_risk < hopeless:
            segments.append(risky)
        segments.append(late)
        # drop segments already superseded at ``now`` so the key starts with the current one
        while len(segments) > 1 and segments[1].start <= now:
            segments.pop(0)
        first = segments[0]
        segments[0] = Segment(_NEG_INF, first.tier, first.a, first.s)
        return tuple(segments)


def _variant(name: str, cls: Callable[..., QueuePolicy], **options: Any
             ) -> Callable[..., QueuePolicy]:
    """``cls`` with ``options`` set, named ``name``."""
    def make(**kwargs: Any) -> QueuePolicy:
        queue = cls(**{**options, **kwargs})
        queue.name = name
        return queue
    return make


# Built once, so registering twice in one process registers the same factories (a no-op).
ABLATION_QUEUES: dict[str, Callable[..., QueuePolicy]] = {
    "flowsage_v1": FlowSageV1Queue,
    "query_gittins": _variant("query_gittins", FlowSageV1Queue, urgency=False),
    "flowsage_call": _variant("flowsage_call", FlowSageTiersQueue, safe_order="call"),
    "flowsage_laxity": _variant("flowsage_laxity", FlowSageTiersQueue, safe_order="laxity"),
    "query_srpt": _variant("query_srpt", FlowSageTiersQueue, feasibility=False),
}


def register_ablation_queues() -> None:
    """Add every ablation queue to the scheduler's registry, for this process."""
    for name, factory in ABLATION_QUEUES.items():
        register_queue(name, factory)
