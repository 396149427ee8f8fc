"""VLLMEngineBackend against an explicitly FAKE engine (vLLM needs a GPU and is not installed
here). FakeAsyncLLMEngine mimics the documented API: ``generate(prompt, sampling_params,
request_id, priority=...)`` is an async generator of cumulative RequestOutput-like objects,
``abort(request_id)`` stops a request."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from agentflow.llm.base import BackendError, LLMRequest, SamplingParams
from agentflow.llm.vllm_engine import VLLMEngineBackend


@dataclass
class FakeCompletionOutput:
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0


@dataclass
class FakeAsyncLLMEngine:
    """A test double, not vLLM: answers every prompt with ``words``, one word per step."""

    words: list[str] = field(default_factory=lambda: [" *", " FROM", " book", ";"])
    step_s: float = 0.0
    cached: int = 0
    fail_at_start: Exception | None = None
    fail_at_step: int | None = None
    final_reason: str = "stop"
    calls: list[dict] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)

    async def generate(self, prompt, sampling_params, request_id, *, priority=0):
        self.calls.append({"prompt": prompt, "params": sampling_params,
                           "request_id": request_id, "priority": priority})
        if self.fail_at_start is not None:
            raise self.fail_at_start
        prompt_ids = list(range(len(prompt.split())))
        for i in range(1, len(self.words) + 1):
            if request_id in self.aborted:
                return
            await asyncio.sleep(self.step_s)
            if self.fail_at_step == i:
                raise RuntimeError("EngineDeadError: background loop died")
            done = i == len(self.words)
            yield FakeRequestOutput(
                request_id, prompt_ids,
                [FakeCompletionOutput("".join(self.words[:i]), list(range(i)),
                                      self.final_reason if done else None)],
                finished=done, num_cached_tokens=self.cached)

    async def abort(self, request_id):
        self.aborted.append(request_id)


class FakeEngineWithoutPriority(FakeAsyncLLMEngine):
    async def generate(self, prompt, sampling_params, request_id):  # older vLLM signature
        async for out in super().generate(prompt, sampling_params, request_id):
            yield out


def backend_for(engine) -> VLLMEngineBackend:
    # Our SamplingParams pass through as-is: the fake engine has no vLLM SamplingParams.
    return VLLMEngineBackend(engine, sampling_params_factory=lambda p: p)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


def test_result_priority_pass_through_and_progress():
    engine = FakeAsyncLLMEngine(cached=16)
    backend = backend_for(engine)
    seen: list[int] = []
    request = LLMRequest("count the books", SamplingParams(max_tokens=32, seed=3),
                         answer_prefix="SELECT", priority=7, slo_rank=2)
    result = run(backend.generate(request, on_progress=seen.append))
    call = engine.calls[0]
    # the engine's priority is the query's class rank, not the coordinator's admission order
    assert call["priority"] == 2 and call["request_id"] == request.request_id
    from dataclasses import replace
    run(backend.generate(replace(request, priority=7_000_000_123, queue_ranked=True)))
    assert engine.calls[-1]["priority"] == 7_000_000_123  # the queue's rank (issue 38)
    assert call["prompt"] == "count the booksSELECT"
    assert call["params"] is request.params
    assert result.text == "SELECT * FROM book;"
    assert seen == [1, 2, 3, 4]
    assert result.completion_tokens == 4 and result.prompt_tokens == 3
    assert result.cached_prompt_tokens == 16
    assert result.finish_reason == "stop" and result.backend == "vllm"
    assert 0 <= result.ttft_s <= result.total_s


def test_length_finish_reason():
    result = run(backend_for(FakeAsyncLLMEngine(final_reason="length")).generate(
        LLMRequest("p")))
    assert result.finish_reason == "length"


def test_cancel_aborts_the_engine_request():
    engine = FakeAsyncLLMEngine(words=[" w"] * 200, step_s=0.01)
    backend = backend_for(engine)

    async def scenario():
        progressed = asyncio.Event()
        request = LLMRequest("long")
        task = asyncio.create_task(backend.generate(
            request, on_progress=lambda n: progressed.set() if n >= 3 else None))
        await asyncio.wait_for(progressed.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return request.request_id

    request_id = run(scenario())
    assert engine.aborted == [request_id]


def test_error_mapping():
    bad = backend_for(FakeAsyncLLMEngine(fail_at_start=ValueError("prompt too long")))
    with pytest.raises(BackendError) as info:
        run(bad.generate(LLMRequest("p")))
    assert info.value.retryable is False and "prompt too long" in str(info.value)

    dead = backend_for(FakeAsyncLLMEngine(fail_at_step=2))
    with pytest.raises(BackendError) as info:
        run(dead.generate(LLMRequest("p")))
    assert info.value.retryable is True

    aborted = backend_for(FakeAsyncLLMEngine(final_reason="abort"))
    with pytest.raises(BackendError) as info:
        run(aborted.generate(LLMRequest("p")))
    assert info.value.retryable is True

    empty = backend_for(FakeAsyncLLMEngine(words=[]))
    with pytest.raises(BackendError, match="no output"):
        run(empty.generate(LLMRequest("p")))


def test_bad_sampling_params_are_not_retryable():
    def reject(params):
        raise ValueError("top_p must be in (0, 1]")

    backend = VLLMEngineBackend(FakeAsyncLLMEngine(), sampling_params_factory=reject)
    with pytest.raises(BackendError) as info:
        run(backend.generate(LLMRequest("p")))
    assert info.value.retryable is False


def test_engine_without_priority_parameter():
    engine = FakeEngineWithoutPriority()
    result = run(backend_for(engine).generate(LLMRequest("p", priority=3,
                                                                       slo_rank=2)))
    assert result.text.endswith(";") and engine.calls[0]["priority"] == 0


def test_needs_an_engine_or_a_model():
    with pytest.raises(ValueError, match="engine or a model"):
        VLLMEngineBackend()
