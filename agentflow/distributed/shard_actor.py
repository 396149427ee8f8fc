"""Coordinator shards as Ray actors (``scheduler: {shards: K, shard_hosts: ray}``).

``ShardHost`` is what runs in each shard's actor: a ``ScheduledRouter`` with its own
coordinator over its share of the instances, and those instances' backends, built in the
actor from their configured ``backend`` specs (an HTTP client to a vLLM engine, say; the
scripted backend in tests). Its decisions are made in its own process, which is the point:
K shards decide on K cores.

``RayShard`` is the front end's handle (``agentflow.scheduler.shard_router.ShardHandle``).
A call is a Ray streaming task on the actor carrying the query's identity and a snapshot of
its DAG (the actor registers a query it does not know, so a restarted actor learns its
queries from their next calls), streaming progress and then the outcome with the shard's
load summary (the router's summaries cost no round trip of their own). When the actor dies
(``ray.kill``, its node lost) every call in flight on it fails with ``RayActorError``: the
handle starts a new actor once (the calls that noticed wait for it) and runs each of those
calls again there. Nothing is lost: a query whose shard died sees its calls take longer.

Differences from a shard in the front end's process: a query the shard refuses (overload)
fails at its first call with the shard's reason instead of being answered ``rejected`` at
once (``start_query`` makes no round trip); the mirror of the DAG is as fresh as the last
call (``RunMirror``); instances placed as Ray actors themselves (``placement``) are not yet
reachable from a shard actor (a clear error at start-up).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from agentflow.distributed import connect_ray
from agentflow.llm.base import BackendError, LLMRequest, ProgressCallback
from agentflow.scheduler.shards import ShardLoad
from agentflow.workflow.router import CallOutcome, LLMCall

if TYPE_CHECKING:
    from agentflow.config import AgentFlowConfig, InstanceConfig
    from agentflow.workflow.clock import Clock
    from agentflow.workflow.graph import WorkflowRun
    from agentflow.workflow.query import Query

log = logging.getLogger("agentflow.distributed")

SHARD_NAMESPACE = "agentflow"
SHARD_PREFIX = "agentflow-shard-"


class ShardHost:
    """One shard, hosted in a Ray actor (``ray.remote`` is applied at start-up, so this
    module imports without Ray)."""

    def __init__(self, index: int, instances: list[dict[str, Any]],
                 scheduler: dict[str, Any]):
        from agentflow.config import InstanceConfig, SchedulerConfig
        from agentflow.llm.registry import create_backend
        from agentflow.scheduler.serving import ScheduledRouter
        from agentflow.scheduler.setup import build_coordinator, scheduler_settings
        from agentflow.workflow.clock import MonotonicClock

        self.index = index
        self.incarnation = uuid.uuid4().hex  # a new id per start
        insts = [InstanceConfig.model_validate(d) for d in instances]
        sched = SchedulerConfig.model_validate(scheduler)
        backends = {inst.label: create_backend(inst.backend) for inst in insts}
        self.clock = MonotonicClock()
        coordinator = build_coordinator(insts, clock=self.clock, **scheduler_settings(sched))
        self.router = ScheduledRouter(coordinator, backends,
                                      revive_after_s=sched.revive_after_s, health=sched.health)
        self.runs: dict[str, Any] = {}  # query id -> RunMirror
        self.fronts: dict[str, int] = {}  # front ends attached -> calls each sent

    async def ready(self) -> str:
        return self.incarnation

    async def attach(self, front: str) -> int:
        """A front end shares this shard from now on; how many do."""
        self.fronts.setdefault(front, 0)
        return len(self.fronts)

    async def detach(self, front: str) -> int:
        """A front end leaves; how many are left (the last one stops the shard)."""
        self.fronts.pop(front, None)
        return len(self.fronts)

    async def stats(self) -> dict[str, Any]:
        return {"incarnation": self.incarnation, "fronts": dict(self.fronts),
                "queries": len(self.runs)}

    def _load(self) -> ShardLoad:
        from agentflow.scheduler.shards import coordinator_load

        return coordinator_load(self.router.coordinator, self.clock.now())

    async def load(self) -> ShardLoad:
        return self._load()

    def instance_report(self) -> dict[str, dict[str, Any]]:
        """This shard's instances as the front ends' /v1/instances and /metrics show them
        (``ScheduledRouter.instance_report``)."""
        return self.router.instance_report()

    def _run(self, query: dict[str, Any], dag: dict[str, Any]) -> Any:
        """The query's mirror, registered with the coordinator on first sight (raises
        ``QueryRejected`` when the shard refuses it)."""
        from agentflow.scheduler.run_mirror import RunMirror, query_from

        now = self.clock.now()
        run = self.runs.get(query["id"])
        if run is None:
            run = RunMirror(query_from(query, now))
            run.update(dag, now)
            # the mirror has what the coordinator reads of a WorkflowRun (duck-typed)
            self.router.start_query(run.query, cast("WorkflowRun", run))
            self.runs[query["id"]] = run
        else:
            run.update(dag, now)
        return run

    async def submit(self, query: dict[str, Any], dag: dict[str, Any], node_id: str,
                     request: LLMRequest, front: str = "", progress: bool = True,
                     load: bool = True) -> AsyncIterator[tuple[Any, ...]]:
        """Stream ``("progress", tokens)``, then ``("result", fields, load)`` or
        ``("error", message, retryable)`` (failures travel as data, as in
        ``agentflow.distributed.actor``). ``progress=False``: the front end has no use for
        the token counts (its caller passed no ``on_progress``), so none is streamed and
        the call is simply awaited; the coordinator here still hears every report.
        ``load=False``: no load summary (``None``), for a front end with one shard, which
        never reads it."""
        from agentflow.scheduler import QueryRejected

        if front:
            self.fronts[front] = self.fronts.get(front, 0) + 1

        try:
            run = self._run(query, dag)
        except QueryRejected as err:
            yield ("error", f"shard {self.index} refused the query: {err.reason}", False)
            return
        call = LLMCall(request=request, run=run, node=run.node(node_id))
        if not progress:
            try:
                out = await self.router.submit(call)
            except BackendError as err:
                yield ("error", str(err), err.retryable)
                return
            yield ("result", self._fields(out), self._load() if load else None)
            return
        updates: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.ensure_future(self.router.submit(call, updates.put_nowait))
        getter: asyncio.Future[int] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(updates.get())
                done, _ = await asyncio.wait({task, getter},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    tokens = getter.result()
                    while not updates.empty():
                        tokens = max(tokens, updates.get_nowait())
                    yield ("progress", tokens)
                else:
                    getter.cancel()
                if task in done:
                    break
            try:
                out = task.result()
            except BackendError as err:
                yield ("error", str(err), err.retryable)
                return
            yield ("result", self._fields(out), self._load() if load else None)
        finally:
            if getter is not None and not getter.done():  # cancelled while waiting
                getter.cancel()
            if not task.done():  # the front end cancelled the call
                task.cancel()
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled on purpose
                    pass

    @staticmethod
    def _fields(out: CallOutcome) -> dict[str, Any]:
        """What the front end rebuilds its ``CallOutcome`` from (times as durations)."""
        return {"result": out.result, "instance": out.instance,
                "queue_s": out.started - out.submitted, "run_s": out.finished - out.started,
                "priority": out.priority, "failed_attempts": out.failed_attempts}

    async def set_share_weights(self, weights: dict[str, float]) -> None:
        self.router.coordinator.fairness.set_weights(weights)

    async def cancel_query(self, query_id: str) -> None:
        if query_id in self.runs:
            self.router.cancel_query(query_id)

    async def end_query(self, query_id: str) -> None:
        run = self.runs.pop(query_id, None)
        if run is not None:
            self.router.end_query(run.query)

    async def close(self) -> None:
        for backend in self.router.backends.values():
            await backend.close()


class RayShard:
    """The front end's handle on one shard actor (see the module docstring)."""

    def __init__(self, index: int, instances: list[dict[str, Any]],
                 scheduler: dict[str, Any], *, ray: Any, clock: Clock,
                 start_timeout_s: float = 60.0, name: str | None = None):
        self.index = index
        # named: one actor for every front end of the same fleet (Serve replicas), found
        # or made by name, kept until the last front end attached to it leaves
        self.name = name
        self.front = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock = clock  # the front end's: the run's times are kept in it
        self.ray = ray
        self._args = (index, instances, scheduler)
        self.start_timeout_s = start_timeout_s
        self._remote = ray.remote(ShardHost)
        self.actor: Any = None
        self.generation = 0  # bumped at each (re)start
        self.restarts = 0
        self.rerun_calls = 0  # calls run again because the actor died under them
        self._restarting: asyncio.Future[None] | None = None
        self._load = ShardLoad(up=len(instances), work_s=0.0)
        self._queries: set[str] = set()
        self._pending: set[Any] = set()  # fire-and-forget refs, kept until done
        self._weights: dict[str, float] = {}  # tenants' share weights, sent to each start
        self._start()

    def _start(self) -> None:
        options: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0, "max_task_retries": 0,
                                   "max_concurrency": 1000}
        if self.name:  # outlives the front end that made it: detached, by name
            options.update(name=self.name, namespace=SHARD_NAMESPACE, get_if_exists=True,
                           lifetime="detached")
        self.actor = self._remote.options(**options).remote(*self._args)
        self.generation += 1
        if self.name:
            self._tell("attach", self.front)
        if self._weights:
            self._tell("set_share_weights", self._weights)

    def wait_ready(self) -> str:
        incarnation: str = self.ray.get(self.actor.ready.remote(),
                                        timeout=self.start_timeout_s)
        return incarnation

    # ------------------------------------------------------------------ ShardHandle
    def start_query(self, query: Query, run: WorkflowRun) -> None:
        self._queries.add(query.id)  # the shard learns it with its first call

    def load(self) -> ShardLoad:
        return self._load

    def set_share_weights(self, weights: Mapping[str, float]) -> None:
        self._weights = dict(weights)
        self._tell("set_share_weights", self._weights)

    def cancel_query(self, query_id: str) -> None:
        self._tell("cancel_query", query_id)

    def end_query(self, query: Query) -> None:
        self._queries.discard(query.id)
        self._tell("end_query", query.id)

    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome:
        from agentflow.scheduler.run_mirror import dag_snapshot, query_snapshot

        ray = self.ray
        submitted = self.clock.now()
        while True:
            generation = self.generation
            now = self.clock.now()  # times cross as "seconds ago": no clock is shared
            stream = self.actor.submit.options(num_returns="streaming").remote(
                query_snapshot(call.query, now), dag_snapshot(call.run, now),
                call.node.id, call.request, self.front, on_progress is not None)
            try:
                async for ref in stream:
                    item = await ref
                    if item[0] == "progress":
                        if on_progress is not None:
                            on_progress(item[1])
                    elif item[0] == "error":
                        raise BackendError(f"shard {self.index}: {item[1]}",
                                           retryable=item[2])
                    else:
                        fields, self._load = item[1], item[2]
                        finished = self.clock.now()
                        return CallOutcome(
                            result=fields["result"], instance=fields["instance"],
                            submitted=submitted,
                            started=max(submitted, finished - fields["run_s"]),
                            finished=finished,
                            priority=fields["priority"],
                            failed_attempts=tuple(fields["failed_attempts"]))
                raise BackendError(f"shard {self.index}: the stream ended without a result")
            except asyncio.CancelledError:
                try:
                    ray.cancel(stream)
                except Exception:  # noqa: BLE001 - the actor may be gone already
                    pass
                raise
            except ray.exceptions.RayActorError:
                log.warning("shard %d died under a call of query %s: restarting it, the "
                            "call runs again there", self.index, call.query.id)
                self.rerun_calls += 1
                await self._restart(generation)

    # ------------------------------------------------------------------ supervision
    async def _restart(self, generation: int) -> None:
        """Start a new actor unless one was started since ``generation`` (many calls notice
        one death: one restart); every caller waits until it answers."""
        if self.generation == generation:
            self.ray.kill(self.actor, no_restart=True)
            self.restarts += 1
            self._start()
            self._restarting = asyncio.ensure_future(self._ready_async())
        if self._restarting is not None:
            await asyncio.shield(self._restarting)

    async def _ready_async(self) -> None:
        deadline = asyncio.get_running_loop().time() + self.start_timeout_s
        while True:
            try:
                await asyncio.wait_for(self.actor.ready.remote(), self.start_timeout_s)
                return
            except self.ray.exceptions.RayActorError:
                # a named shard: the name may still have been the dead actor's, or another
                # front end killed the one found; ask for it again
                if not self.name or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.2)
                self._start()

    def _tell(self, method: str, *args: Any) -> None:
        """A call whose answer nobody waits for (a dead actor: its queries are gone too)."""
        ref = getattr(self.actor, method).remote(*args)
        self._pending.add(ref)
        ref.future().add_done_callback(lambda _f, ref=ref: self._pending.discard(ref))

    def kill(self) -> None:
        """Kill the actor (tests; what a lost node does)."""
        self.ray.kill(self.actor, no_restart=True)

    async def close(self) -> None:
        if self.name:  # shared: stopped by the last front end attached only
            try:
                left = await asyncio.wait_for(self.actor.detach.remote(self.front), timeout=30)
            except Exception:  # noqa: BLE001 - dead or slow: nothing left to leave
                return
            if left:
                return
        try:
            await asyncio.wait_for(self.actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - dead or slow: kill it anyway
            pass
        self.ray.kill(self.actor, no_restart=True)


def start_shards(config: AgentFlowConfig, parts: Sequence[Sequence[InstanceConfig]],
                 clock: Clock, *, shared: bool = False) -> list[RayShard]:
    """One actor per shard, each answering before this returns (Ray: the config's
    ``placement.address``, or a private local Ray). ``shared``: named after the fleet (its
    instances and scheduler settings), so every front end of the same fleet on the cluster
    — each Ray Serve replica — finds and uses the same actors: one queue."""
    if config.placement is not None:
        raise ValueError("scheduler.shard_hosts: ray with instances placed as Ray actors "
                         "(placement) is not supported yet: use shard_hosts: local, or "
                         "instances reached over HTTP (vllm/openai backends)")
    ray = connect_ray("local")
    scheduler = config.scheduler.model_dump(mode="json")
    specs = [[inst.model_dump(mode="json") for inst in part] for part in parts]
    fleet = hashlib.sha1(json.dumps([specs, scheduler], sort_keys=True).encode()).hexdigest()
    shards = [RayShard(i, spec, scheduler, ray=ray, clock=clock,
                       name=f"{SHARD_PREFIX}{fleet[:12]}-{i}" if shared else None)
              for i, spec in enumerate(specs)]
    for shard in shards:
        shard.wait_ready()
    return shards


def kill_shared_shards(ray: Any) -> int:
    """Kill every shared shard actor on the cluster (the Serve application was deleted:
    a replica killed outright never detached); how many."""
    killed = 0
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == SHARD_NAMESPACE and entry["name"].startswith(SHARD_PREFIX):
            try:
                ray.kill(ray.get_actor(entry["name"], namespace=SHARD_NAMESPACE))
                killed += 1
            except ValueError:  # gone meanwhile
                pass
    return killed
