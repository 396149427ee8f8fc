"""``agentflow serve --replicas N``: N server processes on one port, one host.

Why processes: one server process is CPU-bound (the pipelines' own SQL, retrieval and
parsing), so a second core only helps a second process. Each replica binds the port with
``SO_REUSEPORT`` and the kernel spreads new connections across them — no router in the
path. They share the state store (a SQLite file by default), so any replica answers for any
query, limits hold across them and a replica that dies has its queries taken over by
another (``agentflow.server.replica``). This supervisor only starts them, restarts one that
dies (after a pause, so a replica that cannot start does not spin), and passes SIGTERM /
SIGINT on, so each drains as a single server does.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

log = logging.getLogger("agentflow.server")

REPLICA_ENV = "AGENTFLOW_REPLICA"  # set in each replica: its index (0..N-1)


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port`` that sibling replicas may bind too."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("this platform has no SO_REUSEPORT: --replicas needs Linux or a BSD")
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class Supervisor:
    """Runs ``command + [--replica-index i]`` for i in 0..n-1 until told to stop."""

    def __init__(self, command: Sequence[str], n: int, *, restart_after_s: float = 2.0,
                 env: dict[str, str] | None = None):
        if n < 1:
            raise ValueError(f"--replicas must be at least 1, got {n}")
        self.command = list(command)
        self.n = n
        self.restart_after_s = restart_after_s
        self.env = env if env is not None else dict(os.environ)
        self.children: dict[int, subprocess.Popen] = {}
        self.stopping = False
        self.restarts = 0

    def _start(self, index: int) -> None:
        from agentflow.children import popen_tied

        env = {**self.env, REPLICA_ENV: str(index)}
        # tied: a supervisor killed outright takes its replicas with it (they drain on
        # SIGTERM), rather than leaving them serving the port unsupervised
        self.children[index] = popen_tied([*self.command, "--replica-index", str(index)],
                                          env=env)
        log.info("replica %d started (pid %d)", index, self.children[index].pid)

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop(signum)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        self.stopping = True
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signum)

    def run(self, *, install_signals: bool = True) -> int:
        if install_signals:
            signal.signal(signal.SIGTERM, self._signal)
            signal.signal(signal.SIGINT, self._signal)
        for index in range(self.n):
            self._start(index)
        died_at: dict[int, float] = {}
        while True:
            alive = 0
            for index, child in list(self.children.items()):
                code = child.poll()
                if code is None:
                    alive += 1
                    continue
                if self.stopping:
                    continue
                if index not in died_at:
                    log.warning("replica %d (pid %d) exited with %s; its queries move to the "
                                "others, and it restarts in %.0fs", index, child.pid, code,
                                self.restart_after_s)
                    died_at[index] = time.monotonic()
                elif time.monotonic() - died_at[index] >= self.restart_after_s:
                    del died_at[index]
                    self.restarts += 1
                    self._start(index)
                    alive += 1
            if self.stopping and not alive:
                codes = [c.returncode for c in self.children.values()]
                return 0 if all(c in (0, -signal.SIGTERM, -signal.SIGINT) for c in codes) \
                    else 1
            time.sleep(0.1)


def replica_command(args: object, state: str) -> list[str]:
    """The ``agentflow serve`` command line of one replica, from the parsed options."""
    a = vars(args)
    cmd = [sys.executable, "-m", "agentflow", "serve", "--host", a["host"], "--port",
           str(a["port"]), "--state", state, "--log-level", a["log_level"]]
    if a.get("config"):
        cmd += ["--config", a["config"]]
    for folder in a.get("data") or []:
        cmd += ["--data", folder]
    if a.get("engine"):
        cmd += ["--engine", a["engine"]]
    if a.get("drain") is not None:
        cmd += ["--drain", str(a["drain"])]
    if a.get("no_access_log"):
        cmd.append("--no-access-log")
    if a.get("verbose"):
        cmd.append("--verbose")
    return cmd
