"""``flowsage_tiers``: the second flowsage design, kept for ablations — deadline feasibility
tiers from length distributions, query-level keys.

Each query's state at its last event gives three remaining critical paths (every unfinished
stage at its P10, mean and P90 predicted length, averaged over the cluster) and its
remaining LLM work ``W``. Two instants follow:

* ``at_risk = D - path_P90``: from here on, a pessimistic run of what is left no longer fits
  the deadline unless the query is served now;
* ``hopeless = D - path_P10``: from here on, even an optimistic run misses.

A waiting call's key moves through three tiers, lower first:

1. *at risk, still savable* (``at_risk <= now < hopeless``): least laxity first
   (``D - now - path``) — the queries that serving now can still save;
2. *safe* (``now < at_risk``): least remaining work of the whole query first (query-level
   SRPT), so short questions leave quickly — every call of a query shares the key, so the
   longest parallel sibling is not pushed behind its own query's short ones;
3. *hopeless* (``now >= hopeless``): oldest query first. They will miss anyway; they stop
   taking capacity from queries that can still make it, yet are served in arrival order
   so their lateness stays bounded (they still count in P95).

Unlike HexGen-Flow's urgency (and flowsage v1) nothing here promotes a query *because* it is
late: lateness past the optimistic bound demotes. The quantile levels are a symmetric 80%
band (``Coordinator.PATH_QUANTILES``), not fitted to any trace. Queries without a deadline
are ordered as safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import Segment

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key

_NEG_INF = float("-inf")
AT_RISK, SAFE, HOPELESS = 0, 1, 2


class FlowSageTiersQueue(QueuePolicy):
    name = "flowsage_tiers"
    time_dependent = True
    per_query = True

    def __init__(self, *, feasibility: bool = True, safe_order: str = "work",
                 demote_hopeless: bool = True):
        # Ablation switches: ``feasibility=False`` drops the at-risk/hopeless tiers;
        # ``safe_order`` orders safe queries by their remaining ``work`` (query-level SRPT),
        # by ``laxity``, or by the ``call``'s own Gittins index (SageSched's rule, per call).
        if safe_order not in ("work", "laxity", "call", "arrival"):
            raise ValueError(f"unknown safe_order {safe_order!r}")
        self.feasibility = feasibility
        self.demote_hopeless = demote_hopeless
        self.safe_order = safe_order
        self.per_query = safe_order != "call"
        if safe_order == "call":
            from agentflow.scheduler.policies.queue_gittins import GittinsQueue

            self.gittins = GittinsQueue()

    def _safe_value(self, call: ScheduledCall, remaining: float,
                    view: SchedulerView) -> float:
        query = call.query
        if self.safe_order == "call":
            return -self.gittins.index(call, view)
        if self.safe_order == "laxity" and query.deadline is not None:
            return query.deadline - remaining
        if self.safe_order == "arrival":
            return query.arrival
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
        late = Segment(hopeless, HOPELESS if self.demote_hopeless else SAFE,
                       query.arrival if self.demote_hopeless else safe.a, 0.0)
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

