"""Issue 35 §10: the servers agentflow starts die with the process that started them.

Each test starts a real parent Python process that starts a real child (a stand-in
llama-server, ``sleep``, a PostgreSQL server), then ends the parent the way an operator or a
crash would (SIGTERM with no handler, SIGKILL) and watches the child's pid. Before the change
the llama-server and PostgreSQL children were reparented to PID 1 and kept running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agentflow.children import ties_children

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not ties_children(), reason="needs Linux prctl")]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _parent(code: str) -> tuple[subprocess.Popen, int]:
    """Run ``code`` in a fresh interpreter; it prints the child's pid on its first line."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(line)


def _end(parent: subprocess.Popen, sig: int) -> None:
    parent.send_signal(sig)
    parent.wait(timeout=30)


def test_a_child_started_from_a_worker_thread_outlives_the_thread_not_the_process() -> None:
    parent, child = _parent("""
        import threading, time
        from agentflow.children import popen_tied
        out = []
        t = threading.Thread(target=lambda: out.append(popen_tied(["sleep", "600"])))
        t.start(); t.join()          # the thread that asked is gone
        print(out[0].pid, flush=True)
        time.sleep(600)
    """)
    try:
        time.sleep(1.0)
        assert _alive(child)  # the kernel's "parent" is the spawner thread, still alive
        _end(parent, signal.SIGKILL)  # no Python cleanup at all
        assert _gone_within(child, 10)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_llama_server_dies_when_its_parent_is_terminated(tmp_path: Path) -> None:
    from tests.llm.test_llamacpp_server import _STAND_IN

    script = tmp_path / "fake-llama-server"
    script.write_text(_STAND_IN.format(python=sys.executable))
    script.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    parent, child = _parent(f"""
        import time
        from agentflow.llm.llamacpp_server import LlamaServerBackend
        b = LlamaServerBackend({{"type": "llama_server", "binary": {str(script)!r},
                                "model": {str(model)!r}, "log_file": {str(tmp_path / 's.log')!r}}})
        print(b.process.pid, flush=True)
        time.sleep(600)
    """)
    try:
        assert _alive(child)
        _end(parent, signal.SIGTERM)  # the default action: no atexit, no close()
        assert _gone_within(child, 10), "llama-server outlived the process that started it"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.postgres
def test_test_postgres_dies_when_its_parent_is_killed() -> None:
    from agentflow.sql.pg_local import PostgresUnavailable, find_bindir

    try:
        find_bindir()
    except PostgresUnavailable as err:
        pytest.skip(str(err))
    parent, child = _parent("""
        import time
        from agentflow.sql.pg_local import LocalPostgres
        pg = LocalPostgres().init().start()
        print((pg.data / "postmaster.pid").read_text().split()[0], flush=True)
        time.sleep(600)
    """)
    try:
        assert _alive(child)
        _end(parent, signal.SIGKILL)
        assert _gone_within(child, 30), "PostgreSQL outlived the process that started it"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_started_as_a_user_while_duckdb_holds_threads_runs() -> None:
    """The parent's main thread holds a DuckDB connection (the engine check's per-thread
    parser, as after any DuckDB test) and the child is started with ``user=``, as the test
    PostgreSQL is when we are root. With Python run in the forked child (``preexec_fn``),
    CPython dropped the main thread's locals there, DuckDB's destructor joined worker
    threads the child does not have, and the child died with SIGSEGV before exec: every
    PostgreSQL test after the first DuckDB test of a pytest process skipped."""
    parent = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, subprocess
        from agentflow.children import popen_tied
        from agentflow.sql.engine_check import duckdb_view
        duckdb_view("SELECT 1")
        for _ in range(3):
            child = popen_tied(["id", "-u"], user=os.geteuid(), stdout=subprocess.PIPE)
            out, _ = child.communicate(timeout=30)
            print(child.returncode, out.decode().strip(), flush=True)
    """)], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=120)
    assert parent.returncode == 0, parent.stderr
    assert parent.stdout.splitlines() == [f"0 {os.geteuid()}"] * 3, parent.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_a_child_runs_as_the_user_asked_for() -> None:
    import pwd

    from agentflow.children import popen_tied

    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no `postgres` user to switch to")
    child = popen_tied(["id", "-u"], user="postgres", stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=30)
    assert (child.returncode, out.decode().strip()) == (0, str(entry.pw_uid))


def test_preexec_fn_is_refused() -> None:
    from agentflow.children import popen_tied

    with pytest.raises(TypeError, match="preexec_fn"):
        popen_tied(["true"], preexec_fn=lambda: None)
