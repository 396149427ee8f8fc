"""Sharded coordinators in serving (``scheduler: {shards: K}``): a ``CallRouter`` in front of
K shards, each a ``ScheduledRouter`` with its own coordinator over a share of the instances.

``ShardedRouter`` picks a query's shard once, at ``start_query``, with the simulator's rule
(``agentflow.scheduler.shards.ShardRouter``: p2c over load summaries by default), and sends
every call of the query there. A shard is reached through a ``ShardHandle``, a small
interface: ``LocalShard`` (this process; what the tests and a one-process server use) or
``agentflow.distributed.shard_actor.RayShard`` (the shard in a Ray actor, restarted when it
dies, its queries' calls re-run there). Several front ends may route to the same handles.

A remote shard needs the query's DAG for its critical paths: each call carries a snapshot
of the run, which the shard mirrors (``agentflow.scheduler.run_mirror``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from agentflow.llm.base import ProgressCallback
from agentflow.scheduler.shards import (
    DEFAULT_ROUTE,
    SUMMARY_S,
    ShardLoad,
    ShardRouter,
    coordinator_load,
    instance_kind,
    split_instances,
)
from agentflow.workflow.graph import WorkflowRun
from agentflow.workflow.query import Query
from agentflow.workflow.router import CallOutcome, LLMCall

if TYPE_CHECKING:
    from agentflow.config import AgentFlowConfig, InstanceConfig
    from agentflow.llm.base import LLMBackend
    from agentflow.scheduler.serving import ScheduledRouter
    from agentflow.workflow.clock import Clock


class ShardHandle(Protocol):
    """One shard as a front end sees it: a query's lifecycle around its calls, and a load
    summary for routing (it may be a little old: a remote shard sends it with its answers)."""

    def start_query(self, query: Query, run: WorkflowRun) -> None: ...

    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome: ...

    def cancel_query(self, query_id: str) -> None: ...

    def end_query(self, query: Query) -> None: ...

    def load(self) -> ShardLoad: ...

    def set_share_weights(self, weights: Mapping[str, float]) -> None: ...


class LocalShard:
    """A shard in this process: its ``ScheduledRouter``, whose coordinator gives a fresh
    load summary."""

    def __init__(self, router: ScheduledRouter):
        self.router = router

    def start_query(self, query: Query, run: WorkflowRun) -> None:
        self.router.start_query(query, run)

    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome:
        return await self.router.submit(call, on_progress)

    def cancel_query(self, query_id: str) -> None:
        self.router.cancel_query(query_id)

    def end_query(self, query: Query) -> None:
        self.router.end_query(query)

    def load(self) -> ShardLoad:
        coordinator = self.router.coordinator
        return coordinator_load(coordinator, coordinator.clock.now())

    def set_share_weights(self, weights: Mapping[str, float]) -> None:
        self.router.coordinator.fairness.set_weights(weights)


class ShardedRouter:
    """The ``CallRouter`` of a sharded deployment (see the module docstring)."""

    def __init__(self, shards: Sequence[ShardHandle], clock: Clock, *,
                 rule: str = DEFAULT_ROUTE, summary_s: float = SUMMARY_S):
        if not shards:
            raise ValueError("a sharded router needs at least one shard")
        self.shards = list(shards)
        self.clock = clock
        self.router = ShardRouter(len(self.shards), lambda: [s.load() for s in self.shards],
                                  rule=rule, summary_s=summary_s)
        self.route: dict[str, int] = {}  # query id -> its shard, while it is in flight

    def start_query(self, query: Query, run: WorkflowRun) -> None:
        i = self.router.pick(query.id, self.clock.now())
        self.shards[i].start_query(query, run)  # may raise QueryRejected: not routed then
        self.route[query.id] = i

    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome:
        return await self.shards[self._shard(call.query.id)].submit(call, on_progress)

    def cancel_query(self, query_id: str) -> None:
        i = self.route.get(query_id)
        if i is not None:
            self.shards[i].cancel_query(query_id)

    def end_query(self, query: Query) -> None:
        i = self.route.pop(query.id, None)
        if i is not None:
            self.shards[i].end_query(query)

    def reachable(self) -> bool:
        """Whether every shard can be reached (one in another process may be gone for a
        while: a replica is not ready then)."""
        return all(getattr(s, "reachable", lambda: True)() for s in self.shards)

    def set_share_weights(self, weights: Mapping[str, float]) -> None:
        """Tenants' share weights (``agentflow.tenants``) for every shard: each keeps the
        shares of its own queries' tenants."""
        for shard in self.shards:
            shard.set_share_weights(weights)

    async def close(self) -> None:
        """Stop the shards that run elsewhere (a local shard's backends are the app's)."""
        for shard in self.shards:
            close = getattr(shard, "close", None)
            if close is not None:
                await close()

    def _shard(self, query_id: str) -> int:
        i = self.route.get(query_id)
        if i is None:
            raise RuntimeError(f"query {query_id} was never started on this router")
        return i


def build_sharded_router(config: AgentFlowConfig, instances: Sequence[InstanceConfig],
                         backends: dict[str, LLMBackend], clock: Clock) -> ShardedRouter:
    """K shards over a stratified split of ``instances`` (``scheduler.shards``), in this
    process or as Ray actors (``scheduler.shard_hosts``)."""
    from agentflow.scheduler.serving import ScheduledRouter
    from agentflow.scheduler.setup import build_coordinator, scheduler_settings

    sched = config.scheduler
    if sched.shard_hosts == "socket":  # the scheduler process the host's replicas share
        from agentflow.distributed.shard_socket import socket_shards

        return ShardedRouter(list(socket_shards(config, clock)), clock, rule=sched.shard_route)
    parts = split_instances(list(instances), sched.shards, kind=instance_kind)
    handles: list[ShardHandle]
    if sched.shard_hosts == "ray":
        from agentflow.distributed.shard_actor import start_shards

        handles = list(start_shards(config, parts, clock, shared=sched.shard_shared))
    else:
        handles = []
        for part in parts:
            names = [inst.label for inst in part]
            coordinator = build_coordinator(part, clock=clock, **scheduler_settings(sched))
            handles.append(LocalShard(ScheduledRouter(
                coordinator, {n: backends[n] for n in names},
                revive_after_s=sched.revive_after_s, health=sched.health)))
    return ShardedRouter(handles, clock, rule=sched.shard_route)
