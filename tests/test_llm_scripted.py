"""ScriptedBackend: canned answers, latency model, failure injection (not a model)."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentflow.llm.base import BackendError, LLMRequest, SamplingParams
from agentflow.llm.scripted import ScriptedBackend, estimate_tokens


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


def req(stage: str = "generate", **kw) -> LLMRequest:
    return LLMRequest(kw.pop("prompt", "prompt text"), stage=stage, **kw)


def test_stage_mapping_cycles_lists_and_handles_the_answer_prefix():
    backend = ScriptedBackend({"keywords": "books, authors",
                               "generate": ["SELECT 1", " 2 FROM t"]}, default="fallback")
    assert run(backend.generate(req("keywords"))).text == "books, authors"
    texts = [run(backend.generate(req("generate", answer_prefix="SELECT"))).text
             for _ in range(3)]
    assert texts == ["SELECT 1", "SELECT 2 FROM t", "SELECT 1"]
    assert run(backend.generate(req("other"))).text == "fallback"
    assert backend.calls_by_stage["generate"] == 3 and len(backend.calls) == 5


def test_function_script_stop_and_max_tokens():
    backend = ScriptedBackend(lambda r: f"echo {r.query_id}; more words here")
    result = run(backend.generate(LLMRequest("p", SamplingParams(stop=(";",)), query_id="q7")))
    assert result.text == "echo q7" and result.finish_reason == "stop"
    capped = run(backend.generate(LLMRequest("p", SamplingParams(max_tokens=2), query_id="q")))
    assert capped.finish_reason == "length" and capped.completion_tokens <= 2
    assert result.completion_tokens == estimate_tokens("echo q7")
    assert result.backend == "scripted"


def test_unknown_stage_without_default_is_not_retryable():
    with pytest.raises(BackendError) as info:
        run(ScriptedBackend({"a": "x"}).generate(req("b")))
    assert info.value.retryable is False


def test_latency_model_and_progress():
    backend = ScriptedBackend({"s": "one two three four"}, latency_s=0.05, per_token_s=0.01)
    seen: list[int] = []
    t0 = time.perf_counter()
    result = run(backend.generate(req("s"), on_progress=seen.append))
    elapsed = time.perf_counter() - t0
    n = result.completion_tokens
    assert seen == list(range(1, n + 1))
    assert elapsed >= 0.05 + 0.01 * n
    assert result.ttft_s >= 0.05 and result.total_s >= result.ttft_s


def test_concurrent_calls_overlap():
    backend = ScriptedBackend({"s": "x"}, latency_s=0.2)

    async def many():
        calls = [asyncio.create_task(backend.generate(req("s"))) for _ in range(10)]
        await asyncio.sleep(0)  # every call runs up to its latency wait
        waiting_together = len(backend.calls) - sum(c.done() for c in calls)
        return waiting_together, await asyncio.gather(*calls)

    waiting_together, results = run(many())
    assert waiting_together == 10  # all ten wait at once, not one after another
    assert [r.text for r in results] == ["x"] * 10


def test_failure_injection():
    backend = ScriptedBackend({"s": "x"}, fail_after=2)
    run(backend.generate(req("s")))
    run(backend.generate(req("s")))
    with pytest.raises(BackendError) as info:
        run(backend.generate(req("s")))
    assert info.value.retryable is True
    picky = ScriptedBackend({"s": "x"}, fail_when=lambda r: r.priority > 5, fail_retryable=False)
    assert run(picky.generate(req("s", priority=1))).text == "x"
    with pytest.raises(BackendError) as info:
        run(picky.generate(req("s", priority=9)))
    assert info.value.retryable is False


def test_docstring_says_it_is_not_a_model():
    assert "not a model" in (ScriptedBackend.__doc__ or "").lower()
