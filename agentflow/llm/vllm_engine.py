"""vLLM's in-process ``AsyncLLMEngine`` (GPU machines; optional extra ``agentflow[vllm]``).

The engine batches concurrent calls itself (continuous batching), so this adapter adds no
queue: every call goes straight to ``engine.generate(prompt, sampling_params, request_id,
priority=...)`` with the call's rank (``LLMRequest.engine_priority``: the coordinator's
class band and queue order where its queue ranks by class, else the SLO class rank) as
``priority`` (lower = earlier, and a lower one may preempt a running higher one); it takes
effect when the engine runs with ``scheduling_policy="priority"`` (a non-zero priority is an
error otherwise). Equal priorities keep arrival order. Outputs
are cumulative (vLLM's default output kind); progress is the length of
``outputs[0].token_ids``. A cancelled call is aborted in the engine so its KV blocks are
freed at once.

vLLM is imported only when this backend builds its own engine, so the module imports anywhere;
pass ``engine=`` to wrap an engine you built (or a test double).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from typing import Any

from agentflow.llm.base import (
    BackendError,
    LLMBackend,
    LLMRequest,
    LLMResult,
    ProgressCallback,
    SamplingParams,
)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "the in-process vLLM backend needs vLLM (GPU machines only): "
            "pip install 'agentflow[vllm]'; on other machines serve the model with "
            "`vllm serve` and use the 'openai' backend") from exc
    return vllm


def to_vllm_sampling_params(params: SamplingParams) -> Any:
    """Our ``SamplingParams`` as vLLM's. A GBNF grammar becomes a structured-output grammar
    (xgrammar accepts GBNF): ``structured_outputs`` on recent vLLM, ``guided_decoding`` on
    versions before it."""
    vllm = _import_vllm()
    kwargs: dict[str, Any] = {
        "n": 1, "temperature": params.temperature, "top_p": params.top_p,
        "max_tokens": params.max_tokens if params.max_tokens > 0 else None,  # None: to the end
        "stop": list(params.stop), "seed": params.seed,
    }
    if params.grammar is not None:
        import vllm.sampling_params as sp
        if hasattr(sp, "StructuredOutputsParams"):
            kwargs["structured_outputs"] = sp.StructuredOutputsParams(grammar=params.grammar)
        elif hasattr(sp, "GuidedDecodingParams"):
            kwargs["guided_decoding"] = sp.GuidedDecodingParams(grammar=params.grammar)
        else:
            raise BackendError("this vLLM version has no grammar-guided decoding",
                               retryable=False)
    return vllm.SamplingParams(**kwargs)


def build_engine(model: str, engine_args: dict[str, Any] | None = None) -> Any:
    """``AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=model, **engine_args))``."""
    vllm = _import_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs
    args = AsyncEngineArgs(model=model, **(engine_args or {}))
    return vllm.AsyncLLMEngine.from_engine_args(args)


def _accepts_priority(engine: Any) -> bool:
    try:
        signature = inspect.signature(engine.generate)
    except (TypeError, ValueError):
        return True
    return "priority" in signature.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())


class VLLMEngineBackend(LLMBackend):
    """Wrap ``engine`` or build one from ``model`` + ``engine_args`` (AsyncEngineArgs fields,
    e.g. ``{"gpu_memory_utilization": 0.9, "scheduling_policy": "priority"}``).
    ``sampling_params_factory`` turns our SamplingParams into the engine's (default: vLLM's)."""

    def __init__(self, engine: Any = None, *, model: str | None = None,
                 engine_args: dict[str, Any] | None = None, name: str = "vllm",
                 sampling_params_factory: Callable[[SamplingParams], Any] | None = None):
        if engine is None:
            if not model:
                raise ValueError("VLLMEngineBackend needs an engine or a model name")
            engine = build_engine(model, engine_args)
            self._owns_engine = True
        else:
            self._owns_engine = False
        self.name = name
        self._engine = engine
        self._make_params = sampling_params_factory or to_vllm_sampling_params
        self._priority_ok = _accepts_priority(engine)

    async def generate(self, request: LLMRequest,
                       on_progress: ProgressCallback | None = None) -> LLMResult:
        try:
            sampling = self._make_params(request.params)
        except BackendError:
            raise
        except (ValueError, TypeError) as exc:
            raise BackendError(f"{self.name}: bad sampling parameters: {exc}",
                               retryable=False) from exc
        extra = {"priority": request.engine_priority} if self._priority_ok else {}
        start = time.perf_counter()
        first_token_at = 0.0
        n_out = 0
        last: Any = None
        stream = self._engine.generate(request.prompt + request.answer_prefix, sampling,
                                       request.request_id, **extra)
        try:
            async for output in stream:
                last = output
                completion = output.outputs[0] if output.outputs else None
                n = len(completion.token_ids) if completion is not None else 0
                if n > n_out:
                    if n_out == 0:
                        first_token_at = time.perf_counter()
                    n_out = n
                    if on_progress is not None:
                        on_progress(n_out)
        except asyncio.CancelledError:
            await self._abort(request.request_id)
            raise
        except (ValueError, TypeError) as exc:  # vLLM rejects the request (e.g. too long)
            raise BackendError(f"{self.name}: request rejected: {exc}",
                               retryable=False) from exc
        except Exception as exc:  # engine dead or failed: another instance may do it
            raise BackendError(f"{self.name}: engine failed: {type(exc).__name__}: {exc}",
                               retryable=True) from exc
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()
        return self._result(request, last, start, first_token_at)

    def _result(self, request: LLMRequest, last: Any, start: float,
                first_token_at: float) -> LLMResult:
        if last is None or not last.outputs:
            raise BackendError(f"{self.name}: engine returned no output", retryable=True)
        completion = last.outputs[0]
        reason = completion.finish_reason
        if reason == "abort":
            raise BackendError(f"{self.name}: engine aborted the request", retryable=True)
        prompt_ids = getattr(last, "prompt_token_ids", None)
        queue_s = _queue_time(last)
        now = time.perf_counter()
        return LLMResult(
            text=request.answer_prefix + completion.text,
            prompt_tokens=len(prompt_ids) if prompt_ids is not None
            else self.count_tokens(request.prompt + request.answer_prefix),
            completion_tokens=len(completion.token_ids),
            finish_reason="length" if reason == "length" else "stop",
            queue_s=queue_s,
            ttft_s=max(0.0, (first_token_at or now) - start - queue_s),
            total_s=max(0.0, now - start - queue_s),
            cached_prompt_tokens=getattr(last, "num_cached_tokens", None) or 0,
            backend=self.name)

    async def _abort(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            result = self._engine.abort(request_id)
            if inspect.isawaitable(result):
                await result

    async def close(self) -> None:
        if self._owns_engine:
            for method in ("shutdown", "shutdown_background_loop"):
                stop = getattr(self._engine, method, None)
                if callable(stop):
                    result = stop()
                    if inspect.isawaitable(result):
                        await result
                    break


def _queue_time(output: Any) -> float:
    """Seconds the request waited in the engine, where the engine reports it (V0's
    ``RequestOutput.metrics``); 0.0 otherwise."""
    metrics = getattr(output, "metrics", None)
    arrival = getattr(metrics, "arrival_time", None)
    scheduled = getattr(metrics, "first_scheduled_time", None)
    if isinstance(arrival, (int, float)) and isinstance(scheduled, (int, float)):
        return max(0.0, float(scheduled - arrival))
    return 0.0
