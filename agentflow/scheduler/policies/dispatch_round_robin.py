"""``round_robin``: the vLLM-style baseline — instances in turn, blind to speed and load."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.base import DispatchPolicy

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView


class RoundRobinDispatch(DispatchPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, call: ScheduledCall, instances: list[str], now: float,
               view: SchedulerView) -> str:
        choice = instances[self._next % len(instances)]
        self._next += 1
        return choice
