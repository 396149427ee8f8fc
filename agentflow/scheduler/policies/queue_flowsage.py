"""``flowsage``: ours. Calls at risk of missing their stage budget (HexGen-Flow urgency above
``-risk_margin * budget``) go first, most urgent first; every other call is ordered by the
Gittins index of its *query's* remaining workflow cost, so questions with little work left
finish first without starving the ones that are running late."""

from __future__ import annotations

from agentflow.scheduler.gittins import GittinsRanker
from agentflow.scheduler.policies.base import QueuePolicy, budget_and_urgency


class FlowSageQueue(QueuePolicy):
    name = "flowsage"
    time_dependent = True

    def __init__(self, risk_margin: float = 0.0):
        self.risk_margin = risk_margin
        self.ranker = GittinsRanker()

    def key(self, call, now, view) -> tuple:
        bu = budget_and_urgency(call, now, view)
        if bu is not None:
            budget, urgency = bu
            if urgency > -self.risk_margin * max(budget, 0.0):
                return (0, -urgency, call.ready_at)
        index = self.ranker.index(view.remaining_cost(call.query), 0.0)
        return (1, -index, call.ready_at)
