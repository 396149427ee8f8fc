"""``serve.py`` in a subprocess for the serving benchmarks, and the percentile they report.

load_test, fault_test, tenant_flood and serving_classes all measure a real server on loopback;
one launcher keeps them starting it the same way: a free port, a config file, the caller's
environment without ``AGENTFLOW_*`` (keys or tenants set there would change who may ask), and
a wait for ``/healthz`` that reports the server's own output if it exits first.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]


def serve(config: dict[str, Any], *, prefix: str = "agentflow-bench-",
          start_timeout_s: float = 90.0, extra_args: Sequence[str] = (),
          new_session: bool = False) -> tuple[subprocess.Popen[str], str, Path]:
    """Start ``serve.py --config`` with ``config``; (process, base URL, config path) once
    healthy. SystemExit if it exits or is not healthy within ``start_timeout_s``.
    ``new_session``: the server in a session of its own, so that on a busy Linux host the
    kernel's autogroup scheduling does not split one CPU share between it and the clients
    (as ``--replicas N`` gives each replica its own)."""
    path = Path(tempfile.mkdtemp(prefix=prefix)) / "serve.json"
    server = config.setdefault("server", {})  # its state beside its config, not in the cache
    server.setdefault("state", str(path.parent / "state.sqlite"))
    path.write_text(json.dumps(config))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTFLOW_")}
    proc = subprocess.Popen([sys.executable, str(ROOT / "serve.py"), "--config", str(path),
                             "--port", str(port), "--log-level", "warning", "--no-access-log",
                             *extra_args],
                            cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
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


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q`` quantile (numpy's default rule); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
