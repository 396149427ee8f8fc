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
from collections.abc import AsyncIterator
from typing import Any

from agentflow.api import QueryHandle
from agentflow.server.service import QueryService

KEEPALIVE_S = 15.0
_END = object()


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
