"""``GET /v1/queries/{id}/events``: a query's stage progress as Server-Sent Events.

Replays the events so far, then streams live ones, and ends after ``done``. Stage events
come from agentflow's loop thread; the listener only hands them to this request's asyncio
queue (never raising into the engine, which would fail the query). The stream also ends if
the query's future finishes without a ``done`` event (an internal error), so no client
waits forever. Event ids are positions, so ``Last-Event-ID`` resumes a dropped stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from agentflow.api import QueryHandle
from agentflow.server.service import QueryService

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0
# A reader that takes longer than this to accept one event is dropped: a client that never
# reads would otherwise pin the event (a done event carries the whole answer) and its socket
# buffers for as long as it stays connected (40 such streams of a 10 MB answer: 651 MB).
WRITE_TIMEOUT_S = 30.0
WRITE_SLICE = 64 * 1024
_END = object()


class EventStreamResponse(StreamingResponse):
    """A streaming response that drops a slow reader: each chunk must be taken by the client
    within ``WRITE_TIMEOUT_S`` (the server's send waits while the client's socket is full),
    else the stream ends there, the event source is closed and the connection dropped."""

    async def stream_response(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        body = self.body_iterator
        try:
            async for chunk in body:
                data = chunk if isinstance(chunk, bytes | memoryview) else \
                    chunk.encode(self.charset)
                # In slices: the server hands a whole body message to the socket's buffer
                # before it waits, so a slow reader holds at most one slice, not the event.
                for at in range(0, len(data), WRITE_SLICE):
                    try:
                        await asyncio.wait_for(send({"type": "http.response.body",
                                                     "body": data[at:at + WRITE_SLICE],
                                                     "more_body": True}), WRITE_TIMEOUT_S)
                    except asyncio.TimeoutError:
                        log.info("event stream dropped: the client took over %gs to read",
                                 WRITE_TIMEOUT_S)
                        raise SlowReader() from None
        finally:
            close = getattr(body, "aclose", None)
            if close is not None:
                await close()  # unsubscribes the stream's listener now, not at GC time
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class SlowReader(OSError):
    """The client stopped reading (Starlette turns an OSError here into a disconnect)."""


def format_event(event_id: int, event: dict[str, Any]) -> str:
    data = json.dumps(event, default=str, separators=(",", ":"))
    return f"id: {event_id}\nevent: {event.get('type', 'message')}\ndata: {data}\n\n"


async def stream(service: QueryService, handle: QueryHandle,
                 last_event_id: int = 0) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def listener(event: Any) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # this request's loop is closed: nothing to deliver to
            pass

    past = handle.subscribe(listener)
    handle.future.add_done_callback(lambda _: listener(_END))
    sent = 0
    try:
        yield "retry: 2000\n\n"
        pending = list(past)
        while True:
            while pending:
                event = pending.pop(0)
                if event is _END:
                    # Finished without a done event: say how, then stop.
                    answer = service.result(handle)
                    event = {"type": "done", "query_id": handle.query_id,
                             "status": answer.status, "error": answer.error,
                             "latency_s": answer.latency_s}
                sent += 1
                if sent <= last_event_id and event.get("type") != "done":
                    continue
                if event.get("type") == "done":
                    final = await service.wait(handle, timeout=10)
                    if final is not None:
                        event = {**event, "answer": service.view(handle).model_dump()}
                    yield format_event(sent, event)
                    return
                yield format_event(sent, event)
            try:
                pending.append(await asyncio.wait_for(queue.get(), KEEPALIVE_S))
            except asyncio.TimeoutError:
                yield ": keep-alive\n\n"
    finally:
        handle.unsubscribe(listener)
