"""The embedded default backend: a GGUF model run in-process by llama.cpp on the CPU.

One llama.cpp context evaluates one sequence at a time, so calls queue inside the backend by
priority (``PriorityWorker``) and run in a dedicated thread; the event loop never blocks.
Prompts are evaluated incrementally against what the context already holds: calls of one query
share their schema/examples prefix and only the suffix is read. A bounded prefix-state cache
keeps that working when several queries interleave (see ``prefix_cache``).

We drive tokens ourselves rather than through ``Llama.create_completion`` to get exact
per-token progress, cancellation between prefill chunks and tokens, exact timing and
reused-prefix counts, and grammar constraints that do not scan the whole vocabulary per token
(``llama_sampling``).
"""

from __future__ import annotations

import ctypes
import os
import random
import threading
import time
from dataclasses import dataclass

import llama_cpp.llama_cpp as C
import numpy as np

from agentflow.llm.base import BackendError, LLMBackend, LLMRequest, LLMResult, ProgressCallback
from agentflow.llm.llama_loading import default_model_path, load_llama
from agentflow.llm.llama_logging import install as install_llama_logging
from agentflow.llm.llama_logging import set_llama_verbose
from agentflow.llm.llama_sampling import (
    GrammarError,
    TokenSampler,
    is_end_of_generation,
    validate_grammar,
)
from agentflow.llm.prefix_cache import PrefixStateCache, SavedState, common_prefix_len
from agentflow.llm.worker import Job, PriorityWorker

#: Default bound of the prefix-state cache. A 1k-token prompt of the embedded model saves
#: ~11 MB, so this holds ~20 recent prefixes; larger models need proportionally more.
DEFAULT_PREFIX_CACHE_BYTES = 256 << 20


@dataclass
class LocalStats:
    """Counters for measuring prefix reuse and grammar cost (read them, don't rely on them)."""

    calls: int = 0
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0
    prefix_cache_saves: int = 0
    prefix_cache_restores: int = 0
    grammar_fallbacks: int = 0


class LocalLlamaBackend(LLMBackend):
    """llama.cpp in-process. ``model_path`` defaults to the embedded 270M Gemma 3 GGUF.

    ``prefix_cache_bytes=0`` disables the prefix-state cache. ``use_extra_bufts`` stays False
    unless you know the CPU's repacked kernels work (see ``llama_loading``).

    ``n_threads`` defaults to ``os.cpu_count()``, the fastest choice on an otherwise idle
    machine. llama.cpp's threads spin at barriers, so when other busy processes share the
    cores, use fewer: measured on 2 cores next to one busy process, 2 threads decoded at
    2.3 tok/s and 1 thread at 25 tok/s (idle: 40 vs 25 tok/s).
    """

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *,
                 n_ctx: int = 4096, n_threads: int | None = None,
                 n_threads_batch: int | None = None, n_batch: int = 512,
                 prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
                 min_saved_tokens: int = 64, use_extra_bufts: bool = False,
                 name: str = "local", verbose: bool = False):
        self.name = name
        self.model_path = str(model_path) if model_path else default_model_path()
        threads = n_threads or os.cpu_count() or 1
        if verbose:
            set_llama_verbose(True)
        else:
            install_llama_logging()  # llama.cpp's lines go to a logger that is off by default
        self._llm = load_llama(
            self.model_path, use_extra_bufts=use_extra_bufts, n_ctx=n_ctx, n_threads=threads,
            n_threads_batch=n_threads_batch or threads, n_batch=n_batch, n_ubatch=n_batch,
            verbose=verbose)
        self.n_ctx = self._llm.n_ctx()
        self._n_batch = n_batch
        self._vocab = self._llm._model.vocab
        self._n_vocab = self._llm.n_vocab()
        self._cache = PrefixStateCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._min_saved_tokens = min_saved_tokens
        self._valid_grammars: set[str] = set()
        self._worker = PriorityWorker(name=f"llama-{name}")
        self._closed = False
        self._close_lock = threading.Lock()
        self.stats = LocalStats()

    # -- public API ---------------------------------------------------------------------

    async def generate(self, request: LLMRequest,
                       on_progress: ProgressCallback | None = None) -> LLMResult:
        if self._closed:
            raise BackendError(f"{self.name}: backend is closed", retryable=True)
        return await self._worker.submit(
            request.priority, lambda job: self._run(job, request, on_progress))

    @property
    def tokenizer_key(self) -> tuple:
        return ("llama.cpp", self.model_path)

    def count_tokens(self, text: str) -> int:
        # Tokenising reads only the vocabulary, so it is safe beside a running generation,
        # but not beside close(), which frees the vocabulary: the lock keeps them apart.
        with self._close_lock:
            if self._closed:
                raise BackendError(f"{self.name}: backend is closed", retryable=True)
            return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    @property
    def queued(self) -> int:
        return self._worker.queued

    async def close(self) -> None:
        """Stop the worker (joining its thread), then free the model. A call or token count
        that comes later gets a BackendError, never a freed model."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        await self._worker.close()
        with self._close_lock:
            self._llm.close()

    # -- worker thread ------------------------------------------------------------------

    def _run(self, job: Job[LLMResult], request: LLMRequest,
             on_progress: ProgressCallback | None) -> LLMResult:
        try:
            return self._generate_sync(job, request, on_progress)
        except BackendError:
            raise
        except GrammarError as exc:
            raise BackendError(f"{self.name}: {exc}", retryable=False) from exc
        except Exception as exc:  # llama.cpp decode failures surface as RuntimeError
            self._llm.n_tokens = 0  # the context may be half-written: re-read next time
            raise BackendError(f"{self.name}: llama.cpp failed: {type(exc).__name__}: {exc}",
                               retryable=True) from exc

    def _generate_sync(self, job: Job[LLMResult], request: LLMRequest,
                       on_progress: ProgressCallback | None) -> LLMResult:
        llm = self._llm
        start = time.perf_counter()
        params = request.params
        tokens = llm.tokenize((request.prompt + request.answer_prefix).encode("utf-8"),
                              add_bos=True, special=True)
        n_prompt = len(tokens)
        if n_prompt >= self.n_ctx:
            raise BackendError(
                f"{self.name}: prompt is {n_prompt} tokens but the context window (n_ctx) is "
                f"{self.n_ctx}; shorten the prompt or load the model with a larger n_ctx",
                retryable=False)
        room = self.n_ctx - n_prompt
        max_tokens = room if params.max_tokens <= 0 else min(params.max_tokens, room)
        if params.grammar is not None and params.grammar not in self._valid_grammars:
            validate_grammar(self._vocab, params.grammar)
            self._valid_grammars.add(params.grammar)

        def cancelled_result(n_out: int = 0, ttft: float = 0.0) -> LLMResult:
            return LLMResult(request.answer_prefix, n_prompt, n_out, "cancelled",
                             queue_s=job.queue_s, ttft_s=ttft,
                             total_s=time.perf_counter() - start, backend=self.name)

        prompt = np.asarray(tokens, dtype=np.intc)
        reused = self._prepare_context(prompt)
        self.stats.calls += 1
        self.stats.prompt_tokens += n_prompt
        self.stats.reused_prompt_tokens += reused
        # Prefill in n_batch chunks so a cancelled call stops within one chunk.
        pos = llm.n_tokens
        while pos < n_prompt:
            if job.cancelled():
                return cancelled_result()
            chunk = tokens[pos:pos + self._n_batch]
            llm.eval(chunk)
            pos += len(chunk)

        seed = params.seed if params.seed is not None else random.getrandbits(32)
        sampler = TokenSampler(self._vocab, self._n_vocab, temperature=params.temperature,
                               top_p=params.top_p, seed=seed, grammar=params.grammar)
        stops = [s.encode("utf-8") for s in params.stop if s]
        longest_stop = max((len(s) for s in stops), default=0)
        out = bytearray()
        n_out = 0
        ttft = 0.0
        finish = "length"
        try:
            while n_out < max_tokens:
                if job.cancelled():
                    return cancelled_result(n_out, ttft)
                token = sampler.sample(llm._ctx.ctx)
                if n_out == 0:
                    ttft = time.perf_counter() - start
                if is_end_of_generation(self._vocab, token):
                    finish = "stop"
                    break
                n_out += 1
                before = len(out)
                out += llm.detokenize([token])
                if on_progress is not None:
                    job.post(on_progress, n_out)
                if stops:
                    window = bytes(out[max(0, before - longest_stop):])
                    hits = [window.find(s) for s in stops]
                    hits = [h for h in hits if h >= 0]
                    if hits:
                        del out[max(0, before - longest_stop) + min(hits):]
                        finish = "stop"
                        break
                if n_out >= max_tokens:
                    break
                sampler.accept(token)
                llm.eval([token])
        finally:
            self.stats.grammar_fallbacks += sampler.grammar_fallbacks
            sampler.close()
        return LLMResult(
            text=request.answer_prefix + out.decode("utf-8", errors="ignore"),
            prompt_tokens=n_prompt, completion_tokens=n_out, finish_reason=finish,
            queue_s=job.queue_s, ttft_s=ttft, total_s=time.perf_counter() - start,
            cached_prompt_tokens=reused, backend=self.name)

    # -- KV reuse -------------------------------------------------------------------------

    def _prepare_context(self, prompt: np.ndarray) -> int:
        """Leave the context holding the longest reusable prefix of ``prompt`` (at most all
        but its last token, whose logits we need) and return that prefix's length."""
        llm = self._llm
        current = llm.input_ids[:llm.n_tokens]
        common = common_prefix_len(current, prompt)
        if self._cache is not None:
            if llm.n_tokens - common >= self._min_saved_tokens:
                self._cache.put(SavedState(current.copy(), self._save_sequence()))
                self.stats.prefix_cache_saves += 1
            found = self._cache.best(prompt)
            if found is not None and found[0] > common:
                common = found[0] if self._restore_sequence(found[1]) else 0
                self.stats.prefix_cache_restores += 1 if common else 0
        common = min(common, len(prompt) - 1)
        if common < llm.n_tokens and not llm._ctx.kv_cache_seq_rm(-1, common, -1):
            # This model's cache cannot drop a tail (e.g. recurrent state): start over.
            self._clear_memory()
            common = 0
        llm.n_tokens = common
        return common

    def _save_sequence(self) -> bytes:
        ctx = self._llm._ctx.ctx
        size = C.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        n = C.llama_state_seq_get_data(ctx, buf, size, 0)
        return ctypes.string_at(buf, n)

    def _restore_sequence(self, state: SavedState) -> bool:
        self._clear_memory()
        data = (ctypes.c_uint8 * len(state.data)).from_buffer_copy(state.data)
        if C.llama_state_seq_set_data(self._llm._ctx.ctx, data, len(state.data), 0) == 0:
            self._clear_memory()
            return False
        n = len(state.tokens)
        self._llm.input_ids[:n] = state.tokens
        self._llm.n_tokens = n
        return True

    def _clear_memory(self) -> None:
        C.llama_memory_clear(C.llama_get_memory(self._llm._ctx.ctx), True)
        self._llm.n_tokens = 0
