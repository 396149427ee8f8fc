"""Run the app under uvicorn with a shutdown that gives every query in flight a status.

On SIGTERM (or Ctrl-C) the server first drains: the listening port stays open, new queries
are refused with 503 + Retry-After and ``/readyz`` says 503, while queries in flight get
``drain_s`` to finish (``wait=true`` requests get their answers). Then the rest are
cancelled, each waiting request answers with the final status, and the port closes —
uvicorn's own shutdown would close the port first and then wait on open requests, so a
``wait=true`` request or an event stream would hold shutdown hostage or be cut off.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket

import uvicorn
from fastapi import FastAPI

from agentflow.server.edge import EdgeH11Protocol
from agentflow.server.logs import log_config
from agentflow.server.service import QueryService

log = logging.getLogger("agentflow.server")


class AgentFlowServer(uvicorn.Server):
    """uvicorn with a drain: on SIGTERM the port stays open (new queries get 503 +
    Retry-After, readiness turns 503, so a load balancer moves traffic away instead of
    seeing connection refused) while queries in flight get up to ``drain_s`` to finish;
    only then are the rest cancelled and the port closed."""

    def __init__(self, config: uvicorn.Config, service: QueryService):
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.draining = True
        await self._drain(self.service.settings.drain_s)
        closing = asyncio.ensure_future(asyncio.to_thread(self.service.close, 0.0))
        try:
            await super().shutdown(sockets)
        finally:
            await closing

    async def _drain(self, drain_s: float) -> None:
        """Serve on while queries in flight finish, up to ``drain_s`` (a second signal,
        ``force_exit``, ends the wait)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_s
        running = self.service.running()
        if running:
            log.info("draining: %d queries in flight, up to %.0fs", running, drain_s)
        while self.service.running() and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, *,
                log_level: str = "info", access_log: bool = True) -> AgentFlowServer:
    service: QueryService = app.state.service
    settings = service.settings
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            access_log=access_log, lifespan="on",
                            log_config=log_config(log_level),
                            http=EdgeH11Protocol.configured(settings, service.metrics.error),
                            # a backstop: close() already bounds the drain
                            timeout_graceful_shutdown=math.ceil(settings.drain_s) + 30)
    return AgentFlowServer(config, service)


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, *,
        sockets: list[socket.socket] | None = None, **kwargs) -> None:
    """Serve until shut down; ``sockets``: already bound ones (a replica's SO_REUSEPORT
    socket) instead of binding ``host:port``."""
    make_server(app, host, port, **kwargs).run(sockets=sockets)
