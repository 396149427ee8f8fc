"""``serve.py`` in a subprocess for the serving benchmarks, and the percentile they report.

load_test, fault_test, tenant_flood and serving_classes all measure a real server on loopback;
one launcher keeps them starting it the same way: a free port, a config file, the caller's
environment without ``AGENTFLOW_*`` (keys or tenants set there would change who may ask), and
a wait for ``/healthz`` that reports the server's own output if it exits first. Also the two
pieces every flood benchmark shares: stopping the server (SIGTERM, then a kill past a bound)
and running a flood's clients over one HTTP client that has room for all of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]


def serve(config: dict[str, Any], *, prefix: str = "agentflow-bench-",
          start_timeout_s: float = 90.0, extra_args: Sequence[str] = (),
          new_session: bool = False, root: Path = ROOT,
          launcher: Sequence[str] = ()) -> tuple[subprocess.Popen[str], str, Path]:
    """Start ``serve.py --config`` with ``config``; (process, base URL, config path) once
    healthy. SystemExit if it exits or is not healthy within ``start_timeout_s``.
    ``new_session``: the server in a session of its own, so that on a busy Linux host the
    kernel's autogroup scheduling does not split one CPU share between it and the clients
    (as ``--replicas N`` gives each replica its own).
    ``root``: the checkout whose ``serve.py`` (and ``agentflow``) runs, so that an A/B of
    server CPU can start a "before" worktree's server from this one's benchmark
    (``replicas_load --against``); ``launcher``: a script the interpreter runs first,
    which then runs ``serve.py`` (``thread_profile``)."""
    path = Path(tempfile.mkdtemp(prefix=prefix)) / "serve.json"
    server = config.setdefault("server", {})  # its state beside its config, not in the cache
    server.setdefault("state", str(path.parent / "state.sqlite"))
    path.write_text(json.dumps(config))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTFLOW_")}
    proc = subprocess.Popen([sys.executable, *launcher, str(root / "serve.py"),
                             "--config", str(path),
                             "--port", str(port), "--log-level", "warning", "--no-access-log",
                             *extra_args],
                            cwd=root, env={**env, "PYTHONPATH": str(root)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=new_session)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url, path
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start within {start_timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen[str], timeout_s: float = 30.0) -> None:
    """SIGTERM (the server drains and exits), a kill if it is still there after
    ``timeout_s``: a benchmark never leaves its server behind."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()


FloodClient = Callable[[httpx.AsyncClient, Counter, int], Awaitable[None]]


def run_flood(clients: int, client: FloodClient, ready: Any = None) -> dict[str, int]:
    """Run ``clients`` copies of ``client(http, status, index)`` at once over one
    ``httpx.AsyncClient`` with a connection for each (and two spare), so the flood is
    limited by the server, not by the client's pool; the status counts they recorded.
    ``ready`` (an Event, optional) is set as the clients start: a flood in a spawned
    process takes seconds to import on a loaded machine, and a caller that only slept
    a fixed head start measured its victim before any flood request was sent."""
    async def run() -> Counter:
        status: Counter = Counter()
        async with httpx.AsyncClient(timeout=120,
                                     limits=httpx.Limits(max_connections=clients + 2)) as http:
            if ready is not None:
                ready.set()
            await asyncio.gather(*(client(http, status, c) for c in range(clients)))
        return status
    return dict(asyncio.run(run()))


def count_status(status: Counter, response: httpx.Response) -> None:
    """Count a response by its status and, for an error, the body's error code."""
    code = response.json().get("error", {}).get("code", "") if response.status_code >= 400 \
        else ""
    status[f"{response.status_code} {code}".strip()] += 1


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q`` quantile (numpy's default rule); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
