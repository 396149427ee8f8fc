"""The HTTP edge, below the ASGI app: slow clients, too many connections, broken requests.

Why a protocol subclass: what happens before a request's headers are complete never reaches
the app. uvicorn's h11 protocol has no header-read timeout (a client that sends half a
request holds its connection for ever: 200 of them were held for over a minute), answers
malformed requests (e.g. a NUL byte in a header) with a plain-text 400, and its
``limit_concurrency`` answers in plain text too. Here:

- a request's headers must be complete within ``header_timeout_s`` of the connection
  opening or of the previous response: else 408 and the connection is closed;
- beyond ``max_connections`` open connections a new one gets 503 and is closed, and so does
  a client (one peer address) beyond ``max_client_connections`` of its own: one client
  holding 1,005 idle sockets made ``/healthz`` 503 for everyone, the limit being global;
- a request h11 cannot parse gets 400;

all in the API's one error shape, ``{"error": {"code", "message"}}``, and counted by
``on_error(status, code)`` like every other error. (Body-read timeouts are the ASGI
middleware's job: ``app.BodyLimit``; header counts and sizes, ``HeaderLimit`` below: h11
bounds only headers that arrive in pieces, so 100 KB of headers sent at once were accepted.)
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
    max_client_connections: int = 100
    on_error: ErrorCounter | None = None
    # peer address -> its open connections (per configured class: one per server)
    by_client: dict[str, int] = {}

    @classmethod
    def configured(cls, settings: Any, on_error: ErrorCounter | None = None) -> type:
        """A subclass bound to the server settings (uvicorn instantiates the class)."""
        return type(cls.__name__, (cls,), {
            "header_timeout_s": settings.header_timeout_s,
            "max_connections": settings.max_connections,
            "max_client_connections": settings.max_client_connections,
            "by_client": {},
            "on_error": staticmethod(on_error) if on_error is not None else None})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._client: str | None = None

    # ------------------------------------------------------------------ connection
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else None
        if client is not None:
            self._client = client
            self.by_client[client] = self.by_client.get(client, 0) + 1
            if self.by_client[client] > self.max_client_connections:
                self._refuse(503, "too_many_connections",
                             f"this client has {self.max_client_connections} connections "
                             f"open, its limit; close some or retry in a moment",
                             retry_after=1)
                return
        if len(self.connections) > self.max_connections:
            self._refuse(503, "too_many_connections",
                         f"the server has {self.max_connections} connections open; retry "
                         f"in a moment", retry_after=1)
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self._client is not None:
            left = self.by_client.get(self._client, 0) - 1
            if left > 0:
                self.by_client[self._client] = left
            else:
                self.by_client.pop(self._client, None)
            self._client = None
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


class HeaderLimit:
    """ASGI middleware: a request with more than ``max_count`` headers, or more than
    ``max_bytes`` of them (names and values), gets 431 and its connection is closed — before
    any route (or the key check) reads them."""

    def __init__(self, app: Any, max_count: int = 100, max_bytes: int = 32 * 1024,
                 on_error: ErrorCounter | None = None):
        self.app = app
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.on_error = on_error

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope.get("headers") or []
        size = sum(len(name) + len(value) for name, value in headers)
        if len(headers) > self.max_count or size > self.max_bytes:
            if self.on_error is not None:
                self.on_error(431, "headers_too_large")
            message = (f"the request has {len(headers)} headers; at most {self.max_count} are "
                       "accepted" if len(headers) > self.max_count else
                       f"the request headers are {size} bytes; at most {self.max_bytes} are "
                       "accepted")
            body = json.dumps({"error": {"code": "headers_too_large",
                                         "message": message}}).encode()
            await send({"type": "http.response.start", "status": 431,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return None
        return await self.app(scope, receive, send)
