"""A lean HTTP/1.1 client for load generators that share the server's cores.

On a two-core host the load generator's own CPU is taken from the server it measures:
httpx (anyio, httpcore, a pool, cookies, redirects) costs a few milliseconds of CPU per
request here, a tenth of what a replica spends answering a CHESS query, so two replicas
look slower than they are. This client does only what ``load_test.drive`` needs — POST a
JSON body to a plain ``http://`` server over pooled keep-alive connections and read a
``Content-Length`` or chunked reply — and answers in httpx's shape (``status_code``,
``headers``, ``json()``, ``text``; ``httpx.ReadTimeout`` / ``httpx.ReadError`` on
failure), so ``drive`` treats both alike.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

IDLE_S = 2.0  # a pooled connection idle longer is dropped (uvicorn closes them at 5 s)


@dataclass
class LeanResponse:
    status_code: int
    headers: dict[str, str]
    content: bytes

    def json(self) -> Any:
        return jsonlib.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = field(default_factory=time.monotonic)


async def read_response(reader: asyncio.StreamReader) -> LeanResponse:
    """One HTTP/1.1 response: status line, headers, a Content-Length or chunked body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x response: {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected: the final CRLF
                break
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        body = b"".join(chunks)
    else:
        raise ValueError("a response with neither Content-Length nor chunked encoding")
    return LeanResponse(int(parts[1]), headers, body)


class LeanClient:
    """POSTs JSON to one ``http://host:port`` server; ``keepalive=False`` opens a
    connection per request. Use as ``async with``."""

    def __init__(self, base_url: str, *, timeout: float = 120.0, keepalive: bool = True,
                 headers: dict[str, str] | None = None):
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the lean client speaks plain http://host:port only, got "
                             f"{base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.timeout = timeout
        self.keepalive = keepalive
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = (f"Host: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
                      f"{extra}")
        self._idle: list[_Conn] = []

    async def __aenter__(self) -> LeanClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.writer.close()

    async def post(self, url: str, json: Any = None) -> LeanResponse:
        body = jsonlib.dumps(json).encode()
        target = urlsplit(url)
        path = (target.path or "/") + (f"?{target.query}" if target.query else "")
        close = "" if self.keepalive else "connection: close\r\n"
        request = (f"POST {path} HTTP/1.1\r\n{self._head}content-length: {len(body)}\r\n"
                   f"{close}\r\n").encode() + body
        try:
            return await asyncio.wait_for(self._send(request), self.timeout)
        except asyncio.TimeoutError:
            raise httpx.ReadTimeout(f"no answer within {self.timeout:g} s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ValueError) as err:
            raise httpx.ReadError(f"{type(err).__name__}: {err}") from None

    async def _send(self, request: bytes) -> LeanResponse:
        conn = self._pooled()
        if conn is None:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            conn = _Conn(reader, writer)
        try:
            conn.writer.write(request)
            response = await read_response(conn.reader)
        except BaseException:
            conn.writer.close()  # its state is unknown: never reused
            raise
        if self.keepalive and response.headers.get("connection", "").lower() != "close":
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.writer.close()
        return response

    def _pooled(self) -> _Conn | None:
        """The least recently used idle connection (FIFO): requests spread over every
        open connection. Most recent first (LIFO) sent most of them to whichever replica
        answered first, whose connections were always back on top (70/30 splits)."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop(0)
            if now - conn.idle_since < IDLE_S and not conn.reader.at_eof():
                return conn
            conn.writer.close()
        return None
