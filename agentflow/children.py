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

No Python runs in the forked child (``preexec_fn``). With one, CPython's after-fork hook
runs in the child and clears the states of the parent's other threads, finalising what they
held: a thread-local DuckDB connection (the engine check's parser, in the main thread after
any DuckDB query) joined its worker threads, which the child does not have, and the child
died with SIGSEGV before exec. The test PostgreSQL, started as the ``postgres`` user when we
are root, "exited with status -11" once a DuckDB test had run in the same pytest process, and
every PostgreSQL test after it skipped (llama-server, while it was started with one, had
died the same way, "-11" mid-suite). Instead a fresh interpreter (``_EXEC_TIED``) changes
user and group if asked, asks for the signal, and execs the command in the same process,
which keeps the request.
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
# argv: signal, parent pid, uid, gid, supplementary groups ("-": unchanged), command...
# The credentials change first: a change of user or group clears the death signal request.
# Everything is imported before it (execvp's PATH search imports ``warnings``): the new user
# may not be able to read this interpreter's library.
_EXEC_TIED = (
    "import ctypes, os, sys, warnings\n"
    "sig, parent, uid, gid, groups = sys.argv[1:6]\n"
    "if groups != '-':\n"
    "    os.setgroups([int(g) for g in groups.split(',') if g])\n"
    "if gid != '-':\n"
    "    os.setregid(int(gid), int(gid))\n"
    "if uid != '-':\n"
    "    os.setreuid(int(uid), int(uid))\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.prctl(1, int(sig), 0, 0, 0)\n"
    "if os.getppid() != int(parent):\n"
    "    os._exit(1)\n"
    "os.execvp(sys.argv[6], sys.argv[6:])\n"
)
_CHILDREN: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()


def _credentials(kwargs: dict[str, Any]) -> tuple[str, str, str]:
    """``user``/``group``/``extra_groups`` (as ``subprocess.Popen`` takes them: names or
    ids) taken out of ``kwargs`` as the wrapper's numeric arguments ("-": unchanged)."""
    import grp
    import pwd

    def gid_of(g: str | int) -> int:
        return g if isinstance(g, int) else grp.getgrnam(g).gr_gid

    user, group = kwargs.pop("user", None), kwargs.pop("group", None)
    extra = kwargs.pop("extra_groups", None)
    uid = "-" if user is None else str(user if isinstance(user, int)
                                       else pwd.getpwnam(user).pw_uid)
    gid = "-" if group is None else str(gid_of(group))
    groups = "-" if extra is None else ",".join(str(gid_of(g)) for g in extra)
    if uid != "-" and os.geteuid() != 0 and int(uid) != os.geteuid():
        raise PermissionError(f"only root may start a child as user {user!r}")
    return uid, gid, groups


def popen_tied(cmd: Sequence[str], *, death_signal: int = signal.SIGTERM,
               **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` for a child that gets ``death_signal`` when this
    process dies, however it dies. ``user=``/``group=``/``extra_groups=`` are applied by
    the exec wrapper, not in the forked child; ``preexec_fn`` is refused (see the module
    docstring)."""
    if "preexec_fn" in kwargs:
        raise TypeError("popen_tied runs no Python between fork and exec: no preexec_fn")
    if _PRCTL is None:  # no death signal to ask for: atexit stops it on a normal exit
        proc = _SPAWNER.run(lambda: subprocess.Popen(list(cmd), **kwargs))
    else:
        uid, gid, groups = _credentials(kwargs)
        tied = [sys.executable, "-S", "-c", _EXEC_TIED, str(int(death_signal)),
                str(os.getpid()), uid, gid, groups, *cmd]
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
