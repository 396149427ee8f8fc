"""One scheduler for every replica on a host: coordinator shards served over a Unix socket.

``agentflow serve --replicas N`` runs N server processes; without this each would run its
own coordinator over its own connections to the instances, so N replicas would each believe
they have the whole fleet (N times every ``max_inflight``, N queues that never see each
other). Here the supervisor starts one more process, the *scheduler process*
(``python -m agentflow.distributed.shard_socket``), which hosts the K coordinator shards of
``scheduler.shards`` (one by default) and the instances' backends, and every replica submits
its calls to it (``scheduler: {shard_hosts: socket, shard_socket: PATH}``, set by the
supervisor). One queue, one view of the instances, whichever replica a query came in on.

The shard is the same ``ShardHost`` a Ray actor runs (``agentflow.distributed.shard_actor``)
and the replica's handle, ``SocketShard``, is a ``ShardHandle`` like ``RayShard``: a call
carries the query's identity and a snapshot of its DAG (the shard registers a query it does
not know), progress streams back, then the outcome with the shard's load summary.

Wire format: a 4-byte length, then a pickle. Pickle is only safe between processes that
trust each other: the socket lives in a directory only its user may enter (mode 0700) and
is itself 0600, so only processes of the user who started the server can connect, and
those could run the code anyway.

Failure: when the scheduler process dies the supervisor starts a new one on the same
path; each replica's calls in flight notice the closed connection, wait for the new process
(``reconnect_s``) and run again there (a query's calls take longer, none is lost). When a
replica's connection closes, the scheduler ends that replica's queries (a replica killed
with SIGKILL must not hold admission slots forever); its queries are re-run by another
replica (``agentflow.server.replica``), which registers them again.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import pickle
import signal
import struct
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from agentflow.llm.base import BackendError, ProgressCallback
from agentflow.scheduler.shards import ShardLoad
from agentflow.workflow.router import CallOutcome, LLMCall

if TYPE_CHECKING:
    from agentflow.config import AgentFlowConfig
    from agentflow.distributed.shard_actor import ShardHost
    from agentflow.workflow.clock import Clock
    from agentflow.workflow.graph import WorkflowRun
    from agentflow.workflow.query import Query

log = logging.getLogger("agentflow.distributed")

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024  # a call's request and DAG are kilobytes; a bad peer is not


def encode(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


class Outbox:
    """Frames queued for one connection and written together once per loop turn: the
    three candidates of a query are ready in the same turn, and so are results that
    finish together, so one ``send`` (one wake-up of the peer) carries them all instead
    of one each. ``write`` is the transport's; ``open`` says whether it still takes data
    (a connection closed meanwhile drops what was queued: its calls run again)."""

    def __init__(self, write: Callable[[bytes], None], open: Callable[[], bool]):
        self._write = write
        self._open = open
        self._frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        if not self._frames:
            asyncio.get_running_loop().call_soon(self.flush)
        self._frames.append(frame)

    def flush(self) -> None:
        frames, self._frames = self._frames, []
        if frames and self._open():
            self._write(frames[0] if len(frames) == 1 else b"".join(frames))


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message, or ``None`` when the peer closed the connection."""
    try:
        header = await reader.readexactly(_HEADER.size)
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME:
            raise ConnectionError(f"a frame of {size} bytes (at most {MAX_FRAME})")
        return pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionResetError):
        return None


# ---------------------------------------------------------------------------- the server
class ShardServer:
    """The scheduler process's side: K ``ShardHost``s, any number of replicas connected.

    ``stats()`` says which connections sent how many calls to which shard: the evidence
    that the replicas share one queue (``agentflow.distributed.shard_socket.stats``)."""

    def __init__(self, hosts: list[ShardHost]):
        self.hosts = hosts
        self.clients: dict[int, dict[str, Any]] = {}  # connection -> who, calls per shard
        self._owner: dict[str, int] = {}  # query id -> the connection that sent it last
        self._ids = itertools.count(1)
        self._writers: set[asyncio.StreamWriter] = set()
        self._streams: set[asyncio.Task] = set()  # every call in flight, all connections

    async def close_clients(self) -> None:
        """Close every replica's connection (they reconnect to the next process) and end
        the calls in flight."""
        writers = list(self._writers)
        for writer in writers:
            writer.close()
        streams = list(self._streams)
        for task in streams:
            task.cancel()
        waits = [asyncio.ensure_future(w.wait_closed()) for w in writers] + streams
        if waits:
            await asyncio.wait(waits, timeout=5)

    async def serve(self, path: str | Path) -> asyncio.AbstractServer:
        path = Path(path)
        if path.exists():  # a previous scheduler process's socket: nobody listens on it
            path.unlink()
        old = os.umask(0o177)  # the socket is created 0600
        try:
            return await asyncio.start_unix_server(self._client, path=str(path))
        finally:
            os.umask(old)

    def stats(self) -> dict[str, Any]:
        return {"shards": len(self.hosts), "pid": os.getpid(),
                "clients": [dict(c, calls=dict(c["calls"])) for c in self.clients.values()],
                "queries": [len(h.runs) for h in self.hosts]}

    async def _client(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        conn = next(self._ids)
        info: dict[str, Any] = {"conn": conn, "name": "?", "calls": {}}
        self.clients[conn] = info
        self._writers.add(writer)
        outbox = Outbox(writer.write, lambda: not writer.is_closing())
        calls: dict[int, asyncio.Task] = {}
        try:
            while True:
                message = await read_frame(reader)
                if message is None:
                    break
                kind = message[0]
                if kind == "hello":
                    info["name"] = str(message[1])
                elif kind == "submit":
                    _, rid, shard, query, dag, node_id, request, progress = message
                    self._owner[query["id"]] = conn
                    info["calls"][shard] = info["calls"].get(shard, 0) + 1
                    stream = asyncio.ensure_future(self._stream(
                        outbox, rid, self.hosts[shard], query, dag, node_id, request,
                        progress))
                    calls[rid] = stream
                    self._streams.add(stream)
                    stream.add_done_callback(self._streams.discard)
                    stream.add_done_callback(
                        lambda _t, rid=rid: calls.pop(rid, None))  # type: ignore[misc]
                elif kind == "cancel":
                    running = calls.get(message[1])
                    if running is not None:
                        running.cancel()
                elif kind == "tell":
                    _, shard, method, args = message
                    targets = self.hosts if shard is None else [self.hosts[shard]]
                    for host in targets:
                        await getattr(host, _TELLS[method])(*args)
                    if method == "end_query":
                        self._owner.pop(args[0], None)
                elif kind == "ask":
                    _, rid, what = message
                    outbox.send(encode((rid, ("reply", self._answer(what)))))
                else:
                    log.warning("scheduler: unknown message %r from %s", kind, info["name"])
        finally:
            for task in list(calls.values()):
                task.cancel()
            # the replica is gone: its queries must not hold the shards' admission slots
            for query_id, owner in list(self._owner.items()):
                if owner == conn:
                    del self._owner[query_id]
                    for host in self.hosts:
                        await host.end_query(query_id)
            info["closed"] = True
            self._writers.discard(writer)
            writer.close()

    def _answer(self, what: str) -> Any:
        """A replica's question: ``stats``, ``load`` (each shard's summary) or ``health``
        (every instance's state and counters, for its /v1/instances and /metrics)."""
        if what == "stats":
            return self.stats()
        if what == "health":
            report: dict[str, dict[str, Any]] = {}
            for host in self.hosts:
                report.update(host.instance_report())
            return report
        return [h._load() for h in self.hosts]

    async def _stream(self, outbox: Outbox, rid: int, host: ShardHost,
                      query: dict[str, Any], dag: dict[str, Any], node_id: str,
                      request: Any, progress: bool) -> None:
        # one shard: the replica's router never reads a load summary, so none is made
        load = len(self.hosts) > 1
        try:
            async for item in host.submit(query, dag, node_id, request, progress=progress,
                                          load=load):
                outbox.send(encode((rid, item)))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - the replica must hear of it, not hang
            log.exception("scheduler: a call of query %s failed", query.get("id"))
            outbox.send(encode((rid, ("error", f"scheduler process: {err}", True))))


# the replica's one-way messages, by name -> the ShardHost method they call
_TELLS = {"cancel_query": "cancel_query", "end_query": "end_query",
          "set_share_weights": "set_share_weights"}


def build_hosts(config: AgentFlowConfig) -> list[ShardHost]:
    """The K shards of ``config.scheduler.shards`` over a stratified split of its instances,
    each with its instances' backends built here."""
    from agentflow.distributed.shard_actor import ShardHost
    from agentflow.scheduler.shards import instance_kind, split_instances

    if config.placement is not None:
        raise ValueError("a shared scheduler process reaches its instances through their "
                         "backends (vLLM/OpenAI-compatible servers, local models); "
                         "'placement: ray' is not supported with it")
    sched = config.scheduler.model_dump(mode="json")
    parts = split_instances(list(config.instances), config.scheduler.shards,
                            kind=instance_kind)
    return [ShardHost(i, [inst.model_dump(mode="json") for inst in part], sched)
            for i, part in enumerate(parts)]


async def run_server(config: AgentFlowConfig, path: str | Path,
                     stop: asyncio.Event | None = None) -> None:
    """Serve the shards at ``path`` until ``stop`` is set (or SIGTERM/SIGINT)."""
    hosts = build_hosts(config)
    server = ShardServer(hosts)
    listener = await server.serve(path)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    log.info("scheduler process %d: %d shard(s) over %d instance(s) at %s", os.getpid(),
             len(hosts), len(config.instances), path)
    try:
        await stop.wait()
    finally:
        listener.close()
        await server.close_clients()
        for host in hosts:
            await host.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m agentflow.distributed.shard_socket --config JSON --socket PATH``."""
    from agentflow.config import AgentFlowConfig
    from agentflow.server.logs import configure

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="the server's config, as JSON")
    p.add_argument("--socket", required=True, help="the Unix socket to listen on")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    configure(args.log_level)
    config = AgentFlowConfig.model_validate(json.loads(Path(args.config).read_text()))
    asyncio.run(run_server(config, args.socket))
    return 0


# ---------------------------------------------------------------------------- the replica
class _Lost(Exception):
    """The scheduler process's connection closed under a call."""


class _LinkProtocol(asyncio.Protocol):
    """Frames in, messages out to the link: callbacks, no task of its own (a task would
    outlive the queries, and the engine's shutdown waits for every task on its loop)."""

    def __init__(self, link: SchedulerLink):
        self.link = link
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.outbox: Outbox | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t = cast(asyncio.Transport, transport)
        self.outbox = Outbox(t.write, lambda: not t.is_closing())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.buffer)
            if len(self.buffer) < _HEADER.size + size:
                return
            body = bytes(self.buffer[_HEADER.size:_HEADER.size + size])
            del self.buffer[:_HEADER.size + size]
            self.link._dispatch(pickle.loads(body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.link._lost(self)


class SchedulerLink:
    """A replica's one connection to the scheduler process, shared by its ``SocketShard``s.

    Lives on the engine's event loop: connects on first use, hands every reply to the queue
    of the call it answers, and reconnects (for up to ``reconnect_s``) when the scheduler
    process restarts."""

    def __init__(self, path: str | Path, *, name: str = "", reconnect_s: float = 60.0):
        self.path = str(path)
        self.name = name or f"pid {os.getpid()}"
        self.reconnect_s = reconnect_s
        self.reconnects = 0
        self._protocol: _LinkProtocol | None = None
        self._connecting: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: dict[int, asyncio.Queue] = {}
        self._ids = itertools.count(1)
        self._backlog: list[bytes] = []  # one-way messages sent before the connection
        self.down = False  # the connection was lost (or never made) and is not back yet

    @property
    def connected(self) -> bool:
        p = self._protocol
        return p is not None and p.transport is not None and not p.transport.is_closing()

    async def connect(self) -> None:
        if self.connected:
            return
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        try:
            await asyncio.shield(self._connecting)
        finally:
            if self._connecting is not None and self._connecting.done():
                self._connecting = None

    async def _connect(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reconnect_s
        while True:
            try:
                _, protocol = await loop.create_unix_connection(
                    lambda: _LinkProtocol(self), self.path)
                break
            except (FileNotFoundError, ConnectionRefusedError) as err:
                self.down = True
                if loop.time() > deadline:
                    raise BackendError(f"the scheduler process at {self.path} is not "
                                       f"answering ({err})", retryable=True) from None
                await asyncio.sleep(0.1)
        if self._protocol is not None:
            self.reconnects += 1
        self._protocol = protocol
        self.down = False
        self._write(encode(("hello", self.name)))
        for frame in self._backlog:
            self._write(frame)
        self._backlog.clear()

    def _write(self, frame: bytes) -> None:
        """Queue ``frame`` on the connection (written at the end of this loop turn)."""
        assert self._protocol is not None and self._protocol.outbox is not None
        self._protocol.outbox.send(frame)

    def _dispatch(self, message: Any) -> None:
        rid, item = message
        queue = self._waiting.get(rid)
        if queue is not None:
            queue.put_nowait(item)

    def _lost(self, protocol: _LinkProtocol) -> None:
        if protocol is not self._protocol:
            return
        self.down = True
        for queue in self._waiting.values():  # every call in flight runs again
            queue.put_nowait(("lost",))

    def tell(self, shard: int | None, method: str, *args: Any) -> None:
        """A one-way message (cancel, end, share weights); from any thread."""
        frame = encode(("tell", shard, method, args))
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop:
            loop.call_soon_threadsafe(self._send, frame)
        else:
            self._send(frame)

    def _send(self, frame: bytes) -> None:
        if self.connected:
            self._write(frame)
        else:  # not connected (yet): sent first thing after the next connect
            self._backlog.append(frame)

    async def ask(self, what: str) -> Any:
        """A question with an answer: ``stats``, ``load`` or ``health``."""
        await self.connect()
        rid = next(self._ids)
        queue: asyncio.Queue = asyncio.Queue()
        self._waiting[rid] = queue
        try:
            self._write(encode(("ask", rid, what)))
            item = await queue.get()
            if item[0] != "reply":
                raise BackendError("the scheduler process went away", retryable=True)
            return item[1]
        finally:
            self._waiting.pop(rid, None)

    async def call(self, shard: int, query: dict[str, Any], dag: dict[str, Any],
                   node_id: str, request: Any, on_progress: ProgressCallback | None
                   ) -> tuple[dict[str, Any], ShardLoad | None]:
        """Run one call on ``shard``: its result fields and the shard's load summary
        (``None`` from a scheduler process with one shard)."""
        await self.connect()
        rid = next(self._ids)
        queue: asyncio.Queue = asyncio.Queue()
        self._waiting[rid] = queue
        protocol = self._protocol
        try:
            # no progress stream when no one reads it (the pipelines' calls pass none)
            self._write(encode(("submit", rid, shard, query, dag, node_id, request,
                                on_progress is not None)))
            while True:
                item = await queue.get()
                if item[0] == "progress":
                    if on_progress is not None:
                        on_progress(item[1])
                elif item[0] == "error":
                    raise BackendError(f"shard {shard}: {item[1]}", retryable=item[2])
                elif item[0] == "lost":
                    raise _Lost()
                else:
                    return item[1], item[2]
        except asyncio.CancelledError:
            if protocol is self._protocol and self.connected:
                self._write(encode(("cancel", rid)))
            raise
        finally:
            self._waiting.pop(rid, None)

    async def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()


class SocketShard:
    """A replica's handle on one shard of the scheduler process (``ShardHandle``)."""

    def __init__(self, index: int, link: SchedulerLink, clock: Clock, *, up: int = 1):
        self.index = index
        self.link = link
        self.clock = clock  # the replica's: the run's times are kept in it
        self.rerun_calls = 0  # calls run again because the scheduler process restarted
        self._load = ShardLoad(up=up, work_s=0.0)

    def start_query(self, query: Query, run: WorkflowRun) -> None:
        pass  # the shard learns the query with its first call

    def reachable(self) -> bool:
        """False while the scheduler process is known to be gone (readiness)."""
        return not self.link.down

    def load(self) -> ShardLoad:
        return self._load

    async def instance_report(self) -> dict[str, dict[str, Any]]:
        """Every instance of the scheduler process (all its shards: they share this link)
        as its coordinator sees it (``ScheduledRouter.instance_report``): one round trip."""
        report: dict[str, dict[str, Any]] = await self.link.ask("health")
        return report

    def set_share_weights(self, weights: Mapping[str, float]) -> None:
        self.link.tell(self.index, "set_share_weights", dict(weights))

    def cancel_query(self, query_id: str) -> None:
        self.link.tell(self.index, "cancel_query", query_id)

    def end_query(self, query: Query) -> None:
        self.link.tell(self.index, "end_query", query.id)

    async def submit(self, call: LLMCall,
                     on_progress: ProgressCallback | None = None) -> CallOutcome:
        from agentflow.scheduler.run_mirror import dag_snapshot, query_snapshot

        submitted = self.clock.now()
        while True:
            now = self.clock.now()  # times cross as "seconds ago": no clock is shared
            try:
                fields, load = await self.link.call(
                    self.index, query_snapshot(call.query, now), dag_snapshot(call.run, now),
                    call.node.id, call.request, on_progress)
                if load is not None:  # None: one shard, whose load no one reads
                    self._load = load
            except _Lost:
                log.warning("the scheduler process went away under a call of query %s: "
                            "the call runs again on the next one", call.query.id)
                self.rerun_calls += 1
                continue
            finished = self.clock.now()
            return CallOutcome(result=fields["result"], instance=fields["instance"],
                               submitted=submitted,
                               started=max(submitted, finished - fields["run_s"]),
                               finished=finished, priority=fields["priority"],
                               failed_attempts=tuple(fields["failed_attempts"]))

    async def close(self) -> None:
        if self.index == 0:  # one link for all shards: closed once
            await self.link.close()


def socket_shards(config: AgentFlowConfig, clock: Clock) -> list[SocketShard]:
    """The replica's handles on the scheduler process at ``scheduler.shard_socket``."""
    from agentflow.scheduler.shards import instance_kind, split_instances

    path = config.scheduler.shard_socket
    if not path:
        raise ValueError("scheduler.shard_hosts: socket needs scheduler.shard_socket (the "
                         "scheduler process's Unix socket)")
    parts = split_instances(list(config.instances), config.scheduler.shards,
                            kind=instance_kind)
    link = SchedulerLink(path)
    return [SocketShard(i, link, clock, up=len(part)) for i, part in enumerate(parts)]


async def stats(path: str | Path) -> dict[str, Any]:
    """Who sent how many calls to the scheduler process at ``path`` (tests, diagnosis)."""
    link = SchedulerLink(path, name="stats", reconnect_s=5.0)
    try:
        result: dict[str, Any] = await link.ask("stats")
        return result
    finally:
        await link.close()


if __name__ == "__main__":
    sys.exit(main())
