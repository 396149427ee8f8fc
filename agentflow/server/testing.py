"""Start the real agentflow HTTP server (uvicorn) on a free loopback port, in a thread.

Used by the server tests and the load test; their instances use the scripted backend (not a
model) so runs are fast and deterministic.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from agentflow.config import AgentFlowConfig
from agentflow.server import ServerSettings, create_app, make_server

GOOD_SQL = "SELECT count(*) FROM stores"


def scripted_instance(name: str, *, latency_s: float = 0.01, max_inflight: int = 2,
                      gpu: str | None = None, **backend: Any) -> dict[str, Any]:
    """An instance whose backend answers by stage: keywords for keyword extraction, a
    query counting stores for every SQL stage."""
    return {"name": name, "gpu": gpu, "max_inflight": max_inflight,
            "backend": {"type": "scripted", "name": name,
                        "answers": {"extract_keywords": "stores"}, "default": GOOD_SQL,
                        "latency_s": latency_s, **backend}}


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` (e.g. ``..._total``) in a ``/metrics`` page whose
    labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == name
               and all(sample.labels.get(k) == v for k, v in labels.items()))


def free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class LiveServer:
    """uvicorn serving ``create_app(config, settings)`` in a background thread."""

    def __init__(self, config: dict[str, Any], settings: dict[str, Any] | None = None, *,
                 agentflow: Any = None):
        config = {"fewshot": None, **config}
        if agentflow is not None:  # an engine the test built (e.g. a scripted function)
            self.app = create_app(settings=ServerSettings(**(settings or {})),
                                  agentflow=agentflow)
        else:
            self.app = create_app(AgentFlowConfig.model_validate(config),
                                  ServerSettings(**(settings or {})))
        self.service = self.app.state.service
        self._sock = free_socket()
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = make_server(self.app, log_level="warning", access_log=False)
        self.thread = threading.Thread(target=self.server.run,
                                       kwargs={"sockets": [self._sock]}, daemon=True,
                                       name=f"uvicorn-{self.port}")

    def start(self, timeout: float = 20.0) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.service.close()
        self._sock.close()

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def idle(self, timeout: float = 10.0) -> None:
        """Wait until no query is in flight (tests sharing a server start clean)."""
        deadline = time.monotonic() + timeout
        while any(not h.done() for h in list(self.service.af.handles.values())):
            if time.monotonic() > deadline:
                raise TimeoutError("queries still running")
            time.sleep(0.02)
