"""The CLI rejects bad input before it loads a model, with a message that says what to do.

Each run uses a config whose only instance is a local model at a path that does not exist:
had the CLI tried to load it first, the error would be "GGUF model not found" instead of the
input error, and the check would fail.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "missing-model.yaml"
    path.write_text("fewshot: null\ninstances:\n  - name: local\n    backend: {type: local, "
                    "model_path: /nonexistent/model.gguf}\n")
    return path


def agentflow(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agentflow.cli.main", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, expected", [
    (["ask", "How many stores?", "--db", "bookshop", "--pipeline", "chesss"],
     "invalid choice: 'chesss'"),
    (["ask", "   ", "--db", "bookshop"], "the question is empty"),
    (["ask", "How many stores?", "--db", "bookshop", "--slo", "-5"],
     "must be a positive number of seconds"),
    (["ask", "How many singers?", "--db", "concert_singer"], "known: bookshop"),
    (["ask", "How many singers?", "--db", "concert_singer"], "--data"),
    (["ask", "How many?", "--db", "/nonexistent/music.sqlite"], "file not found"),
])
def test_bad_input_is_rejected_before_the_model_loads(config, args, expected) -> None:
    out = agentflow(*args, "--config", str(config))
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert expected in out.stderr, out.stderr
    assert "GGUF" not in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_serve_on_a_busy_port_says_so_before_loading_anything(config) -> None:
    pytest.importorskip("uvicorn")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = agentflow("serve", "--config", str(config), "--port", str(port))
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert f"port {port} on 127.0.0.1 is already in use" in out.stderr, out.stderr
    assert "GGUF" not in out.stderr  # nothing was loaded before the port check


def test_ask_finds_a_database_named_in_the_config(tmp_path, library_db) -> None:
    """A database from the config's ``databases:`` passes the early check (it is not one
    of the benchmark folders' ids, nor a file path)."""
    cfg = tmp_path / "named.yaml"
    cfg.write_text(
        "fewshot: null\npipeline: single\ninstances:\n  - name: scripted-0\n    backend:\n"
        "      type: scripted\n      answers: {extract_keywords: book}\n"
        "      default: SELECT count(*) FROM book\n"
        f"databases:\n  lib: {{url: 'sqlite:///{library_db}'}}\n")
    out = agentflow("ask", "How many books?", "--db", "lib", "--config", str(cfg), "--json")
    assert out.returncode == 0, out.stderr
    assert '"status": "done"' in out.stdout and '"db": "lib"' in out.stdout, out.stdout
