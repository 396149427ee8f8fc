"""Database worker threads allotted per tenant, so one tenant's slow SQL cannot take them all.

Why not ``asyncio.to_thread``: its default executor is one pool of ``cpu + 4`` threads shared
by everything a server does off the loop. Eight slow SQLite queries of one tenant (each within
that tenant's own concurrency limit) held all of them, and every other tenant's next query —
even its cheap steps, opening a database or reading its taught examples — waited behind them
(B's median 0.14 -> 0.80 s). A PostgreSQL pool of 4 + 4 connections fills the same way.

Here SQL (a pipeline's candidates, taught SQL, MCP ``run_sql``) runs in a pool of its own,
``workers`` threads, and each tenant may hold at most its *cap* of them at once:

    cap = floor(workers * w / (w + 1)),  at least 1 and at most workers - 1

where ``w`` is the tenant's weight times its SLO class's weight — the share it would have
beside one other tenant of weight 1 (weights 1, 2, 0.5 of 8 threads: 4, 5, 2). Whatever the
flood, at least ``workers - cap`` threads stay for the others. When a thread frees up, the
waiting tenant holding the least per unit of weight gets it (first come first served within a
tenant). A caller with no tenant (a local Python API user, a server without keys) is the only
user there is and may use every thread. Admins are tenants like the others: an admin key
flooding gets its cap, not the pool.

A slot is held until the SQL's thread returns, even when the query that asked was cancelled
(the thread cannot be stopped sooner; the engine's own timeout stops it), so the count always
matches the threads in use. Thread-safe: waiters from any event loop or thread.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_WORKERS = 8
LOCAL = ""  # the share key of a caller with no tenant


@dataclass(frozen=True)
class Share:
    """Who asks for a database thread: the tenant's name (``LOCAL``: no tenant) and its
    weight (tenant weight x SLO class weight)."""

    name: str = LOCAL
    weight: float = 1.0


def share_of(tenant: Any, classes: Mapping[str, Any] | None = None) -> Share:
    """The ``Share`` of a ``Tenant`` (or None): its weight times its class's weight."""
    if tenant is None:
        return Share()
    from agentflow.slo_classes import DEFAULT_CLASS

    klass = (classes or {}).get(tenant.slo_class or DEFAULT_CLASS)
    weight = float(tenant.weight) * float(getattr(klass, "weight", 1.0))
    return Share(tenant.name, weight)


class _Waiter:
    __slots__ = ("granted", "share", "seq", "wake")

    def __init__(self, share: Share, seq: int, wake: Callable[[], None]):
        self.share = share
        self.seq = seq
        self.wake = wake
        self.granted = False


class DbShares:
    """``await shares.run(share, fn, *args)`` runs ``fn`` in a database thread within the
    share's cap; ``shares.call(...)`` is the blocking form for synchronous callers."""

    def __init__(self, workers: int = DEFAULT_WORKERS):
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"database workers must be a positive integer, got {workers!r}")
        self.workers = workers
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agentflow-db")
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._total = 0
        self._waiting: dict[str, deque[_Waiter]] = {}
        self._seq = itertools.count()
        self.waited: dict[str, int] = {}  # times a tenant had to wait for its share

    # ------------------------------------------------------------------ caps
    def cap(self, share: Share) -> int:
        """The most threads ``share`` may hold at once."""
        if share.name == LOCAL or self.workers == 1:
            return self.workers
        w = share.weight
        return max(1, min(self.workers - 1, math.floor(self.workers * w / (w + 1.0))))

    def held(self, name: str) -> int:
        with self._lock:
            return self._held.get(name, 0)

    # ------------------------------------------------------------------ running
    async def run(self, share: Share, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        await self._acquire_async(share)
        try:
            future = self._pool.submit(functools.partial(fn, *args, **kwargs))
        except BaseException:
            self._release(share)
            raise
        future.add_done_callback(lambda _: self._release(share))
        return await asyncio.wrap_future(future)

    def call(self, share: Share, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Blocking: wait for a slot, run ``fn`` in this thread, give the slot back."""
        event = threading.Event()
        waiter = self._enqueue(share, event.set)
        if waiter is not None:
            event.wait()
        try:
            return fn(*args, **kwargs)
        finally:
            self._release(share)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ internals
    async def _acquire_async(self, share: Share) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_settle, ready)
        waiter = self._enqueue(share, wake)
        if waiter is None:
            return
        try:
            await ready
        except BaseException:
            with self._lock:
                if not waiter.granted:  # still queued: leave the queue, nothing to give back
                    queue = self._waiting.get(share.name)
                    if queue is not None and waiter in queue:
                        queue.remove(waiter)
                        if not queue:
                            del self._waiting[share.name]
                    raise
            self._release(share)  # granted as we were cancelled: hand it on
            raise

    def _enqueue(self, share: Share, wake: Callable[[], None]) -> _Waiter | None:
        """Take a slot now (None) or join the queue (the waiter, woken when granted)."""
        with self._lock:
            if self._total < self.workers and self._held.get(share.name, 0) < self.cap(share):
                self._take(share.name)
                return None
            waiter = _Waiter(share, next(self._seq), wake)
            self._waiting.setdefault(share.name, deque()).append(waiter)
            self.waited[share.name] = self.waited.get(share.name, 0) + 1
            return waiter

    def _take(self, name: str) -> None:
        self._held[name] = self._held.get(name, 0) + 1
        self._total += 1

    def _release(self, share: Share) -> None:
        woken: list[_Waiter] = []
        with self._lock:
            left = self._held.get(share.name, 0) - 1
            if left > 0:
                self._held[share.name] = left
            else:
                self._held.pop(share.name, None)
            self._total -= 1
            while self._total < self.workers:
                waiter = self._next_waiter()
                if waiter is None:
                    break
                waiter.granted = True
                self._take(waiter.share.name)
                woken.append(waiter)
        for waiter in woken:
            waiter.wake()

    def _next_waiter(self) -> _Waiter | None:
        """The head waiter of the eligible tenant holding least per unit of weight."""
        best: tuple[float, int, str] | None = None
        for name, queue in self._waiting.items():
            head = queue[0]
            held = self._held.get(name, 0)
            if held >= self.cap(head.share):
                continue
            key = (held / head.share.weight, head.seq, name)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        queue = self._waiting[best[2]]
        waiter = queue.popleft()
        if not queue:
            del self._waiting[best[2]]
        return waiter


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


__all__ = ["DEFAULT_WORKERS", "DbShares", "LOCAL", "Share", "share_of"]
