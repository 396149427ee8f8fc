"""A scripted backend for unit tests and load tests. It is NOT a model.

Its answers come from a script (a function of the request, or canned text per pipeline stage),
its timing from a simple latency model (fixed seconds + seconds per output token, slept with
``asyncio.sleep``), and it can be told to fail. Use it to test pipelines, schedulers and the
serving path without a model; never to report accuracy or real-hardware speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentflow.llm.base import BackendError, LLMBackend, LLMRequest, LLMResult, ProgressCallback

Script = Callable[[LLMRequest], str] | Mapping[str, str | Sequence[str]]


@dataclass(frozen=True)
class Fault:
    """A scripted misbehaviour for fault tests (NOT a model's behaviour): from the
    ``after_calls``-th call on, and/or between ``from_s`` and ``until_s`` seconds after the
    backend's first call, calls fail (``fail``, with ``retryable``) or take longer
    (``latency_s`` replaces the base latency, ``slowdown`` multiplies all latencies; a huge
    latency is a hang; ``stall_after_tokens`` hangs mid-stream). The first matching fault
    applies."""

    after_calls: int = 0
    from_s: float | None = None
    until_s: float | None = None
    fail: bool = False
    retryable: bool = True
    latency_s: float | None = None
    slowdown: float = 1.0
    stall_after_tokens: int | None = None  # stream this many tokens, then hang

    def applies(self, n_call: int, since_first_s: float) -> bool:
        if n_call <= self.after_calls:
            return False
        if self.from_s is not None and since_first_s < self.from_s:
            return False
        return self.until_s is None or since_first_s < self.until_s


class Hold:
    """A gate a test controls (NOT a model's behaviour): matching calls wait in it, after
    being counted and before answering, until the test releases it. A test that must see a
    call *running* (a live timeline, a cancel, a drain) then sees it by construction, however
    loaded the machine, instead of hoping a sleep is long enough.

    ``when`` picks the calls to hold (all by default). ``release()`` opens the gate from any
    thread; ``release_file``, when given, opens it once that file exists, for a backend in
    another process (``serve.py``) that the test cannot reach. A held call that is cancelled
    leaves at once, so a cancel or a drain's deadline still works on it."""

    def __init__(self, when: Callable[[LLMRequest], bool] | None = None, *,
                 release_file: str | Path | None = None, poll_s: float = 0.02):
        self.when = when
        self.release_file = Path(release_file) if release_file is not None else None
        self.poll_s = poll_s
        self._cond = threading.Condition()
        self._released = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.arrived = 0  # calls that reached the gate, held or not

    def matches(self, request: LLMRequest) -> bool:
        return self.when is None or self.when(request)

    @property
    def released(self) -> bool:
        if not self._released and self.release_file is not None \
                and self.release_file.exists():
            self._released = True
        return self._released

    @property
    def waiting(self) -> int:
        """Calls in the gate now."""
        with self._cond:
            return len(self._waiters)

    async def pass_through(self) -> None:
        """Wait here until released (returns at once when already released)."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._cond:
            self.arrived += 1
            if self.released:
                self._cond.notify_all()
                return
            self._waiters.append(entry)
            self._cond.notify_all()
        try:
            while not self.released:
                if self.release_file is None:
                    await event.wait()
                else:
                    try:
                        await asyncio.wait_for(event.wait(), self.poll_s)
                    except asyncio.TimeoutError:  # builtin TimeoutError only from 3.11
                        pass
        finally:
            with self._cond:
                self._waiters.remove(entry)
                self._cond.notify_all()

    def release(self) -> None:
        """Open the gate for the calls in it and every later one."""
        with self._cond:
            self._released = True
            waiters = list(self._waiters)
            self._cond.notify_all()
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop closed: nothing to wake
                loop.call_soon_threadsafe(event.set)

    def wait_held(self, n: int = 1, timeout_s: float = 60.0) -> None:
        """Block the calling thread until ``n`` calls wait in the gate at once; the ceiling
        is generous on purpose (an observed condition, not a timing): raises TimeoutError
        with what was seen if it passes."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._waiters) >= n, timeout_s):
                raise TimeoutError(f"{len(self._waiters)} call(s) held, {n} expected "
                                   f"({self.arrived} arrived) after {timeout_s:g} s")


def estimate_tokens(text: str) -> int:
    """Rough token count: the larger of the word count and characters / 4."""
    return max(len(text.split()), math.ceil(len(text) / 4)) if text else 0


class ScriptedBackend(LLMBackend):
    """Not a model: answers from ``script``.

    ``script`` is a function ``(LLMRequest) -> str`` or a mapping ``stage -> text`` /
    ``stage -> [texts]`` (the i-th call of a stage gets text i, cycling). ``default`` answers
    stages the mapping lacks (otherwise such a call fails, non-retryable). The answer is the
    continuation of ``answer_prefix``; the prefix is prepended unless the answer already
    starts with it. Stop strings cut the answer; ``max_tokens`` cuts it by whole words.

    Latency: ``latency_s`` before the first token, then ``per_token_s`` per output token.
    Failures: ``fail_after=N`` makes every call after the N-th raise ``BackendError``;
    ``fail_when(request)`` makes matching calls raise; both use ``fail_retryable``.
    ``faults``: scripted hangs, slowdowns and outages over calls or time (``Fault``); a
    test may replace the attribute to end an outage at a moment it chose.
    ``hold``: a gate the test releases (``Hold``); a public attribute, so a test may also set
    it on a backend that a config built.
    """

    def __init__(self, script: Script, *, default: str | None = None, latency_s: float = 0.0,
                 per_token_s: float = 0.0, fail_after: int | None = None,
                 fail_when: Callable[[LLMRequest], bool] | None = None,
                 fail_retryable: bool = True, faults: Sequence[Fault] = (),
                 hold: Hold | None = None, name: str = "scripted",
                 by_prompt: dict[str, str] | None = None):
        if latency_s < 0 or per_token_s < 0:
            raise ValueError("latencies must be non-negative")
        self.name = name
        self._script = script
        # text -> answer: a call whose prompt contains the text gets that answer, first
        self.by_prompt = dict(by_prompt or {})
        self._default = default
        self._cycles: dict[str, Iterator[str]] = {}
        self.latency_s = latency_s
        self.per_token_s = per_token_s
        self.fail_after = fail_after
        self.fail_when = fail_when
        self.fail_retryable = fail_retryable
        self.faults = tuple(faults)
        self.hold = hold
        self._first_call: float | None = None
        self.calls: list[LLMRequest] = []  # every request received, in order
        self.calls_by_stage: dict[str, int] = defaultdict(int)

    def count_tokens(self, text: str) -> int:
        return max(1, estimate_tokens(text))

    @property
    def tokenizer_key(self) -> tuple:
        return ("scripted",)

    def _answer(self, request: LLMRequest) -> str:
        for needle, text in self.by_prompt.items():  # e.g. one tenant's questions only
            if needle in request.prompt:
                return text
        if callable(self._script):
            return self._script(request)
        texts = self._script.get(request.stage)
        if texts is None:
            if self._default is None:
                raise BackendError(f"{self.name}: no scripted answer for stage "
                                   f"{request.stage!r}", retryable=False)
            return self._default
        if isinstance(texts, str):
            return texts
        if request.stage not in self._cycles:
            if not texts:
                raise BackendError(f"{self.name}: empty script for stage {request.stage!r}",
                                   retryable=False)
            self._cycles[request.stage] = itertools.cycle(list(texts))
        return next(self._cycles[request.stage])

    async def generate(self, request: LLMRequest,
                       on_progress: ProgressCallback | None = None) -> LLMResult:
        self.calls.append(request)
        self.calls_by_stage[request.stage] += 1
        n_call = len(self.calls)
        now = time.perf_counter()
        if self._first_call is None:
            self._first_call = now
        fault = next((f for f in self.faults if f.applies(n_call, now - self._first_call)),
                     None)
        if fault is not None and fault.fail:
            raise BackendError(f"{self.name}: injected fault (call {n_call})",
                               retryable=fault.retryable)
        latency_s, per_token_s = self.latency_s, self.per_token_s
        if fault is not None:
            latency_s = (fault.latency_s if fault.latency_s is not None else latency_s) \
                * fault.slowdown
            per_token_s *= fault.slowdown
        if self.fail_after is not None and n_call > self.fail_after:
            raise BackendError(f"{self.name}: injected failure (call {n_call} > "
                               f"{self.fail_after})", retryable=self.fail_retryable)
        if self.fail_when is not None and self.fail_when(request):
            raise BackendError(f"{self.name}: injected failure for {request.request_id}",
                               retryable=self.fail_retryable)
        hold = self.hold
        if hold is not None and hold.matches(request):
            await hold.pass_through()
        start = time.perf_counter()
        text = self._answer(request)
        prefix = request.answer_prefix
        if prefix and text.startswith(prefix):
            text = text[len(prefix):]
        finish = "stop"
        for stop in request.params.stop:
            if stop and stop in text:
                text = text[:text.index(stop)]
        if request.params.max_tokens > 0 and estimate_tokens(text) > request.params.max_tokens:
            words = text.split(" ")
            while words and estimate_tokens(" ".join(words)) > request.params.max_tokens:
                words.pop()
            text, finish = " ".join(words), "length"
        n_out = estimate_tokens(text)
        if latency_s:
            await asyncio.sleep(latency_s)
        ttft = time.perf_counter() - start
        stall_after = fault.stall_after_tokens if fault is not None else None
        if per_token_s or stall_after is not None:
            for i in range(1, n_out + 1):
                if stall_after is not None and i > stall_after:
                    await asyncio.sleep(10 ** 6)  # hangs until cancelled
                await asyncio.sleep(per_token_s)
                if on_progress is not None:
                    on_progress(i)
        elif on_progress is not None and n_out:
            on_progress(n_out)
        return LLMResult(prefix + text, self.count_tokens(request.prompt + prefix), n_out,
                         finish, queue_s=0.0, ttft_s=ttft, total_s=time.perf_counter() - start,
                         backend=self.name)
