"""The workflow runtime: pipelines as DAGs of LLM calls and tool steps, run concurrently."""

from agentflow.workflow.clock import Clock, ManualClock, MonotonicClock
from agentflow.workflow.context import StageContext
from agentflow.workflow.executor import execute
from agentflow.workflow.graph import Expansion, GraphError, Node, NodeKind, WorkflowRun, chain
from agentflow.workflow.query import LLMCallRecord, Query, QueryStatus, StageRecord
from agentflow.workflow.router import CallOutcome, CallRouter, DirectRouter, LLMCall

__all__ = [
    "Clock", "ManualClock", "MonotonicClock", "StageContext", "execute", "Expansion",
    "GraphError", "Node", "NodeKind", "WorkflowRun", "chain", "LLMCallRecord", "Query",
    "QueryStatus", "StageRecord", "CallOutcome", "CallRouter", "DirectRouter", "LLMCall",
]
