"""The HTTP edge, below the ASGI app: slow clients, too many connections, broken requests.

Why a protocol subclass: what happens before a request's headers are complete never reaches
the app. uvicorn's h11 protocol has no header-read timeout (a client that sends half a
request holds its connection for ever: 200 of them were held for over a minute), answers
malformed requests (e.g. a NUL byte in a header) with a plain-text 400, and its
``limit_concurrency`` answers in plain text too. Here:

- a request's headers must be complete within ``header_timeout_s`` of the connection
  opening or of the previous response: else 408 and the connection is closed;
- beyond ``max_connections`` open connections a new one gets 503 and is closed;
- a request h11 cannot parse gets 400;

all in the API's one error shape, ``{"error": {"code", "message"}}``, and counted by
``on_error(status, code)`` like every other error. (Body-read timeouts are the ASGI
middleware's job: ``app.BodyLimit``.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

ErrorCounter = Callable[[int, str], None]


def raw_error(status: int, code: str, message: str, *, retry_after: int | None = None) -> bytes:
    """A complete HTTP/1.1 error response (written outside h11's state machine, which
    cannot answer a request it never fully received)."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class EdgeH11Protocol(H11Protocol):
    header_timeout_s: float = 10.0
    max_connections: int = 1000
    on_error: ErrorCounter | None = None

    @classmethod
    def configured(cls, settings: Any, on_error: ErrorCounter | None = None) -> type:
        """A subclass bound to the server settings (uvicorn instantiates the class)."""
        return type(cls.__name__, (cls,), {
            "header_timeout_s": settings.header_timeout_s,
            "max_connections": settings.max_connections,
            "on_error": staticmethod(on_error) if on_error is not None else None})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse(503, "too_many_connections",
                         f"the server has {self.max_connections} connections open; retry "
                         f"in a moment", retry_after=1)
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if not self._waiting_for_headers():
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # the next request on this connection, if any

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "bad_request", "the request is not valid HTTP/1.1 (malformed "
                                         "request line or headers, e.g. a control character "
                                         "in a header)")

    # ------------------------------------------------------------------ internals
    def _waiting_for_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._waiting_for_headers():
            return
        self._refuse(408, "request_timeout",
                     f"the request headers did not arrive within {self.header_timeout_s:g} s")

    def _refuse(self, status: int, code: str, message: str, *,
                retry_after: int | None = None) -> None:
        self._cancel_header_timer()
        if self.on_error is not None:
            self.on_error(status, code)
        if not self.transport.is_closing():
            self.transport.write(raw_error(status, code, message, retry_after=retry_after))
            self.transport.close()
