"""Run a Python script with cProfile on every thread; pstats files when it exits.

    python agentflow/bench/serving/thread_profile.py OUT_DIR SCRIPT [ARGS...]

``python -m cProfile`` profiles the main thread only, and a server does its work elsewhere:
agentflow's engine loop runs in a thread of its own and SQL runs in worker threads
(``asyncio.to_thread``), while uvicorn holds the main thread. Here ``threading.Thread.run`` is
wrapped so that every thread started after this point gets a profiler of its own, timing
its own CPU (``time.thread_time``: waiting in a queue or a lock costs nothing, as in the CPU
figures the profile explains). Each is written to ``OUT_DIR/thread-N.prof`` at exit, or when
uvicorn re-raises the SIGTERM it caught. A thread still inside a call then (a worker blocked
in its queue's ``get``) has that call charged with the *writing* thread's CPU: read such
entries as waiting, not work. ``replicas_load --profile`` starts the server through this file
and merges the files (``pstats.Stats(*paths)``). Standard library only: it runs under any
checkout's interpreter.
"""

from __future__ import annotations

import atexit
import cProfile
import os
import runpy
import signal
import sys
import threading
import time

_profiles: list[cProfile.Profile] = []


def _install(out_dir: str) -> None:
    original = threading.Thread.run

    def run(self: threading.Thread) -> None:
        profile = cProfile.Profile(time.thread_time)
        _profiles.append(profile)
        profile.enable()
        try:
            original(self)
        finally:
            profile.disable()

    threading.Thread.run = run  # type: ignore[method-assign]
    main = cProfile.Profile(time.thread_time)
    _profiles.append(main)

    def dump() -> None:
        main.disable()
        os.makedirs(out_dir, exist_ok=True)
        for i, profile in enumerate(list(_profiles)):
            try:
                profile.dump_stats(os.path.join(out_dir, f"thread-{i}.prof"))
            except Exception:  # noqa: BLE001 - one thread's stats must not lose the others
                pass

    atexit.register(dump)
    # uvicorn re-raises the SIGTERM it caught once it has shut down, and a process ended by
    # a signal runs no atexit hook: write the profiles first
    reraise = signal.raise_signal

    def raise_signal(signum: int) -> None:
        dump()
        reraise(signum)

    signal.raise_signal = raise_signal
    main.enable()


def run_script(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: thread_profile.py OUT_DIR SCRIPT [ARGS...]")
    out_dir, script = argv[0], argv[1]
    sys.argv = [script, *argv[2:]]
    _install(out_dir)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    run_script(sys.argv[1:])
