"""The session's PostgreSQL fixture (``tests/conftest.py`` ``pg_server``) when the server is
installed but crashes at start: CI fails loudly, naming the exit status; elsewhere it skips,
saying why. A full CI run once skipped 55 PostgreSQL tests this way and still passed.

The server is a stand-in ``postgres`` that kills itself with SIGSEGV (how the real one died),
in a bindir of its own (``PG_BINDIR``), run by a real inner pytest session that loads the
project's conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = {"initdb": "exit 0", "pg_ctl": "exit 0", "pg_isready": "exit 2",
           "postgres": "kill -SEGV $$"}


@pytest.fixture
def crashing_bindir() -> Iterator[Path]:
    # Not under tmp_path: as root the server runs as the `postgres` user, who must be able
    # to reach the binaries (pytest's temp folders are private to their owner).
    home = Path(tempfile.mkdtemp(prefix="agentflow-fake-pg-"))
    try:
        home.chmod(0o755)
        for name, body in SCRIPTS.items():
            script = home / name
            script.write_text(f"#!/bin/sh\n{body}\n")
            script.chmod(0o755)
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _inner_session(tmp_path: Path, bindir: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    postgres: PostgreSQL\n")
    (tmp_path / "test_uses_pg.py").write_text("def test_it(pg_server):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(PG_BINDIR=str(bindir), PYTHONPATH=str(ROOT))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         "-p", "tests.conftest", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_uses_pg.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_in_ci_a_crashed_server_start_fails_the_run_naming_the_status(
        tmp_path: Path, crashing_bindir: Path) -> None:
    pytest.importorskip("psycopg")
    run = _inner_session(tmp_path, crashing_bindir, ci="true")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "exited with status -11" in out and "CI=true fails rather than skip" in out, out


def test_outside_ci_a_crashed_server_start_skips_saying_why(
        tmp_path: Path, crashing_bindir: Path) -> None:
    pytest.importorskip("psycopg")
    run = _inner_session(tmp_path, crashing_bindir, ci=None)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "1 skipped" in out and "exited with status -11" in out, out
