"""Closing agentflow while questions run: nothing may touch a backend after it is closed.

The README's snippet (submit, cancel, leave the ``with`` block) crashed the process with the
llama.cpp model: a cancel issued right after ``submit`` was lost, ``close()`` gave up waiting
after 10 s and freed the model while a ``revise`` stage still tokenized on it. These tests use
a scripted backend (not a model) that records every use after ``close``; the slow test runs
the same loop on the real embedded model in a subprocess and checks it exits cleanly.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.llm.base import BackendError
from agentflow.llm.scripted import ScriptedBackend

ROOT = Path(__file__).resolve().parents[1]
GOOD = "SELECT count(*) FROM stores"


class WatchedBackend(ScriptedBackend):
    """Scripted answers; notes any token count or call made after ``close``."""

    def __init__(self, **kwargs):
        super().__init__({"extract_keywords": "stores"}, default=GOOD, **kwargs)
        self.closed = False
        self.late: list[str] = []

    def count_tokens(self, text: str) -> int:
        if self.closed:
            self.late.append("count_tokens")
            raise BackendError("closed")
        return super().count_tokens(text)

    async def generate(self, request, on_progress=None):
        if self.closed:
            self.late.append(f"generate {request.stage}")
            raise BackendError("closed")
        return await super().generate(request, on_progress)

    async def close(self) -> None:
        self.closed = True


def make(latency_s: float = 0.05) -> tuple[AgentFlow, WatchedBackend]:
    backend = WatchedBackend(latency_s=latency_s)
    return AgentFlow(AgentFlowConfig(fewshot=None), backends={"b": backend}), backend


def test_cancel_right_after_submit_is_not_lost_and_close_leaves_no_work_behind() -> None:
    for i in range(20):
        af, backend = make()
        with af:
            handle = af.submit("How many stores are there?", db="bookshop", pipeline="chess")
            assert af.cancel(handle.query_id)
        answer = handle.result(timeout=60)
        assert answer.status == "cancelled", (i, answer.status, answer.error)
        assert backend.late == [], (i, backend.late)


def test_close_in_the_middle_of_a_pipeline_cancels_and_joins_every_stage() -> None:
    for i in range(20):
        af, backend = make(latency_s=0.02)
        started = threading.Event()
        handle = af.submit("How many stores are there?", db="bookshop", pipeline="chess")
        handle.subscribe(lambda e, started=started: started.set()
                         if e.get("type") == "stage_started" and e.get("kind") == "llm" else None)
        assert started.wait(60)
        af.close()
        answer = handle.result(timeout=60)
        assert answer.status in ("cancelled", "done"), answer.status
        if answer.status == "cancelled":
            assert "shutting down" in answer.error
        assert backend.late == [], (i, backend.late)


@pytest.mark.slow
def test_submit_cancel_close_loop_on_the_real_model_does_not_crash() -> None:
    """20 rounds of the README snippet on the embedded llama.cpp model, in a subprocess (a
    segfault there must fail this test, not kill pytest)."""
    pytest.importorskip("llama_cpp")
    script = textwrap.dedent("""
        import sys, time, agentflow
        for i in range(20):
            with agentflow.connect({"fewshot": None}) as af:
                h = af.submit("List the stores in Lisbon.", db="bookshop")
                time.sleep(0.2 * (i % 5))   # cancel at different points of the pipeline
                af.cancel(h.query_id)
            a = h.result(timeout=60)
            print(i, a.status, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=900, cwd=ROOT, env={"PYTHONPATH": str(ROOT),
                                                     "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 20 and all(line.split()[1] == "cancelled" for line in lines), lines
