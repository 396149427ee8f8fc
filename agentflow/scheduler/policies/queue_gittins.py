"""``gittins``: SageSched — highest Gittins index of the call's cost distribution first.

Cost is ``O^2/2 + I*O`` over the predicted output-length distribution; the index is taken at
the cost already attained, which changes only for calls that ran and were put back, and is
recomputed when it crosses a bucket boundary (``GittinsRanker``), not every token.
"""

from __future__ import annotations

from agentflow.scheduler.distribution import kv_cost
from agentflow.scheduler.gittins import GittinsRanker
from agentflow.scheduler.policies.base import QueuePolicy


class GittinsQueue(QueuePolicy):
    name = "gittins"

    def __init__(self) -> None:
        self.ranker = GittinsRanker()

    def key(self, call, now, view) -> tuple:
        attained = kv_cost(call.prompt_tokens, call.attained_tokens)
        return (-self.ranker.index(view.call_cost(call), attained, key=call.id), call.ready_at)
