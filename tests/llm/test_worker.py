"""The priority worker and the prefix-state cache, without a model."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from agentflow.llm.base import BackendError
from agentflow.llm.grammars import SQL_AFTER_SELECT_GBNF, SQL_SELECT_GBNF, sql_select_grammar
from agentflow.llm.prefix_cache import PrefixStateCache, SavedState, common_prefix_len
from agentflow.llm.worker import PriorityWorker


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


def test_worker_picks_lowest_priority_value_when_it_frees_up():
    async def scenario():
        worker = PriorityWorker()
        gate = threading.Event()
        entered = threading.Event()
        order: list[str] = []

        def blocker(job):
            entered.set()
            assert gate.wait(10)
            return "blocker"

        def make(label):
            def fn(job):
                order.append(label)
                return label
            return fn

        first = asyncio.create_task(worker.submit(0, blocker))
        await asyncio.to_thread(entered.wait, 10)
        rest = [asyncio.create_task(worker.submit(p, make(label)))
                for label, p in [("p9", 9), ("p2-a", 2), ("p-1", -1), ("p2-b", 2)]]
        await asyncio.sleep(0)  # let the submissions enqueue
        assert worker.queued == 4 and worker.busy
        gate.set()
        results = await asyncio.gather(first, *rest)
        await worker.close()
        return order, results

    order, results = run(scenario())
    assert order == ["p-1", "p2-a", "p2-b", "p9"]
    assert results == ["blocker", "p9", "p2-a", "p-1", "p2-b"]


def test_cancelled_queued_job_never_runs_and_running_job_sees_the_flag():
    async def scenario():
        worker = PriorityWorker()
        entered = threading.Event()
        saw_cancel = threading.Event()
        ran: list[str] = []

        def polling(job):
            entered.set()
            for _ in range(1000):
                if job.cancelled():
                    saw_cancel.set()
                    return "stopped"
                threading.Event().wait(0.01)
            return "finished"

        def never(job):
            ran.append("never")

        running = asyncio.create_task(worker.submit(0, polling))
        await asyncio.to_thread(entered.wait, 10)
        queued = asyncio.create_task(worker.submit(0, never))
        await asyncio.sleep(0)
        queued.cancel()
        running.cancel()
        for task in (queued, running):
            with pytest.raises(asyncio.CancelledError):
                await task
        after = await worker.submit(0, lambda job: "next")
        await worker.close()
        return ran, saw_cancel.is_set(), after

    ran, saw_cancel, after = run(scenario())
    assert ran == [] and saw_cancel and after == "next"


def test_errors_reach_the_caller_and_close_fails_queued_jobs():
    async def scenario():
        worker = PriorityWorker()

        def boom(job):
            raise BackendError("bad", retryable=False)

        with pytest.raises(BackendError):
            await worker.submit(0, boom)
        gate = threading.Event()
        entered = threading.Event()

        def blocker(job):
            entered.set()
            while not job.cancelled() and not gate.is_set():
                gate.wait(0.01)
            return "done"

        running = asyncio.create_task(worker.submit(0, blocker))
        await asyncio.to_thread(entered.wait, 10)
        queued = asyncio.create_task(worker.submit(0, lambda job: "late"))
        await asyncio.sleep(0)
        await worker.close()
        with pytest.raises(BackendError):
            await queued
        assert await running == "done"
        with pytest.raises(BackendError):
            await worker.submit(0, lambda job: "closed")

    run(scenario())


def tokens(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.intc)


def test_common_prefix_len():
    assert common_prefix_len(tokens(1, 2, 3), tokens(1, 2, 4)) == 2
    assert common_prefix_len(tokens(1, 2), tokens(1, 2, 3)) == 2
    assert common_prefix_len(tokens(), tokens(1)) == 0
    assert common_prefix_len(tokens(5), tokens(1)) == 0


def test_prefix_cache_finds_longest_prefix_drops_dominated_and_evicts_by_bytes():
    cache = PrefixStateCache(capacity_bytes=300)
    a = SavedState(tokens(1, 2, 3), b"a" * 88)  # 100 bytes with the tokens
    cache.put(a)
    assert cache.best(tokens(1, 2, 9)) == (2, a)
    assert cache.best(tokens(7)) is None
    longer = SavedState(tokens(1, 2, 3, 4), b"b" * 84)  # holds everything a holds
    cache.put(longer)
    assert len(cache) == 1 and cache.best(tokens(1, 2, 3, 4, 5)) == (4, longer)
    others = [SavedState(tokens(10 + i, 1), b"c" * 92) for i in range(3)]
    for state in others:
        cache.put(state)
    assert cache.size_bytes <= 300
    assert cache.best(tokens(1, 2, 3)) is None  # the oldest went first
    assert cache.best(tokens(12, 1)) == (2, others[2])
    cache.put(SavedState(tokens(1), b"x" * 1000))  # larger than the whole cache: ignored
    assert cache.size_bytes <= 300


def test_sql_grammar_selection():
    assert sql_select_grammar("") == SQL_SELECT_GBNF
    assert sql_select_grammar("SELECT") == SQL_AFTER_SELECT_GBNF
    assert sql_select_grammar(" SELECT") == SQL_AFTER_SELECT_GBNF
    with pytest.raises(ValueError):
        sql_select_grammar("WITH")
    for grammar in (SQL_SELECT_GBNF, SQL_AFTER_SELECT_GBNF):
        assert grammar.startswith("root ::=")
