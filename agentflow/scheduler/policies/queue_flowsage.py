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

from statistics import NormalDist
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
# ``flowsage-savable``: a query is lost once its probability of meeting its deadline is at
# most this (the mirror of the hold's safe bound, risk.HOLD_SAFE; ``scheduler.savable``).
LOST_MEET = 0.02


def remaining_spread_s(query: QueryState, remaining: float) -> float:
    """Sigma of a query's remaining critical path, read as a normal law whose P10-P90 is the
    paths' (lo, hi) (a query without a workflow run has only its mean). One definition, as
    flowsage's rank and the admission hold's miss probability must read the same risk."""
    lo, hi = (query.path_lo, query.path_hi) if query.run is not None else (remaining,
                                                                           remaining)
    return max((hi - lo) / (2 * _Z90), _MIN_REL_SPREAD * remaining, 1e-6)


def lost_z(lost_meet: float) -> float:
    """The z at or below which a query is lost under ``lost_meet`` (its probability of
    meeting the deadline, ``Phi(z)``, at most that): ``Phi^-1(lost_meet)``, negative."""
    if not 0.0 < lost_meet < 0.5:
        raise ValueError(f"lost_meet must lie in (0, 0.5), got {lost_meet!r}")
    return NormalDist().inv_cdf(lost_meet)


class FlowSageQueue(QueuePolicy):
    """``lost_meet`` (None: off, as the ``flowsage`` preset ships; ``flowsage-savable``:
    ``savable.LOST_MEET``): a query whose probability of meeting its deadline has fallen to
    at most this is *lost* and from that instant ranks as a query without a deadline
    (tier 1, ``arrival + work left``), behind every query that can still be saved.

    Why (issue 38; the rule's derivation in ``scheduler.savable``): lowest z first serves the
    query furthest past saving first, yet the deadline probability a second of service
    buys a query is ``phi(z) / sigma``, which falls on both sides of z = 0; at paper-4gpu's
    slo50 point flowsage met fewer deadlines than md+fcfs (0.477 / 0.521). The key's line
    reaches the bound at a known instant, ``D - R - lost_z * sigma``, so the switch is a
    segment start (the kinetic queue's timer), not a re-key. The name stays ``flowsage``:
    everything that acts on flowsage's risk (the admission hold, class ranking, fair
    shares) acts on the variant the same way."""

    name = "flowsage"
    per_query = True

    def __init__(self, lost_meet: float | None = None):
        self.lost_meet = lost_meet
        self._lost_z = None if lost_meet is None else lost_z(lost_meet)

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        query = call.query
        remaining = view.remaining_s(query, now)
        if query.deadline is None:
            work = query.work_left if query.run is not None else remaining
            return (Segment(_NEG_INF, 1, query.arrival + work, 0.0),)
        sigma = remaining_spread_s(query, remaining)
        risk = Segment(_NEG_INF, 0, (query.deadline - remaining) / sigma, 1.0 / sigma)
        if self._lost_z is None:
            return (risk,)
        work = query.work_left if query.run is not None else remaining
        lost = query.deadline - remaining - self._lost_z * sigma  # z reaches lost_z here
        behind = Segment(lost, 1, query.arrival + work, 0.0)
        if lost <= now:
            return (behind._replace(start=_NEG_INF),)
        return (risk, behind)
