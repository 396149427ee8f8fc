"""Run the app under uvicorn with a shutdown that gives every query in flight a status.

uvicorn's own shutdown waits for open requests before telling the app to stop, so a
``wait=true`` request or an event stream of a long query would hold shutdown hostage (or be
cut off without an answer). Here, as soon as shutdown begins (SIGTERM, Ctrl-C), agentflow is
closed in parallel: queries get ``drain_s`` to finish, the rest are cancelled, and each
waiting request then answers with the final status before its connection closes.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import uvicorn
from fastapi import FastAPI

from agentflow.server.service import QueryService

log = logging.getLogger("agentflow.server")


class AgentFlowServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, service: QueryService):
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.draining = True
        closing = asyncio.ensure_future(asyncio.to_thread(self.service.close))
        try:
            await super().shutdown(sockets)
        finally:
            await closing


def make_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, *,
                log_level: str = "info", access_log: bool = True) -> AgentFlowServer:
    service: QueryService = app.state.service
    from agentflow.server.logs import log_config

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            access_log=access_log, lifespan="on",
                            log_config=log_config(log_level),
                            # a backstop: close() already bounds the drain
                            timeout_graceful_shutdown=service.settings.drain_s + 30)
    return AgentFlowServer(config, service)


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, **kwargs) -> None:
    make_server(app, host, port, **kwargs).run()
