"""How a stage's LLM call leaves the workflow runtime: through a ``CallRouter``.

The runtime does not pick instances; it hands each call, with everything a scheduler needs
(the query and its deadline, the node, the live workflow run for critical-path budgets), to a
router. ``DirectRouter`` is the plain one (round-robin, no queueing of its own); the
scheduler's coordinator implements the same protocol.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agentflow.llm.base import LLMBackend, LLMRequest, LLMResult, ProgressCallback
from agentflow.workflow.clock import Clock

if TYPE_CHECKING:
    from agentflow.workflow.graph import Node, WorkflowRun
    from agentflow.workflow.query import Query


@dataclass
class LLMCall:
    request: LLMRequest
    run: WorkflowRun
    node: Node

    @property
    def query(self):
        return self.run.query


@dataclass(frozen=True)
class CallOutcome:
    result: LLMResult
    instance: str
    submitted: float  # router clock: handed to the router
    started: float  # router clock: the instance began processing (after all queueing)
    finished: float
    priority: int = 0
    # Attempts that failed before this one succeeded ({"instance", "error"}): their time is
    # inside this call's queue wait, so the timeline must say why it waited.
    failed_attempts: tuple[dict[str, str], ...] = ()


class CallRouter(Protocol):
    """What the runtime needs of a router: a query's lifecycle around its calls."""

    clock: Clock

    def start_query(self, query: Query, run: WorkflowRun) -> None:
        """A query starts (before its first call); may raise
        ``agentflow.scheduler.QueryRejected`` when the router cannot take it."""

    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome:
        """Run the call on some instance; raise ``BackendError`` if it cannot be served."""

    def cancel_query(self, query_id: str) -> None:
        """The query was cancelled: drop its waiting calls, stop its running ones."""

    def end_query(self, query: Query) -> None:
        """The query is over (done, failed or cancelled): forget it."""


@dataclass
class DirectRouter:
    """Round-robin over named backends; each backend queues internally by priority."""

    backends: dict[str, LLMBackend]
    clock: Clock
    _cycle: itertools.cycle = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.backends:
            raise ValueError("DirectRouter needs at least one backend")
        self._cycle = itertools.cycle(list(self.backends))

    def start_query(self, query: Query, run: WorkflowRun) -> None:
        """Nothing to register: calls go out as they come."""

    def cancel_query(self, query_id: str) -> None:
        """Nothing queued here: the runtime cancels the calls' tasks itself."""

    def end_query(self, query: Query) -> None:
        """Nothing kept per query."""

    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome:
        name = next(self._cycle)
        submitted = self.clock.now()
        result = await self.backends[name].generate(call.request, on_progress)
        finished = self.clock.now()
        started = max(submitted, finished - result.total_s)
        return CallOutcome(result=result, instance=name, submitted=submitted, started=started,
                           finished=finished, priority=call.request.priority)
