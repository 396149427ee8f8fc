"""Shared builder for the MCP tests: ``agentflow mcp --http`` as a real subprocess on a
free loopback port."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def mcp_http_server(config: Path, env: Mapping[str, str]) -> Iterator[str]:
    """Start ``agentflow mcp --http --config CONFIG`` with ``env`` (plus PYTHONPATH = this
    checkout), wait until its port accepts (60 s; its output in the failure), yield the
    ``/mcp`` URL, and stop it afterwards (SIGTERM, a kill after 20 s)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "agentflow.cli.main", "mcp", "--http",
                             "--port", str(port), "--config", str(config)], cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, \
                proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
