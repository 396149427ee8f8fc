"""Scheduling policies by name, and the presets that pair a dispatch with a queue policy.

One file per policy; add a policy by adding a file and a line here. A policy name is a preset
or ``DISPATCH+QUEUE``, optionally followed by ``@MODEL`` to pick the length model
(``agentflow.scheduler.lengths``: ``learned`` by default, ``oracle`` in simulation).
Lists of names and help texts are generated from these tables (``policy_help``).

Only shipped policies live here. Experiments (the ablation queues of ``agentflow/bench/``) add
theirs at run time with ``register_queue``, so they never show up in a user's ``--help``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentflow.scheduler.policies.base import DispatchPolicy, QueuePolicy, SchedulerView
from agentflow.scheduler.policies.dispatch_cache_aware import CacheAwareDispatch
from agentflow.scheduler.policies.dispatch_earliest_finish import EarliestFinishDispatch
from agentflow.scheduler.policies.dispatch_least_loaded import LeastLoadedDispatch
from agentflow.scheduler.policies.dispatch_marginal_delay import MarginalDelayDispatch
from agentflow.scheduler.policies.dispatch_round_robin import RoundRobinDispatch
from agentflow.scheduler.policies.dispatch_workload_balanced import WorkloadBalancedDispatch
from agentflow.scheduler.policies.queue_edf import EdfQueue
from agentflow.scheduler.policies.queue_fcfs import FcfsQueue
from agentflow.scheduler.policies.queue_flowsage import FlowSageQueue
from agentflow.scheduler.policies.queue_gittins import GittinsQueue
from agentflow.scheduler.policies.queue_llf import LlfQueue
from agentflow.scheduler.policies.queue_urgency import UrgencyQueue

DISPATCH: dict[str, Callable[..., DispatchPolicy]] = {
    "round_robin": RoundRobinDispatch,
    "least_loaded": LeastLoadedDispatch,
    "workload_balanced": WorkloadBalancedDispatch,
    "earliest_finish": EarliestFinishDispatch,
    "cache_aware": CacheAwareDispatch,
    "marginal_delay": MarginalDelayDispatch,
}


QUEUE: dict[str, Callable[..., QueuePolicy]] = {
    "fcfs": FcfsQueue,
    "edf": EdfQueue,
    "llf": LlfQueue,
    "urgency": UrgencyQueue,
    "gittins": GittinsQueue,
    "flowsage": FlowSageQueue,
}


def register_queue(name: str, factory: Callable[..., QueuePolicy]) -> None:
    """Make ``factory`` (called with the coordinator's queue options) the queue policy named
    ``name`` in this process, e.g. an experiment's ablation. Registering the same factory
    again is a no-op; a name already taken by another factory is refused, so an experiment
    cannot silently replace a shipped policy."""
    if not name or any(ch in name for ch in "+@, "):
        # these separate names in ``DISPATCH+QUEUE@MODEL`` and in ``--policy A,B``
        raise ValueError(f"bad queue policy name {name!r}: it must be non-empty, without "
                         "'+', '@', ',' or spaces")
    current = QUEUE.get(name)
    if current is not None and current is not factory:
        raise ValueError(f"queue policy {name!r} is already registered")
    QUEUE[name] = factory


PRESETS: dict[str, tuple[str, str]] = {
    "vllm": ("round_robin", "fcfs"),
    "hexgen-flow": ("workload_balanced", "urgency"),
    "sagesched": ("least_loaded", "gittins"),
    "llf": ("least_loaded", "llf"),
    "flowsage": ("marginal_delay", "flowsage"),
}
PRESETS["oracle"] = PRESETS["flowsage"]  # flowsage with true lengths: the yardstick
# Presets that also fix the length model (every other name uses DEFAULT_LENGTH_MODEL).
PRESET_LENGTH_MODELS: dict[str, str] = {"oracle": "oracle"}


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy name: dispatch, queue policy and length model, all registry names."""

    name: str
    dispatch: str
    queue: str
    length_model: str

    @property
    def simulation_only(self) -> bool:
        from agentflow.scheduler.lengths import LENGTH_MODELS

        return LENGTH_MODELS[self.length_model].simulation_only


def parse_policy(policy: str) -> PolicySpec:
    """``PRESET``, ``DISPATCH+QUEUE``, either with ``@MODEL`` (``least_loaded+edf@oracle``)."""
    from agentflow.scheduler.lengths import DEFAULT_LENGTH_MODEL, LENGTH_MODELS

    base, _, length_model = policy.partition("@")
    if base in PRESETS:
        dispatch_name, queue_name = PRESETS[base]
        length_model = length_model or PRESET_LENGTH_MODELS.get(base, DEFAULT_LENGTH_MODEL)
    elif "+" in base:
        dispatch_name, queue_name = base.split("+", 1)
    else:
        raise ValueError(f"unknown policy {policy!r}; {policy_help()}")
    if dispatch_name not in DISPATCH:
        raise ValueError(f"unknown dispatch policy {dispatch_name!r}; "
                         f"choose from {', '.join(DISPATCH)}")
    if queue_name not in QUEUE:
        raise ValueError(f"unknown queue policy {queue_name!r}; choose from {', '.join(QUEUE)}")
    length_model = length_model or DEFAULT_LENGTH_MODEL
    if length_model not in LENGTH_MODELS:
        raise ValueError(f"unknown length model {length_model!r} in {policy!r}; "
                         f"choose from {', '.join(LENGTH_MODELS)}")
    return PolicySpec(policy, dispatch_name, queue_name, length_model)


def with_length_model(policy: str, length_model: str | None) -> str:
    """``policy`` with length model ``length_model`` unless the name already picks one."""
    if not length_model or "@" in policy or policy in PRESET_LENGTH_MODELS:
        return policy
    return f"{policy}@{length_model}"


def policy_help(*, simulation: bool = True) -> str:
    """One line naming every preset, dispatch, queue policy and length model."""
    from agentflow.scheduler.lengths import LENGTH_MODELS

    def preset(name: str) -> str:
        d, q = PRESETS[name]
        model = PRESET_LENGTH_MODELS.get(name)
        return f"{name} ({d}+{q}{'@' + model if model else ''})"

    presets = [preset(n) for n in PRESETS if simulation or not parse_policy(n).simulation_only]
    models = [f"{k.name}: {k.help}" for k in LENGTH_MODELS.values()
              if simulation or not k.simulation_only]
    return (f"presets: {', '.join(presets)}; or DISPATCH+QUEUE with dispatch in "
            f"{', '.join(DISPATCH)} and queue in {', '.join(QUEUE)}; optional @MODEL picks the "
            f"length model ({'; '.join(models)})")


def resolve(policy: str, *, alpha: float | None = None,
            **queue_kwargs: Any) -> tuple[DispatchPolicy, QueuePolicy]:
    """The dispatch and queue policy of a name (``flowsage``, ``least_loaded+edf@oracle``);
    the length model is the caller's (see ``PolicySpec.length_model``)."""
    spec = parse_policy(policy)
    dispatch_name, queue_name = spec.dispatch, spec.queue
    dispatch = (WorkloadBalancedDispatch(alpha) if dispatch_name == "workload_balanced"
                and alpha is not None else DISPATCH[dispatch_name]())
    return dispatch, QUEUE[queue_name](**queue_kwargs)


__all__ = ["DispatchPolicy", "QueuePolicy", "SchedulerView", "DISPATCH", "QUEUE", "PRESETS",
           "PRESET_LENGTH_MODELS", "PolicySpec", "parse_policy", "policy_help", "register_queue",
           "resolve", "with_length_model"]
