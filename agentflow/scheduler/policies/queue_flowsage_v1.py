"""``flowsage_v1``: the first flowsage, kept for ablations. Calls at risk of missing their
stage budget (HexGen-Flow urgency above ``-risk_margin * budget``) go first, most urgent
first; every other call is ordered by the Gittins index of its *query's* remaining workflow
cost. With the budget share fixed between events, "at risk" starts at a known instant
``D - t / ((1 - margin) * share)``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.gittins import GittinsRanker
from agentflow.scheduler.policies.base import QueuePolicy, stage_share
from agentflow.scheduler.ranking import Segment

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key

_NEG_INF = float("-inf")


class FlowSageV1Queue(QueuePolicy):
    name = "flowsage_v1"
    time_dependent = True

    def __init__(self, risk_margin: float = 0.0, urgency: bool = True):
        if not 0.0 <= risk_margin < 1.0:
            raise ValueError("risk_margin must be in [0, 1)")
        self.risk_margin = risk_margin
        self.urgency = urgency  # ablation: False keeps only the query-level Gittins order
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
