"""The one interface every LLM backend implements (local llama.cpp, OpenAI-compatible HTTP,
in-process vLLM, simulated, scripted).

Requests are plain completion prompts, not chat messages: the embedded default is a *base*
model, completion prompts work on every OpenAI-compatible server, and a prompt whose shared
part (schema, examples) comes first lets a backend reuse the KV cache of that prefix across a
query's calls. ``priority`` follows vLLM: lower runs earlier.
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

_request_ids = itertools.count()


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # GBNF grammar for constrained decoding (llama.cpp); backends without grammar support
    # may map it to their own guided decoding or ignore it and say so in their docs.
    grammar: str | None = None


@dataclass(frozen=True)
class LLMRequest:
    """One LLM call. ``answer_prefix`` is appended to the prompt and is part of the answer:
    e.g. ``"SELECT"`` makes the model continue a query, and ``LLMResult.text`` starts with it."""

    prompt: str
    params: SamplingParams = field(default_factory=SamplingParams)
    answer_prefix: str = ""
    priority: int = 0  # the coordinator's order of admission (backends that queue use it)
    slo_rank: int = 0  # the query's SLO class rank: vLLM's per-request priority (lower first)
    # True: ``priority`` is the coordinator's queue rank (band-major, then the queue policy's
    # key: ``scheduler.classes.engine_priority``), which an engine that orders by priority
    # (vLLM) is sent instead of ``slo_rank`` (``engine_priority`` below)
    queue_ranked: bool = False
    stage: str = ""  # pipeline stage type, e.g. "generate_candidate" (for scripted/sim backends)
    query_id: str = ""
    request_id: str = field(default_factory=lambda: f"req-{next(_request_ids)}")

    @property
    def engine_priority(self) -> int:
        """What an engine that orders its own queue by priority (vLLM, lower first) is sent:
        the coordinator's queue rank where it ranks by class (``queue_ranked``: class band,
        then the queue policy's order within it, so the engine's waiting queue and
        preemption follow the scheduler's ranking, issue 38), else the SLO class rank."""
        return self.priority if self.queue_ranked else self.slo_rank


@dataclass(frozen=True)
class LLMResult:
    """What a call produced and how long it took.

    Times are seconds on the backend's own monotonic clock: ``queue_s`` waiting inside the
    backend before the prompt was processed, ``ttft_s`` from start of processing to the first
    output token, ``total_s`` from start of processing to the last token.
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    queue_s: float = 0.0
    ttft_s: float = 0.0
    total_s: float = 0.0
    cached_prompt_tokens: int = 0  # prompt tokens whose KV was reused, when the backend knows
    backend: str = ""
    node: str = ""  # where the call ran when not in this process (e.g. a Ray node)
    # The engine's own account of the call where it gives one (llama-server's ``timings``:
    # prompt_n, prompt_ms, predicted_n, predicted_ms, cache_n), for attributing its time.
    engine_timings: dict[str, float] | None = None


# Called with the number of output tokens produced so far (streaming progress).
ProgressCallback = Callable[[int], None]


class BackendError(RuntimeError):
    """A backend failed a call (died, refused, timed out). ``retryable`` says whether sending
    the same call to another instance may succeed."""

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class LLMBackend(abc.ABC):
    """An LLM instance. Implementations must be safe to call concurrently from one event loop;
    those that can only run one call at a time queue internally by ``priority``."""

    name: str = "backend"

    @abc.abstractmethod
    async def generate(self, request: LLMRequest,
                       on_progress: ProgressCallback | None = None) -> LLMResult:
        """Run one call. Raises ``BackendError`` on failure, ``asyncio.CancelledError`` when
        the caller cancels (the backend must then stop work on it and free its slot)."""

    def count_tokens(self, text: str) -> int:
        """Prompt length in this backend's tokens; the default is a rough 4-chars rule."""
        return max(1, len(text) // 4)

    @property
    def tokenizer_key(self) -> tuple:
        """Backends with equal keys count tokens alike (the router counts a prompt once per
        distinct key). Override together with ``count_tokens``."""
        return ("chars/4",)

    async def close(self) -> None:  # noqa: B027 - optional: a backend holding nothing frees nothing
        """Release resources (model memory, HTTP sessions)."""
