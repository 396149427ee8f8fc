"""What runs inside an instance's Ray actor: its backend, built on the node Ray chose.

A plain class (``ray.remote`` is applied when the actor is started, so this module imports
without Ray). Its methods are coroutines, which makes it an *async* actor: many calls run at
once on the actor's event loop, as they would on the coordinator's loop in one process —
vLLM batches them, llama.cpp queues them by priority, the scripted backend sleeps.

Why the stream carries tagged items instead of raising: a ``BackendError`` has to reach the
coordinator with its ``retryable`` flag intact; an exception crossing Ray comes back wrapped
in a ``RayTaskError``, so failures travel as data and only a *dead actor* travels as an
error (which is exactly what the coordinator's side must tell apart).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agentflow.llm.base import BackendError, LLMRequest


class InstanceHost:
    """One instance's backend, hosted in a Ray actor."""

    def __init__(self, name: str, spec: dict[str, Any]):
        from agentflow.llm.registry import create_backend

        self.name = name
        # A new id per (re)start: the coordinator counts restarts by seeing it change.
        self.incarnation = uuid.uuid4().hex
        self.started_at = time.time()
        self.calls_in_flight = 0
        self.backend = create_backend(spec)  # loads the model on this node

    def where(self) -> dict[str, Any]:
        """Where this actor runs: Ray node, GPUs it holds, process."""
        import ray

        ctx = ray.get_runtime_context()
        assigned = ctx.get_assigned_resources()
        accelerators = sorted(k.split(":", 1)[1] for k in assigned
                              if k.startswith("accelerator_type:"))
        node_id = ctx.get_node_id()
        node_name = ""
        for node in ray.nodes():
            if node.get("NodeID") == node_id:
                node_name = node.get("NodeName") or node.get("NodeManagerAddress") or ""
                break
        return {"node_id": node_id, "node_ip": ray.util.get_node_ip_address(),
                "node_name": node_name, "hostname": socket.gethostname(), "pid": os.getpid(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "accelerator_type": accelerators[0] if accelerators else None,
                "incarnation": self.incarnation, "started_at": self.started_at,
                "calls_in_flight": self.calls_in_flight,
                "backend": getattr(self.backend, "name", "")}

    async def probe(self) -> dict[str, Any]:
        """Answering at all means the constructor finished (the model is loaded); the token
        count touches the backend's tokenizer as well."""
        self.backend.count_tokens("probe")
        return self.where()

    async def watch(self) -> None:
        """Never returns: the coordinator keeps one call of this pending, so an actor that
        dies while idle is noticed at once (the pending call fails) rather than at the next
        LLM call."""
        await asyncio.Event().wait()

    async def generate(self, request: LLMRequest) -> AsyncIterator[tuple]:
        """Stream ``("progress", tokens)`` items, then ``("result", LLMResult, incarnation)`` or
        ``("error", message, retryable)``. Cancelling the stream (``ray.cancel``) cancels the
        backend's call, which frees its slot."""
        updates: asyncio.Queue[int] = asyncio.Queue()
        task = asyncio.ensure_future(self.backend.generate(request, updates.put_nowait))
        self.calls_in_flight += 1
        try:
            while True:
                getter = asyncio.ensure_future(updates.get())
                done, _ = await asyncio.wait({task, getter},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    tokens = getter.result()
                    while not updates.empty():  # send the latest count, not every token
                        tokens = max(tokens, updates.get_nowait())
                    yield ("progress", tokens)
                else:
                    getter.cancel()
                if task in done:
                    break
            try:
                result = task.result()
            except BackendError as err:
                yield ("error", str(err), err.retryable)
                return
            except Exception as err:  # noqa: BLE001 - a bug in a backend fails the call
                yield ("error", f"{type(err).__name__}: {err}", True)
                return
            yield ("result", result, self.incarnation)
        finally:
            self.calls_in_flight -= 1
            if not task.done():
                task.cancel()
                try:
                    await task
                except BaseException:  # noqa: BLE001 - cancelled on purpose
                    pass

    def count_tokens(self, text: str) -> int:
        return self.backend.count_tokens(text)

    async def close(self) -> None:
        await self.backend.close()
