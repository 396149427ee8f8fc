"""One scheduler process shared by two front ends (``shard_hosts: socket``): real queries
through the demo database, the instance's backend scripted (no model; built in the
scheduler process only). Both front ends' calls land in the same shard — one queue: an
instance that runs one call at once runs the two front ends' calls one after another — and
a restarted scheduler process loses no query."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.distributed import shard_socket
from agentflow.distributed.shard_socket import ShardServer, SocketShard, build_hosts
from agentflow.scheduler.shard_router import ShardedRouter
from agentflow.server.testing import scripted_instance
from tests.utils import wait_until

pytestmark = pytest.mark.timeout(120)

CALL_S = 0.15


def config(sock: Path | None = None, *, inflight: int = 1) -> AgentFlowConfig:
    data = {"fewshot": None, "pipeline": "single",
            "instances": [scripted_instance("only", latency_s=CALL_S, max_inflight=inflight)],
            "scheduler": {"admit_by_backlog": False}}
    if sock is not None:
        data["scheduler"] = {**data["scheduler"], "shard_hosts": "socket",
                             "shard_socket": str(sock)}
    return AgentFlowConfig.model_validate(data)


class Scheduler:
    """The scheduler process's server, on a loop in a thread of this test."""

    def __init__(self, path: Path, inflight: int = 1):
        self.path = path
        self.loop = asyncio.new_event_loop()
        self.server = ShardServer(build_hosts(config(inflight=inflight)))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.listener = asyncio.run_coroutine_threadsafe(self.server.serve(path),
                                                         self.loop).result(30)

    def calls(self) -> int:
        return sum(sum(c["calls"].values()) for c in self.server.clients.values())

    def close(self) -> None:
        async def down() -> None:
            self.listener.close()
            await self.server.close_clients()
            for host in self.server.hosts:
                await host.close()
        asyncio.run_coroutine_threadsafe(down(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture
def sock(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "scheduler.sock"


def test_two_front_ends_share_one_queue(sock: Path) -> None:
    scheduler = Scheduler(sock, inflight=1)
    try:
        with AgentFlow(config(sock)) as a, AgentFlow(config(sock)) as b:
            assert a.backends == {} and b.backends == {}  # the instances are the scheduler's
            assert isinstance(a.router, ShardedRouter)
            assert isinstance(a.router.shards[0], SocketShard)
            started = time.monotonic()
            handles = [af.submit(f"How many stores are there? {i}", db="bookshop")
                       for i in range(3) for af in (a, b)]
            answers = [h.result(timeout=90) for h in handles]
            elapsed = time.monotonic() - started
            assert [x.status for x in answers] == ["done"] * 6, [x.error for x in answers]
            stats = asyncio.run(shard_socket.stats(sock))
        calls = [c["calls"].get(0, 0) for c in stats["clients"] if c["name"] != "stats"]
        assert len(calls) == 2 and all(n > 0 for n in calls), stats  # both in one shard
        # one instance, one call at once, for both: every call waited for the others
        # (two coordinators would each have run one at once: about half this time)
        assert elapsed >= sum(calls) * CALL_S * 0.95, (elapsed, calls)
    finally:
        scheduler.close()


def test_a_restarted_scheduler_process_loses_no_query(sock: Path) -> None:
    scheduler = Scheduler(sock, inflight=4)
    try:
        with AgentFlow(config(sock)) as af:
            handles = [af.submit(f"How many stores are there? {i}", db="bookshop")
                       for i in range(6)]
            wait_until(lambda: scheduler.calls() > 0, what="a call in the scheduler")
            scheduler.close()  # what a crash of its process looks like to the front end
            scheduler = Scheduler(sock, inflight=4)
            answers = [h.result(timeout=90) for h in handles]
            assert [x.status for x in answers] == ["done"] * 6, [x.error for x in answers]
            shard = af.router.shards[0]
            assert isinstance(shard, SocketShard) and shard.rerun_calls >= 1
    finally:
        scheduler.close()


def test_no_scheduler_is_a_clear_error(sock: Path) -> None:
    with AgentFlow(config(sock)) as af:
        shard = af.router.shards[0]
        assert isinstance(shard, SocketShard)
        shard.link.reconnect_s = 0.3
        answer = af.submit("How many stores are there?", db="bookshop").result(timeout=60)
        assert answer.status == "failed"
        assert "scheduler process" in (answer.error or "")


def test_a_replica_is_not_ready_while_its_scheduler_process_is_gone(sock: Path) -> None:
    """Over real HTTP: /readyz is 503 once a call found the scheduler process gone, and
    200 again when it is back (the supervisor restarts it)."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from agentflow.server.testing import LiveServer

    data = config(sock).model_dump(mode="json")
    with LiveServer(data) as live:
        shard = live.service.af.router.shards[0]
        shard.link.reconnect_s = 0.3
        assert httpx.get(f"{live.url}/readyz", timeout=30).status_code == 200
        r = httpx.post(f"{live.url}/v1/queries", json={
            "question": "How many stores are there?", "db": "bookshop", "wait": True},
            timeout=60)
        assert r.json()["status"] == "failed" and "scheduler process" in r.json()["error"]
        ready = httpx.get(f"{live.url}/readyz", timeout=30)
        assert ready.status_code == 503 and ready.json()["instances_up"] == 0
        scheduler = Scheduler(sock)
        try:
            r = httpx.post(f"{live.url}/v1/queries", json={
                "question": "How many stores are there?", "db": "bookshop", "wait": True},
                timeout=60)
            assert r.json()["status"] == "done", r.text
            assert httpx.get(f"{live.url}/readyz", timeout=30).status_code == 200
        finally:
            scheduler.close()


def test_progress_crosses_only_when_the_caller_reads_it(sock: Path) -> None:
    """A call whose caller passes ``on_progress`` hears the token counts; one that passes
    none (every pipeline stage) gets only its result over the socket: no progress frame,
    and, from a scheduler process with one shard, no load summary either."""
    from agentflow.llm.base import LLMRequest, SamplingParams
    from agentflow.workflow.clock import MonotonicClock
    from agentflow.workflow.router import LLMCall
    from tests.scheduler.utils import chain_run

    async def run() -> tuple[list[int], list[str], list[str], tuple[int, float]]:
        server = ShardServer(build_hosts(config(inflight=4)))
        listener = await server.serve(sock)
        link = shard_socket.SchedulerLink(sock)
        shard = SocketShard(0, link, MonotonicClock())
        kinds: list[str] = []
        dispatch = link._dispatch

        def record(message):  # every frame the replica receives, by kind
            kinds.append(message[1][0])
            dispatch(message)
        link._dispatch = record  # type: ignore[method-assign]

        def call(query_id: str) -> LLMCall:
            flow = chain_run(query_id, 60.0, ["generate_candidate"])
            request = LLMRequest(prompt="SELECT", params=SamplingParams(max_tokens=40),
                                 stage="generate_candidate", query_id=query_id)
            return LLMCall(request=request, run=flow, node=flow.node(f"{query_id}.0"))

        try:
            seen: list[int] = []
            with_progress = await shard.submit(call("qa"), seen.append)
            kinds_a, kinds[:] = list(kinds), []
            without = await shard.submit(call("qb"))
            assert with_progress.result.text and without.result.text
            load = shard.load()
            return seen, kinds_a, list(kinds), (load.up, load.work_s)
        finally:
            await link.close()
            listener.close()
            await server.close_clients()
            for host in server.hosts:
                await host.close()

    seen, with_kinds, without_kinds, load = asyncio.run(run())
    assert seen and seen[-1] > 0  # the scripted answer's tokens, as they were reported
    assert with_kinds == ["progress"] * len(seen) + ["result"]
    assert without_kinds == ["result"]
    assert load == (1, 0.0)  # the handle's own summary: none came back to replace it
