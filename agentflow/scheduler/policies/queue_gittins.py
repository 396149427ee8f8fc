"""``gittins``: SageSched — highest Gittins index of the call's cost distribution first.

Cost is ``O^2/2 + I*O`` over the predicted output-length distribution; the index is taken at
the cost the call has already attained (non-zero for a call that ran and was put back),
on SageSched's geometric buckets (``GittinsRanker``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.distribution import kv_cost
from agentflow.scheduler.gittins import GittinsRanker
from agentflow.scheduler.policies.base import QueuePolicy
from agentflow.scheduler.ranking import flat

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView
    from agentflow.scheduler.ranking import Key


class GittinsQueue(QueuePolicy):
    name = "gittins"
    query_dependent = False

    def __init__(self) -> None:
        self.ranker = GittinsRanker()

    def index(self, call: ScheduledCall, view: SchedulerView) -> float:
        attained = kv_cost(call.prompt_tokens, call.attained_tokens)
        return self.ranker.index(view.call_cost(call), attained, key=call.id)

    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        return flat(0, -self.index(call, view))
