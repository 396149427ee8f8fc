"""Any OpenAI-compatible HTTP endpoint: vLLM ``serve``, llama.cpp's server, hosted APIs.

Defaults to the legacy ``/v1/completions`` endpoint because pipelines send completion prompts
with an ``answer_prefix`` the model must continue (``prompt + answer_prefix``); vLLM and
llama.cpp serve it. ``chat=True`` sends the prompt as one user message for chat-only
endpoints; a chat reply cannot be forced to continue a prefix, so the prefix is prepended to
the reply unless the reply already starts with it.

Calls stream so the scheduler sees progress and so a cancelled call closes its connection
(vLLM aborts a request whose client disconnects). Failures become ``BackendError``:
connection errors, timeouts, 5xx, 408/409/429 and broken streams are retryable on another
instance; other 4xx (bad request, auth, prompt too long) are not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from agentflow.llm.base import BackendError, LLMBackend, LLMRequest, LLMResult, ProgressCallback

_RETRYABLE_4XX = {408, 409, 429}


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ImportError("the OpenAI-compatible backend needs the 'openai' package: "
                          "pip install 'openai>=1.40'") from exc
    return openai


class OpenAIBackend(LLMBackend):
    """``vllm_priority=True`` sends the call's rank (``LLMRequest.engine_priority``: under a
    class-ranked queue the coordinator's band-major queue rank — class first, then the queue
    policy's order, flowsage's miss risk; else the SLO class rank, interactive 0, standard 1,
    batch 2 by default) as ``priority`` in the body, for vLLM served with
    ``--scheduling-policy priority``: lower runs earlier and may preempt a running higher
    one, so a batch flood admitted to the engine does not hold up an interactive query's
    calls, and within a class the engine's waiting queue and preemption follow the
    scheduler's order instead of first-come-first-served. Opt-in because a vLLM server
    without that policy rejects non-zero priorities. ``grammar_param`` names the body field
    a GBNF grammar goes in (``"grammar"`` for llama.cpp's servers, ``"guided_grammar"``
    for vLLM versions that take it); ``None`` drops grammars. ``timeout_s`` bounds the whole
    call, stream included. Client-side retries are off by default: the scheduler decides
    where a failed call goes next. ``send_request_id`` sends ``X-Request-Id`` (vLLM with
    ``--enable-request-id-headers``); off by default because llama-cpp-python's server
    answers a non-UUID request id with an empty 400."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 chat: bool = False, vllm_priority: bool = False, timeout_s: float = 300.0,
                 connect_timeout_s: float = 10.0, max_retries: int = 0,
                 stream_usage: bool = True, grammar_param: str | None = "grammar",
                 extra_body: dict[str, Any] | None = None, send_request_id: bool = False,
                 name: str = "openai", client: Any = None):
        openai = _import_openai()
        self._openai = openai
        self.name = name
        self.base_url = base_url
        self.model = model
        self.chat = chat
        self.vllm_priority = vllm_priority
        self.timeout_s = timeout_s
        self.stream_usage = stream_usage
        self.grammar_param = grammar_param
        self.extra_body = dict(extra_body or {})
        self.send_request_id = send_request_id
        # HTTP phases get their own bounds (a dead host fails in connect_timeout_s); the
        # whole call, stream included, is bounded by timeout_s in generate().
        self._client = client or openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "EMPTY", max_retries=max_retries,
            timeout=openai.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s)))

    def request_kwargs(self, request: LLMRequest) -> dict[str, Any]:
        """The keyword arguments of the ``create`` call for ``request`` (public so tests
        and logs can see exactly what is sent)."""
        params = request.params
        kwargs: dict[str, Any] = {
            "model": self.model,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
        }
        if params.max_tokens > 0:  # otherwise the server's default
            kwargs["max_tokens"] = params.max_tokens
        if self.send_request_id:
            kwargs["extra_headers"] = {"X-Request-Id": request.request_id}
        if self.stream_usage:
            kwargs["stream_options"] = {"include_usage": True}
        if params.stop:
            kwargs["stop"] = list(params.stop)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        body = dict(self.extra_body)
        if self.vllm_priority:
            body["priority"] = request.engine_priority
        if params.grammar is not None and self.grammar_param:
            body[self.grammar_param] = params.grammar
        if body:
            kwargs["extra_body"] = body
        if self.chat:
            kwargs["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            kwargs["prompt"] = request.prompt + request.answer_prefix
        return kwargs

    async def generate(self, request: LLMRequest,
                       on_progress: ProgressCallback | None = None) -> LLMResult:
        state = _StreamState(start=time.perf_counter())
        try:
            # wait_for, not asyncio.timeout: the project supports Python 3.10.
            await asyncio.wait_for(self._consume(request, on_progress, state), self.timeout_s)
        except asyncio.TimeoutError as exc:
            raise BackendError(f"{self.name}: no complete answer within {self.timeout_s} s",
                               retryable=True) from exc
        except self._openai.APIStatusError as exc:
            code = exc.status_code
            raise BackendError(f"{self.name}: HTTP {code}: {_short(exc)}",
                               retryable=code >= 500 or code in _RETRYABLE_4XX) from exc
        except self._openai.APIConnectionError as exc:
            raise BackendError(f"{self.name}: cannot reach {self.base_url}: {_short(exc)}",
                               retryable=True) from exc
        except (asyncio.CancelledError, BackendError):
            raise
        except Exception as exc:  # broken stream (server died mid-answer), bad chunk
            raise BackendError(f"{self.name}: stream failed: {type(exc).__name__}: "
                               f"{_short(exc)}", retryable=True) from exc
        return self._result(request, state)

    async def _consume(self, request: LLMRequest, on_progress: ProgressCallback | None,
                       state: _StreamState) -> None:
        create = (self._client.chat.completions.create if self.chat
                  else self._client.completions.create)
        stream = await create(**self.request_kwargs(request))
        try:
            async for chunk in stream:
                if getattr(chunk, "usage", None) is not None:
                    state.usage = chunk.usage
                timings = (getattr(chunk, "model_extra", None) or {}).get("timings")
                if isinstance(timings, dict):  # llama-server's, on the last chunk
                    state.timings = timings
                for choice in chunk.choices or ():
                    piece = (choice.delta.content if self.chat else choice.text) or ""
                    if choice.finish_reason:
                        state.finish = choice.finish_reason
                    if piece:
                        if not state.pieces:
                            state.ttft = time.perf_counter() - state.start
                        state.pieces.append(piece)
                        if on_progress is not None:
                            on_progress(len(state.pieces))
        finally:
            # Closing the connection is how a cancelled call stops the server's work.
            with contextlib.suppress(Exception):
                await stream.close()

    def _result(self, request: LLMRequest, state: _StreamState) -> LLMResult:
        finish, usage, n_chunks = state.finish, state.usage, len(state.pieces)
        if finish is None:
            raise BackendError(f"{self.name}: stream ended without a finish reason",
                               retryable=True)
        text = "".join(state.pieces)
        if self.chat and request.answer_prefix:
            if not text.lstrip().startswith(request.answer_prefix):
                text = request.answer_prefix + text
        else:
            text = request.answer_prefix + text
        prompt_tokens = getattr(usage, "prompt_tokens", None)
        completion_tokens = getattr(usage, "completion_tokens", None)
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", None) or 0
        return LLMResult(
            text=text,
            prompt_tokens=(prompt_tokens if prompt_tokens is not None
                           else self.count_tokens(request.prompt + request.answer_prefix)),
            completion_tokens=completion_tokens if completion_tokens is not None else n_chunks,
            finish_reason="length" if finish == "length" else "stop",
            queue_s=0.0, ttft_s=state.ttft, total_s=time.perf_counter() - state.start,
            cached_prompt_tokens=cached, backend=self.name, engine_timings=state.timings)

    async def close(self) -> None:
        await self._client.close()


@dataclass
class _StreamState:
    start: float
    pieces: list[str] = field(default_factory=list)
    ttft: float = 0.0
    finish: str | None = None
    usage: Any = None
    timings: dict[str, float] | None = None


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."
