"""close_loop finishes what a bare ``loop.close()`` leaves behind (tasks, generators)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Iterator

import pytest

from agentflow.event_loop import close_loop


@contextlib.contextmanager
def private_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh loop closed by close_loop, as the benches use it (try/finally)."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        close_loop(loop)


def test_a_pending_task_is_cancelled_and_finished_before_the_loop_closes():
    seen: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with private_loop() as loop:
        task = loop.create_task(forever())
        loop.run_until_complete(asyncio.sleep(0))
    assert task.cancelled() and seen == ["cancelled"]
    assert loop.is_closed()


def test_a_half_read_async_generator_is_closed():
    closed: list[bool] = []

    async def stream() -> AsyncIterator[int]:
        try:
            for i in range(10):
                yield i
        finally:
            closed.append(True)

    gen = stream()

    async def first() -> int:  # iterated on the loop, as a streamed response is
        return await gen.__anext__()

    with private_loop() as loop:
        assert loop.run_until_complete(first()) == 0
    assert closed == [True]


def test_cleanup_runs_when_the_body_raises_and_no_task_is_destroyed_pending():
    destroyed: list[dict] = []
    with pytest.raises(RuntimeError, match="boom"):
        with private_loop() as loop:
            loop.set_exception_handler(lambda _loop, ctx: destroyed.append(ctx))
            loop.create_task(asyncio.sleep(3600))
            raise RuntimeError("boom")
    gc.collect()
    assert loop.is_closed()
    assert not [c for c in destroyed if "destroyed" in c.get("message", "")]


def test_a_task_that_fails_while_cancelled_is_reported_not_swallowed():
    reported: list[dict] = []

    async def bad_cleanup() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise ValueError("cleanup failed")

    with private_loop() as loop:
        loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))
        loop.create_task(bad_cleanup())
        loop.run_until_complete(asyncio.sleep(0))
    assert [type(c["exception"]) for c in reported] == [ValueError]
