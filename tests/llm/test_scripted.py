"""ScriptedBackend: canned answers, latency model, failure injection (not a model)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from agentflow.llm.base import BackendError, LLMRequest, SamplingParams
from agentflow.llm.scripted import Hold, ScriptedBackend, estimate_tokens


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


def test_by_prompt_answers_first_and_comes_from_the_config_spec():
    from agentflow.llm.registry import create_backend

    backend = create_backend({"type": "scripted", "answers": {"generate": "SELECT 1"},
                              "by_prompt": {"count slowly": "SELECT 2"}})
    assert run(backend.generate(req("generate", prompt="Q: count slowly"))).text == "SELECT 2"
    assert run(backend.generate(req("generate", prompt="Q: how many"))).text == "SELECT 1"


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


def test_a_hold_keeps_matching_calls_until_another_thread_releases_it():
    hold = Hold(lambda r: r.stage == "slow")
    backend = ScriptedBackend({"slow": "held", "fast": "free"}, hold=hold)
    out: dict[str, object] = {}

    def serve() -> None:
        async def both():
            slow = asyncio.create_task(backend.generate(req("slow")))
            out["fast"] = (await backend.generate(req("fast"))).text  # not held
            out["slow_done_before_release"] = slow.done()
            out["slow"] = (await slow).text
        run(both())

    thread = threading.Thread(target=serve)
    thread.start()
    hold.wait_held(1)  # the slow call is in the gate ...
    assert hold.waiting == 1 and "slow" not in out
    hold.release()  # ... until the test lets it go
    thread.join(20)
    assert out == {"fast": "free", "slow_done_before_release": False, "slow": "held"}
    assert hold.waiting == 0 and hold.arrived == 1
    assert run(backend.generate(req("slow"))).text == "held"  # released stays open


def test_a_held_call_can_be_cancelled_and_an_unmet_wait_says_what_it_saw():
    hold = Hold()
    backend = ScriptedBackend({"s": "x"}, hold=hold)

    async def cancel_it():
        call = asyncio.create_task(backend.generate(req("s")))
        while hold.waiting == 0:
            await asyncio.sleep(0.001)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    run(cancel_it())
    assert hold.waiting == 0 and hold.arrived == 1
    with pytest.raises(TimeoutError, match="0 call.s. held, 1 expected .1 arrived."):
        hold.wait_held(1, timeout_s=0.01)


def test_a_file_hold_opens_when_the_file_appears(tmp_path):
    flag = tmp_path / "release"
    hold = Hold(release_file=flag, poll_s=0.005)
    backend = ScriptedBackend({"s": "x"}, hold=hold)

    async def held_then_freed():
        call = asyncio.create_task(backend.generate(req("s")))
        while hold.waiting == 0:
            await asyncio.sleep(0.001)
        for _ in range(20):  # it polls the file and stays put while it is absent
            await asyncio.sleep(0.005)
            assert not call.done()
        flag.touch()
        return (await call).text
    assert run(held_then_freed()) == "x"


def test_a_config_built_scripted_backend_can_hold_on_a_file(tmp_path):
    from agentflow.llm.registry import create_backend

    backend = create_backend({"type": "scripted", "default": "x",
                              "hold_until_file": str(tmp_path / "go")})
    assert isinstance(backend, ScriptedBackend) and backend.hold is not None
    assert backend.hold.release_file == tmp_path / "go" and not backend.hold.released


def test_docstring_says_it_is_not_a_model():
    assert "not a model" in (ScriptedBackend.__doc__ or "").lower()
