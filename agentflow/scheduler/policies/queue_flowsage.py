"""``flowsage`` (queue): the query most likely to miss its deadline runs first, where the
likelihood comes from the query's remaining-path *distribution*, not its mean.

At each of its events the coordinator gives a query three remaining critical paths — every
unfinished stage at its P10, mean and P90 predicted length, averaged over the cluster
(``scheduler.paths``). Read as a location-scale law of the remaining time, with
mean ``R`` and spread ``sigma = (R_P90 - R_P10) / (2 * 1.2816)`` (the P10-P90 width of a
normal law), the miss probability at time ``now`` is ``1 - Phi(z)`` with

    z = (D - now - R) / sigma

so ranking by miss probability is ranking by ``z``, lowest first. ``z`` is a line in time of
slope ``1 / sigma`` — an uncertain query's risk grows faster as time passes than a
predictable one's with the same slack — so the kinetic queue orders it exactly between
events. Least laxity (``D - now - R``) is the special case of equal spreads; HexGen-Flow's
urgency splits the slack per stage instead and ignores the spread.

Every call of a query shares the key (the query finishes with its slowest branch, so its
calls are not ranked against each other).

Queries without a deadline go after, by ``arrival + work left`` (expected instance seconds
of their unfinished LLM stages): the finish tag of fair queueing, with the query as the
packet. Least remaining work first alone (SRPT) starves: in a batch flood a query that has
not started always has more left than those already under way, and waits while fresh short
ones overtake it. With the tag, a query is overtaken only by queries that arrive before its
own tag (``arrival + work``), so its wait is bounded by its own size plus the work that
arrived ahead of it; between queries that arrive close together (within their size
difference) the short one still goes first, as SRPT would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import Segment

if TYPE_CHECKING:
    from agentflow.scheduler.call import QueryState, ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key

_NEG_INF = float("-inf")
_Z90 = 1.2815515655446004  # standard normal quantile at 0.9
# Spread floor, relative to the mean remaining path: a query whose lengths are known exactly
# (the oracle, or one left with a fixed-length tool step) would otherwise get an infinite
# slope; 1% keeps the ranking finite without changing it for any real prediction.
_MIN_REL_SPREAD = 0.01


def remaining_spread_s(query: QueryState, remaining: float) -> float:
    """Sigma of a query's remaining critical path, read as a normal law whose P10-P90 is the
    paths' (lo, hi) (a query without a workflow run has only its mean). One definition, as
    flowsage's rank and the admission hold's miss probability must read the same risk."""
    lo, hi = (query.path_lo, query.path_hi) if query.run is not None else (remaining,
                                                                           remaining)
    return max((hi - lo) / (2 * _Z90), _MIN_REL_SPREAD * remaining, 1e-6)


class FlowSageQueue(QueuePolicy):
    name = "flowsage"
    per_query = True

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        query = call.query
        remaining = view.remaining_s(query, now)
        if query.deadline is None:
            work = query.work_left if query.run is not None else remaining
            return (Segment(_NEG_INF, 1, query.arrival + work, 0.0),)
        sigma = remaining_spread_s(query, remaining)
        return (Segment(_NEG_INF, 0, (query.deadline - remaining) / sigma, 1.0 / sigma),)
