"""Scheduling policies by name, and the presets that pair a dispatch with a queue policy.

One file per policy; add a policy by adding a file and a line here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentflow.scheduler.policies.base import DispatchPolicy, QueuePolicy, SchedulerView
from agentflow.scheduler.policies.dispatch_earliest_finish import EarliestFinishDispatch
from agentflow.scheduler.policies.dispatch_least_loaded import LeastLoadedDispatch
from agentflow.scheduler.policies.dispatch_round_robin import RoundRobinDispatch
from agentflow.scheduler.policies.dispatch_workload_balanced import WorkloadBalancedDispatch
from agentflow.scheduler.policies.queue_edf import EdfQueue
from agentflow.scheduler.policies.queue_fcfs import FcfsQueue
from agentflow.scheduler.policies.queue_flowsage import FlowSageQueue
from agentflow.scheduler.policies.queue_flowsage_v1 import FlowSageV1Queue
from agentflow.scheduler.policies.queue_gittins import GittinsQueue
from agentflow.scheduler.policies.queue_llf import LlfQueue
from agentflow.scheduler.policies.queue_urgency import UrgencyQueue

DISPATCH: dict[str, Callable[..., DispatchPolicy]] = {
    "round_robin": RoundRobinDispatch,
    "least_loaded": LeastLoadedDispatch,
    "workload_balanced": WorkloadBalancedDispatch,
    "earliest_finish": EarliestFinishDispatch,
}

QUEUE: dict[str, Callable[..., QueuePolicy]] = {
    "fcfs": FcfsQueue,
    "edf": EdfQueue,
    "llf": LlfQueue,
    "urgency": UrgencyQueue,
    "gittins": GittinsQueue,
    "flowsage": FlowSageQueue,
    "flowsage_v1": FlowSageV1Queue,
}

PRESETS: dict[str, tuple[str, str]] = {
    "vllm": ("round_robin", "fcfs"),
    "hexgen-flow": ("workload_balanced", "urgency"),
    "sagesched": ("least_loaded", "gittins"),
    "llf": ("least_loaded", "llf"),
    "flowsage": ("workload_balanced", "flowsage"),
}


def resolve(policy: str, *, alpha: float | None = None,
            **queue_kwargs: Any) -> tuple[DispatchPolicy, QueuePolicy]:
    """A preset name (``flowsage``) or ``DISPATCH+QUEUE`` (``least_loaded+edf``)."""
    if policy in PRESETS:
        dispatch_name, queue_name = PRESETS[policy]
    elif "+" in policy:
        dispatch_name, queue_name = policy.split("+", 1)
    else:
        raise ValueError(f"unknown policy {policy!r}; presets: {', '.join(PRESETS)}, or "
                         f"DISPATCH+QUEUE with dispatch in {', '.join(DISPATCH)} and queue in "
                         f"{', '.join(QUEUE)}")
    if dispatch_name not in DISPATCH:
        raise ValueError(f"unknown dispatch policy {dispatch_name!r}; "
                         f"choose from {', '.join(DISPATCH)}")
    if queue_name not in QUEUE:
        raise ValueError(f"unknown queue policy {queue_name!r}; choose from {', '.join(QUEUE)}")
    dispatch = (WorkloadBalancedDispatch(alpha) if dispatch_name == "workload_balanced"
                and alpha is not None else DISPATCH[dispatch_name]())
    return dispatch, QUEUE[queue_name](**queue_kwargs)


__all__ = ["DispatchPolicy", "QueuePolicy", "SchedulerView", "DISPATCH", "QUEUE", "PRESETS",
           "resolve"]
