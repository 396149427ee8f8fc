"""The coordinator's side of Ray-hosted instances.

``RayActorBackend`` is an ordinary ``LLMBackend``: the coordinator and its router do not
know the instance runs elsewhere. A call is a Ray *streaming* generator task on the actor
(progress items as the backend reports them, then the result); cancelling the call cancels
the task with ``ray.cancel``; the request's ``priority`` travels inside the request.

Supervision: a dead actor (node lost, OOM, ``ray.kill``) fails its calls with a *retryable*
``BackendError``, so the router's health tracker takes the instance down and its calls are
re-dispatched; an actor that dies while idle is noticed by a never-returning ``watch`` call
that fails (``watch_health``). Ray restarts the actor (``max_restarts``); the router probes the
instance with a tiny call, which Ray delivers once the new actor is up, and the instance is
back when it answers. Each result names the actor's incarnation, so a restart is counted (and
the new actor's node looked up) the first time a call comes back from it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from agentflow.distributed import connect_ray, require_ray
from agentflow.distributed.actor import InstanceHost
from agentflow.distributed.placement import (
    ActorResources,
    RayPlacement,
    actor_backend_spec,
    actor_resources,
    fits,
)
from agentflow.llm.base import BackendError, LLMBackend, LLMRequest, LLMResult, ProgressCallback

log = logging.getLogger("agentflow.distributed")

HealthListener = Callable[[str], None]  # called with the reason when the instance goes down


class PlacementError(ValueError):
    """The config cannot be placed on this cluster: no node has what an instance needs, an
    actor's backend failed to build, or start-up timed out. (A ValueError: like any bad
    config, the CLI reports it in one line.)"""


class RayActorBackend(LLMBackend):
    """An instance hosted by a Ray actor (see the module doc)."""

    def __init__(self, name: str, actor: Any, *, resources: ActorResources,
                 probe_timeout_s: float = 10.0,
                 count_tokens: tuple[tuple, Callable[[str], int]] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None):
        self.ray = require_ray()
        self.name = name
        self.actor = actor
        self.resources = resources
        self.probe_timeout_s = probe_timeout_s
        self._tokenizer = count_tokens
        self._loop = loop
        self.location: dict[str, Any] = {}
        self.restarts = 0
        self.state = "starting"  # starting | up | down | closed
        self.last_error: str | None = None
        self._listeners: list[HealthListener] = []
        self._watch_ref: Any = None  # the pending ``watch`` call (an ObjectRef)
        self._watched: str | None = None  # incarnation the pending watch call is on
        self._refreshing: asyncio.Task | None = None

    # ------------------------------------------------------------------ the backend interface
    async def generate(self, request: LLMRequest,
                       on_progress: ProgressCallback | None = None) -> LLMResult:
        self._arm_watch()
        ray = self.ray
        try:
            stream = self.actor.generate.options(num_returns="streaming").remote(request)
        except ray.exceptions.RayError as err:
            raise self._died(err) from None
        result: LLMResult | None = None
        try:
            async for ref in stream:
                item = await ref
                if item[0] == "progress":
                    if on_progress is not None:
                        on_progress(item[1])
                elif item[0] == "result":
                    result = item[1]
                    self._answered_from(item[2])
                else:
                    raise BackendError(f"{self.name}: {item[1]}", retryable=item[2])
        except asyncio.CancelledError:
            try:
                ray.cancel(stream)
            except Exception:  # noqa: BLE001 - the actor may be gone already
                pass
            raise
        except ray.exceptions.RayActorError as err:  # the actor died (or is restarting)
            raise self._died(err) from None
        except ray.exceptions.RayError as err:  # the call failed, the actor lives on
            raise BackendError(f"{self.name}: {_cause_line(err)}", retryable=True) from None
        if result is None:
            raise BackendError(f"{self.name}: the actor's stream ended without a result")
        return replace(result, node=self.node_label)

    def count_tokens(self, text: str) -> int:
        # Counted here, not on the actor: the router sizes every call before dispatch and a
        # round trip per call would put Ray's latency on the scheduler's path.
        return self._tokenizer[1](text) if self._tokenizer else super().count_tokens(text)

    @property
    def tokenizer_key(self) -> tuple:
        return self._tokenizer[0] if self._tokenizer else super().tokenizer_key

    async def close(self) -> None:
        self.state = "closed"
        if self._refreshing is not None:
            self._refreshing.cancel()
        try:
            await asyncio.wait_for(self.actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - dead or slow: kill it anyway
            pass
        self.ray.kill(self.actor, no_restart=True)

    # ------------------------------------------------------------------ supervision
    def watch_health(self, listener: HealthListener) -> None:
        """``listener(reason)`` is called (on the event loop) when the actor dies."""
        self._listeners.append(listener)

    @property
    def node_label(self) -> str:
        """Where the instance runs, for timelines: node name or IP, and the node id."""
        loc = self.location
        if not loc:
            return ""
        return f"{loc.get('node_name') or loc.get('node_ip')}/{loc['node_id'][:8]}"

    def placement_info(self) -> dict[str, Any]:
        """For /v1/instances and /metrics."""
        loc = self.location
        return {"node": self.node_label or None, "node_id": loc.get("node_id"),
                "node_ip": loc.get("node_ip"), "gpu_ids": loc.get("gpu_ids", []),
                "accelerator_type": loc.get("accelerator_type"), "pid": loc.get("pid"),
                "restarts": self.restarts, "state": self.state, "last_error": self.last_error,
                "resources": self.resources.describe()}

    def started(self, location: dict[str, Any]) -> None:
        """Record the first probe's answer (``start_instances`` waits for it)."""
        self.location = location
        self.state = "up"
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._arm_watch)

    # ------------------------------------------------------------------ internals
    def _died(self, err: Exception) -> BackendError:
        reason = f"{self.name}: actor unavailable on {self.node_label or 'its node'} " \
                 f"({type(err).__name__})"
        self._mark_down(reason)
        return BackendError(reason, retryable=True)

    def _mark_down(self, reason: str) -> None:
        if self.state in ("down", "closed"):
            return
        self.state, self.last_error = "down", reason
        log.warning("instance %s down: %s", self.name, reason)

    def _answered_from(self, incarnation: str) -> None:
        """A call came back: from the actor we knew, or from a restarted one."""
        if self.state == "closed":
            return
        if incarnation != self.location.get("incarnation"):
            self.restarts += 1
            self.location = {**self.location, "incarnation": incarnation}
            log.warning("instance %s answers again from a restarted actor (restart %d)",
                        self.name, self.restarts)
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.ensure_future(self._refresh())
        self.state = "up"
        self._arm_watch()

    async def _refresh(self) -> None:
        """Where the restarted actor runs (it may be on another node now)."""
        try:
            location = await asyncio.wait_for(self.actor.probe.remote(), self.probe_timeout_s)
        except (asyncio.TimeoutError, self.ray.exceptions.RayError):
            return  # the next restart, or the next call, tries again
        self.location = location
        self._arm_watch()

    def _arm_watch(self) -> None:
        """Keep one ``watch`` call pending on the current incarnation. It is a plain future
        with a callback, not a task on the loop: a task that never ends would hold up the
        engine's shutdown, which waits for every task on its loop."""
        if self.state != "up":
            return
        incarnation = self.location.get("incarnation")
        if self._watch_ref is not None and self._watched == incarnation:
            return
        loop = asyncio.get_running_loop()
        self._watched = incarnation
        self._watch_ref = self.actor.watch.remote()

        def done(future, incarnation=incarnation) -> None:  # in a Ray thread
            try:
                loop.call_soon_threadsafe(self._watch_ended, future, incarnation)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass
        self._watch_ref.future().add_done_callback(done)

    def _watch_ended(self, future: Any, incarnation: str | None) -> None:
        if self._watched == incarnation:
            self._watch_ref = None
        if self.state == "closed" or incarnation != self.location.get("incarnation"):
            return  # closing, or news of an incarnation already replaced
        err = future.exception() if not future.cancelled() else None
        if not isinstance(err, self.ray.exceptions.RayError):
            return
        reason = f"{self.name}: actor died on {self.node_label or 'its node'} " \
                 f"({type(err).__name__})"
        self._mark_down(reason)
        for listener in list(self._listeners):
            try:
                listener(reason)
            except Exception:  # noqa: BLE001 - one listener must not stop the others
                log.exception("health listener of %s failed", self.name)


def start_instances(config: Any, *, loop: asyncio.AbstractEventLoop | None = None
                    ) -> dict[str, RayActorBackend]:
    """Start one actor per instance of ``config`` (an ``AgentFlowConfig`` with a
    ``placement``), wait until every one answers a probe, and return their backends.

    Fails fast, naming the instance, when no node of the cluster could ever host it, when an
    actor's backend fails to build, or when start-up exceeds ``startup_timeout_s``; actors
    already started are then killed."""
    placement: RayPlacement = config.placement
    ray = connect_ray(placement.address, namespace=placement.namespace,
                      runtime_env=placement.runtime_env)
    needs = {inst.name: actor_resources(inst, placement) for inst in config.instances}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for inst in config.instances:
        if not any(fits(needs[inst.name], n.get("Resources", {})) for n in nodes):
            offered = "; ".join(
                f"{n.get('NodeManagerAddress')}: " + ", ".join(
                    f"{k}={v:g}" for k, v in sorted(n.get("Resources", {}).items())
                    if not k.startswith(("node:", "memory", "object_store")))
                for n in nodes)
            raise PlacementError(
                f"instance {inst.name!r} needs {needs[inst.name].describe()}, which no node "
                f"of the Ray cluster has ({offered or 'no nodes'})")
    remote_cls = ray.remote(InstanceHost)
    backends: dict[str, RayActorBackend] = {}
    for inst in config.instances:
        need = needs[inst.name]
        actor = remote_cls.options(
            num_cpus=need.num_cpus, num_gpus=need.num_gpus, resources=need.resources,
            max_restarts=placement.max_restarts, max_task_retries=0,
            max_concurrency=1000).remote(inst.name, actor_backend_spec(inst))
        backends[inst.name] = RayActorBackend(
            inst.name, actor, resources=need, probe_timeout_s=placement.probe_timeout_s,
            count_tokens=_token_counter(inst), loop=loop)
    probes = {b.actor.probe.remote(): name for name, b in backends.items()}
    deadline = time.monotonic() + placement.startup_timeout_s
    pending = list(probes)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                names = sorted(probes[r] for r in pending)
                raise PlacementError(
                    f"instances {names} did not start within {placement.startup_timeout_s:g}s "
                    f"(still waiting for resources, or loading)")
            name = probes[ready[0]]
            try:
                backends[name].started(ray.get(ready[0]))
            except ray.exceptions.RayError as err:
                raise PlacementError(f"instance {name!r} failed to start: "
                                     f"{_cause_line(err)}") from None
    except BaseException:
        for b in backends.values():
            ray.kill(b.actor, no_restart=True)
        raise
    for name, b in backends.items():
        log.info("instance %s runs on %s (%s)", name, b.node_label, b.resources.describe())
    return backends


def _token_counter(instance: Any) -> tuple[tuple, Callable[[str], int]] | None:
    """The scripted backend counts without a model, so its count is exact here too; other
    backends' tokenizers live with their model on the actor's node, so the router uses the
    base rule (characters / 4) for them."""
    if (instance.backend or {}).get("type") == "scripted":
        from agentflow.llm.scripted import ScriptedBackend

        counter = ScriptedBackend({})
        return counter.tokenizer_key, counter.count_tokens
    return None


def _cause_line(err: Exception) -> str:
    text = str(err).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    # Ray's error text ends with the original exception; that line says what went wrong.
    return lines[-1] if lines else type(err).__name__
