"""A single worker thread fed by a priority queue, awaited from asyncio.

Why: one llama.cpp context can run one call at a time and its calls block for seconds, so they
must run off the event loop, one after another, and the *next* call must be chosen when the
worker frees up (not when calls arrive) for priorities to mean anything. Lower priority value
runs first (vLLM convention); equal priorities run in arrival order.

The worker is loop-agnostic: jobs carry their own event loop, results travel back with
``call_soon_threadsafe``, and dispatch happens in whichever thread frees the worker. No task
runs in the background, so a backend can be created outside any loop and used from several.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentflow.llm.base import BackendError

T = TypeVar("T")


@dataclass(order=True)
class Job(Generic[T]):
    """One queued call. ``fn`` runs in the worker thread and should poll ``cancelled()``."""

    priority: int
    seq: int
    fn: Callable[[Job[T]], T] = field(compare=False)
    loop: asyncio.AbstractEventLoop = field(compare=False)
    future: asyncio.Future = field(compare=False)
    enqueued_at: float = field(compare=False, default_factory=time.perf_counter)
    started_at: float | None = field(compare=False, default=None)
    cancel_event: threading.Event = field(compare=False, default_factory=threading.Event)

    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    @property
    def queue_s(self) -> float:
        return (self.started_at or time.perf_counter()) - self.enqueued_at

    def post(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run ``callback(*args)`` on the job's event loop (progress callbacks must not run
        in the worker thread: they touch scheduler state owned by the loop). Nothing is
        posted for a cancelled job: its caller has stopped listening."""
        if self.cancelled():
            return
        try:
            self.loop.call_soon_threadsafe(_call_quietly, callback, args)
        except RuntimeError:  # loop closed: nobody is listening any more
            pass


def _call_quietly(callback: Callable[..., Any], args: tuple) -> None:
    # A failing progress callback must not kill the call it reports on.
    try:
        callback(*args)
    except Exception:  # noqa: BLE001
        pass


def _resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled by the caller meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class PriorityWorker:
    """Runs submitted functions one at a time in a dedicated thread, lowest priority first."""

    def __init__(self, name: str = "llm-worker"):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._heap: list[Job[Any]] = []
        self._seq = itertools.count()
        self._busy = False
        self._running: Job[Any] | None = None
        self._closed = False

    @property
    def queued(self) -> int:
        """Jobs waiting (not running), cancelled ones excluded."""
        with self._lock:
            return sum(1 for job in self._heap if not job.cancelled())

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._busy

    async def submit(self, priority: int, fn: Callable[[Job[T]], T]) -> T:
        """Queue ``fn`` and wait for its result. Cancelling the awaiting task flags the job:
        a queued job never starts, a running one is expected to return at its next poll."""
        loop = asyncio.get_running_loop()
        job: Job[T] = Job(priority, next(self._seq), fn, loop, loop.create_future())
        with self._lock:
            if self._closed:
                raise BackendError("backend is closed", retryable=True)
            heapq.heappush(self._heap, job)
        self._dispatch()
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancel_event.set()
            raise

    def _dispatch(self) -> None:
        with self._lock:
            if self._busy or self._closed:
                return
            job = None
            while self._heap:
                candidate = heapq.heappop(self._heap)
                if not candidate.cancelled():
                    job = candidate
                    break
            if job is None:
                return
            self._busy = True
            self._running = job
            # Submitted under the lock so close() cannot shut the executor down between
            # choosing a job and starting it (the job would then never resolve).
            self._executor.submit(self._run, job)

    def _run(self, job: Job[Any]) -> None:
        job.started_at = time.perf_counter()
        result: Any = None
        error: BaseException | None = None
        try:
            result = job.fn(job)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            error = exc
        with self._lock:
            self._busy = False
            self._running = None
        try:
            job.loop.call_soon_threadsafe(_resolve, job.future, result, error)
        except RuntimeError:  # the caller's loop is gone
            pass
        self._dispatch()

    async def close(self) -> None:
        """Fail queued jobs, stop the running one at its next poll, and join the thread."""
        with self._lock:
            self._closed = True
            pending, self._heap = self._heap, []
            running = self._running
        if running is not None:
            running.cancel_event.set()
        for job in pending:
            job.cancel_event.set()
            try:
                job.loop.call_soon_threadsafe(
                    _resolve, job.future, None, BackendError("backend closed", retryable=True))
            except RuntimeError:
                pass
        await asyncio.to_thread(self._executor.shutdown, True)
