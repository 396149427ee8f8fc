"""Building the coordinator from configuration — one function for serving and simulation.

``build_coordinator`` turns instance descriptions (``agentflow.config.InstanceConfig``) and
scheduler settings into a ``Coordinator``: the same ``InstanceSpec``s, policy, alpha, length
model and admission limits whichever runtime drives it. ``AgentFlow`` calls it with a wall
clock, ``agentflow.sim.Simulation`` with a virtual one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.coordinator import Coordinator
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS
from agentflow.scheduler.lengths import LengthModel, make_length_model
from agentflow.scheduler.policies import parse_policy
from agentflow.slo_classes import SloClass
from agentflow.workflow.clock import Clock

if TYPE_CHECKING:
    from agentflow.config import InstanceConfig, SchedulerConfig


def build_coordinator(instances: Sequence[InstanceConfig], *, clock: Clock, policy: str,
                      alpha: float | None = None, embedder: str = "hashing",
                      length_model: LengthModel | None = None,
                      max_waiting_calls: int | None = None,
                      max_active_queries: int | None = None,
                      admit_by_backlog: bool = False,
                      max_backlog_s: float | None = None,
                      slo_classes: Mapping[str, SloClass] | None = None,
                      deadline_admission: str | None = None,
                      preemption: str | None = None,
                      fast_lane: int | None = FAST_LANE_CALLS) -> Coordinator:
    """``instances`` must be named (``expand_instances``); ``length_model`` defaults to the
    length model the policy name picks, with ``embedder``."""
    specs = [InstanceSpec.from_config(cfg) for cfg in instances]
    if length_model is None:
        length_model = make_length_model(parse_policy(policy).length_model, embedder=embedder)
    return Coordinator(specs, clock=clock, policy=policy, alpha=alpha, length_model=length_model,
                       max_waiting_calls=max_waiting_calls,
                       max_active_queries=max_active_queries,
                       admit_by_backlog=admit_by_backlog, max_backlog_s=max_backlog_s,
                       slo_classes=slo_classes, deadline_admission=deadline_admission,
                       preemption=preemption, fast_lane=fast_lane)


def scheduler_settings(scheduler: SchedulerConfig) -> dict[str, Any]:
    """``build_coordinator``'s keyword arguments from a config's scheduler section."""
    return {"policy": scheduler.policy, "alpha": scheduler.alpha,
            "embedder": scheduler.embedder, "max_waiting_calls": scheduler.max_waiting_calls,
            "max_active_queries": scheduler.max_active_queries,
            "admit_by_backlog": scheduler.admit_by_backlog,
            "max_backlog_s": scheduler.max_backlog_s,
            "slo_classes": dict(scheduler.slo_classes),
            "deadline_admission": scheduler.deadline_admission,
            "preemption": scheduler.preemption, "fast_lane": scheduler.fast_lane}
