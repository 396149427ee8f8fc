"""``agentflow serve --replicas N``: N server processes on one port, one host.

Why processes: one server process is CPU-bound (the pipelines' own SQL, retrieval and
parsing), so a second core only helps a second process. Each replica binds the port with
``SO_REUSEPORT`` and the kernel spreads new connections across them — no router in the
path. They share the state store (a SQLite file by default), so any replica answers for any
query, limits hold across them and a replica that dies has its queries taken over by
another (``agentflow.server.replica``). This supervisor starts them, restarts one that
dies (after a pause, so a replica that cannot start does not spin), and passes SIGTERM /
SIGINT on, so each drains as a single server does.

Every replica submits its LLM calls to one scheduler: the supervisor first starts the
scheduler process (``agentflow.distributed.shard_socket``: the coordinator shards and the
instances' backends), restarts it at once when it dies (the replicas' calls in flight wait
for it and run again), and stops it after the last replica, which needs it to drain.

Each child runs in a session of its own: on Linux the kernel's CPU scheduler (autogroup)
shares the CPU between sessions first, so N replicas in the supervisor's session would get
one session's share of a busy host between them, not N.
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
                 env: dict[str, str] | None = None,
                 scheduler: Sequence[str] | None = None, scheduler_socket: str | None = None,
                 scheduler_start_s: float = 120.0):
        if n < 1:
            raise ValueError(f"--replicas must be at least 1, got {n}")
        if (scheduler is None) != (scheduler_socket is None):
            raise ValueError("a scheduler process needs both its command and its socket")
        self.command = list(command)
        self.n = n
        self.restart_after_s = restart_after_s
        self.env = env if env is not None else dict(os.environ)
        self.children: dict[int, subprocess.Popen] = {}
        self.scheduler_command = list(scheduler) if scheduler is not None else None
        self.scheduler_socket = scheduler_socket
        self.scheduler_start_s = scheduler_start_s
        self.scheduler: subprocess.Popen | None = None
        self.scheduler_restarts = 0
        self.stopping = False
        self.restarts = 0

    def _start(self, index: int) -> None:
        from agentflow.children import popen_tied

        env = {**self.env, REPLICA_ENV: str(index)}
        extra = ["--scheduler-socket", self.scheduler_socket] if self.scheduler_socket else []
        # tied: a supervisor killed outright takes its replicas with it (they drain on
        # SIGTERM), rather than leaving them serving the port unsupervised
        self.children[index] = popen_tied(
            [*self.command, "--replica-index", str(index), *extra], env=env,
            start_new_session=True)
        log.info("replica %d started (pid %d)", index, self.children[index].pid)

    def _start_scheduler(self) -> None:
        """Start the scheduler process and wait until it listens (its backends load first:
        a local model takes seconds)."""
        from agentflow.children import popen_tied

        assert self.scheduler_command is not None and self.scheduler_socket is not None
        sock = self.scheduler_socket
        if os.path.exists(sock):
            os.unlink(sock)
        self.scheduler = popen_tied(self.scheduler_command, env=self.env,
                                    start_new_session=True)
        deadline = time.monotonic() + self.scheduler_start_s
        while not os.path.exists(sock):
            if self.scheduler.poll() is not None:
                raise RuntimeError(f"the scheduler process exited with "
                                   f"{self.scheduler.returncode} before it listened")
            if time.monotonic() > deadline:
                self.scheduler.kill()
                raise RuntimeError(f"the scheduler process did not listen on {sock} within "
                                   f"{self.scheduler_start_s:.0f} s")
            time.sleep(0.05)
        log.info("scheduler process started (pid %d) at %s", self.scheduler.pid, sock)

    def _stop_scheduler(self) -> None:
        proc = self.scheduler
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

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
        if self.scheduler_command is not None:
            try:
                self._start_scheduler()
            except RuntimeError as err:
                log.error("%s", err)
                return 1
        try:
            return self._supervise()
        finally:
            self._stop_scheduler()  # after the replicas: they drain through it

    def _supervise(self) -> int:
        for index in range(self.n):
            self._start(index)
        died_at: dict[int, float] = {}
        while True:
            if self.scheduler is not None and self.scheduler.poll() is not None \
                    and not self.stopping:
                log.warning("the scheduler process (pid %d) exited with %s; restarting it "
                            "(the replicas' calls in flight run again there)",
                            self.scheduler.pid, self.scheduler.returncode)
                self.scheduler_restarts += 1
                try:
                    self._start_scheduler()
                except RuntimeError as err:
                    log.error("%s; stopping the replicas", err)
                    self.stop()
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
