"""The scheduler: heterogeneity-aware dispatch, deadline budgets, length distributions,
Gittins ordering — one event-driven core for real serving and simulation."""

from agentflow.scheduler.call import CallState, QueryState, ScheduledCall
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.coordinator import (
    Coordinator,
    Decision,
    FailCall,
    QueryRejected,
    StartCall,
)
from agentflow.scheduler.policies import PRESETS, resolve
from agentflow.scheduler.serving import ScheduledRouter
from agentflow.scheduler.setup import build_coordinator

__all__ = ["CallState", "QueryState", "ScheduledCall", "InstanceSpec", "Coordinator",
           "Decision", "FailCall", "QueryRejected", "StartCall", "PRESETS", "resolve",
           "ScheduledRouter", "build_coordinator"]
