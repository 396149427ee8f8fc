"""Child processes that die with the process that started them (llama-server, test PostgreSQL).

A server agentflow starts must not outlive agentflow: stopping the parent with SIGTERM left
both ``llama-server``s running, reparented to PID 1 and pinned to their cores. On every exit
path — a signal's default action, a crash, SIGKILL — no Python cleanup runs, so the kernel
does it: each child asks, between fork and exec, for a signal when its parent dies
(``prctl(PR_SET_PDEATHSIG)``, Linux).

The kernel's "parent" is the *thread* that forked, so a child started from a worker thread
would be killed when that thread ends. Every tied child is therefore forked from one thread
that lives as long as the process (``_Spawner``). A child whose parent is already gone by the
time it runs the request exits at once. Where ``prctl`` is missing (not Linux) the child is
started plainly and ``atexit`` stops it on a normal exit.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import queue
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up before any fork: the child only calls it


def _tie(sig: int, parent: int) -> Callable[[], None]:
    def preexec() -> None:  # runs in the child, after any user/group change (which clears it)
        if _PRCTL is not None:
            _PRCTL(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request was in place
            os._exit(1)
    return preexec


class _Spawner:
    """One long-lived thread that forks every tied child (see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen], Future]] = \
            queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, make: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="child-spawner",
                                                daemon=True)
                self._thread.start()
        done: Future = Future()
        self._jobs.put((make, done))
        return done.result()

    def _loop(self) -> None:
        while True:
            make, done = self._jobs.get()
            try:
                done.set_result(make())
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                done.set_exception(err)


_SPAWNER = _Spawner()
_EXEC_TIED = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.prctl(1, int(sys.argv[1]), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[2]):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[3], sys.argv[3:])\n"
)
_CHILDREN: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()


def popen_tied(cmd: Sequence[str], *, death_signal: int = signal.SIGTERM,
               **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` for a child that gets ``death_signal`` when this
    process dies, however it dies. ``preexec_fn`` is taken: pass ``user=``/``group=``
    rather than switching users in one."""
    if "preexec_fn" in kwargs:
        raise TypeError("popen_tied sets preexec_fn itself")
    if _PRCTL is None or "user" in kwargs:  # another user may not run this interpreter
        preexec = _tie(int(death_signal), os.getpid())
        proc = _SPAWNER.run(lambda: subprocess.Popen(list(cmd), preexec_fn=preexec, **kwargs))
    else:
        # No Python between fork and exec (preexec_fn in a process with many threads can crash
        # the child, seen as llama-server "exiting with -11" mid-suite): a small interpreter asks
        # for the signal and then execs the command in the same process, which keeps it.
        tied = [sys.executable, "-S", "-c", _EXEC_TIED, str(int(death_signal)),
                str(os.getpid()), *cmd]
        proc = _SPAWNER.run(lambda: subprocess.Popen(tied, **kwargs))
    _CHILDREN.add(proc)
    return proc


def ties_children() -> bool:
    """Whether this platform lets the kernel stop children with their parent."""
    return _PRCTL is not None


@atexit.register
def _stop_children() -> None:
    """A normal exit: stop what is still running (the kernel covers every other exit)."""
    for proc in list(_CHILDREN):
        if proc.poll() is None:
            try:
                proc.terminate()
            except OSError:
                pass
