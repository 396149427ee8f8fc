"""``round_robin``: the vLLM-style baseline — instances in turn, blind to speed and load."""

from __future__ import annotations

from agentflow.scheduler.policies.base import DispatchPolicy


class RoundRobinDispatch(DispatchPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, call, instances, now, view) -> str:
        choice = instances[self._next % len(instances)]
        self._next += 1
        return choice
