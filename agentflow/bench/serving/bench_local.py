"""Side-by-side measurements of the local llama.cpp backend, in one run::

    agentflow bench bench_local [--model PATH] [--threads N] [--with-llama-ram-cache]

Why a script: the backend's defaults (prefix-state cache on, grammar checked per chosen token)
were chosen on these numbers, and the project reports performance only as ratios measured side
by side by code in the repo. It prints prefill, prefix-reuse and decode speed; grammar cost
(unconstrained vs this backend's grammar sampler vs llama-cpp-python's own grammar sampling);
and interleaved-query time with the prefix-state cache off and on. Takes ~1-2 min on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from agentflow.llm.base import LLMRequest, SamplingParams
from agentflow.llm.grammars import sql_select_grammar
from agentflow.llm.llama_loading import default_model_path, load_llama
from agentflow.llm.local import DEFAULT_PREFIX_CACHE_BYTES, LocalLlamaBackend

SMALL_SCHEMA = (
    "-- SQLite schema\n"
    "CREATE TABLE book (book_id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER, "
    "year INTEGER, price REAL);\n"
    "CREATE TABLE author (author_id INTEGER PRIMARY KEY, name TEXT, country TEXT);\n")
QUESTIONS = ["How many books are there?", "Which books did Italo Calvino write?",
             "What is the average price of books per author country?",
             "List titles of books published after 1970."]


def big_schema(name: str, tables: int = 40) -> str:
    """~1k tokens of schema, the size of a real prompt's shared prefix."""
    return "".join(f"CREATE TABLE {name}_{i} (id INTEGER PRIMARY KEY, {name}_name TEXT, "
                   f"city TEXT, amount REAL, created DATE);\n" for i in range(tables))


def sql_request(schema: str, question: str, **params) -> LLMRequest:
    return LLMRequest(f"{schema}\n-- Question: {question}\n-- SQL:\n",
                      SamplingParams(**params), answer_prefix="SELECT")


def parses(sql: str) -> bool:
    import sqlglot
    try:
        return len(sqlglot.parse(sql.split("\n\n")[0].rstrip().rstrip(";"), read="sqlite")) == 1
    except Exception:  # noqa: BLE001
        return False


async def speed(backend: LocalLlamaBackend) -> None:
    await backend.generate(LLMRequest("warm up " * 40, SamplingParams(max_tokens=8)))
    schema = big_schema("shop")
    cold = await backend.generate(sql_request(schema, "how many rows?", max_tokens=4))
    warm = await backend.generate(sql_request(schema, "list the cities", max_tokens=4))
    print(f"prefill   {cold.prompt_tokens} tokens cold: ttft {cold.ttft_s:.2f} s "
          f"({cold.prompt_tokens / cold.ttft_s:.0f} tok/s)")
    print(f"prefix    same prefix, {warm.cached_prompt_tokens} tokens reused: ttft "
          f"{warm.ttft_s:.3f} s  -> {cold.ttft_s / warm.ttft_s:.0f}x faster")
    story = await backend.generate(LLMRequest("Once upon a time", SamplingParams(max_tokens=128)))
    rate = (story.completion_tokens - 1) / (story.total_s - story.ttft_s)
    print(f"decode    {story.completion_tokens} tokens: {rate:.1f} tok/s")


async def grammar_cost(backend: LocalLlamaBackend, llama_builtin: bool) -> None:
    grammar = sql_select_grammar("SELECT")
    rows = []
    for label, g in (("unconstrained", None), ("grammar (this backend)", grammar)):
        tokens = seconds = ok = 0.0
        for q in QUESTIONS:
            r = await backend.generate(sql_request(SMALL_SCHEMA, q, max_tokens=64, grammar=g))
            tokens += r.completion_tokens
            seconds += r.total_s - r.ttft_s
            ok += parses(r.text)
        rows.append((label, tokens, seconds, ok))
    if llama_builtin:
        from llama_cpp import LlamaGrammar
        llm = load_llama(backend.model_path, n_ctx=2048, n_threads=2, n_threads_batch=2,
                         verbose=False)
        compiled = LlamaGrammar.from_string(grammar, verbose=False)
        tokens = seconds = ok = 0.0
        for q in QUESTIONS:
            request = sql_request(SMALL_SCHEMA, q)
            t0 = time.perf_counter()
            first = None
            text = "SELECT"
            n = 0
            for chunk in llm.create_completion(request.prompt + "SELECT", max_tokens=64,
                                               temperature=0.0, grammar=compiled, stream=True):
                first = first or time.perf_counter()
                text += chunk["choices"][0]["text"]
                n += 1
            tokens += n
            seconds += time.perf_counter() - (first or t0)
            ok += parses(text)
        llm.close()
        rows.append(("grammar (llama-cpp-python)", tokens, seconds, ok))
    base = rows[0][1] / rows[0][2]
    for label, tokens, seconds, ok in rows:
        rate = tokens / seconds
        print(f"grammar   {label:28s} {rate:5.1f} tok/s ({rate / base:.2f}x), "
              f"{tokens / len(QUESTIONS):.0f} tokens/answer, parses {ok:.0f}/{len(QUESTIONS)}")


async def interleaved(cache_bytes: int, threads: int | None, model: str) -> tuple[float, float]:
    backend = LocalLlamaBackend(model, n_threads=threads, prefix_cache_bytes=cache_bytes)
    try:
        await backend.generate(LLMRequest("warm up " * 40, SamplingParams(max_tokens=8)))
        schemas = [big_schema(name) for name in ("shop", "school", "clinic")]
        t0 = time.perf_counter()
        ttfts = []
        for round_ in range(3):
            for i, schema in enumerate(schemas):
                r = await backend.generate(sql_request(schema, f"round {round_}: rows in {i}?",
                                                       max_tokens=16))
                ttfts.append(r.ttft_s)
        return time.perf_counter() - t0, sum(ttfts[3:]) / len(ttfts[3:])
    finally:
        await backend.close()


def llama_ram_cache_interleaved(model: str, threads: int | None) -> float:
    """The same interleaving through ``Llama.create_completion`` with ``LlamaRAMCache``."""
    from llama_cpp import LlamaRAMCache
    llm = load_llama(model, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                     verbose=False)
    llm.set_cache(LlamaRAMCache(DEFAULT_PREFIX_CACHE_BYTES))
    llm.create_completion("warm up " * 40, max_tokens=8)
    schemas = [big_schema(name) for name in ("shop", "school", "clinic")]
    t0 = time.perf_counter()
    for round_ in range(3):
        for i, schema in enumerate(schemas):
            request = sql_request(schema, f"round {round_}: rows in {i}?")
            llm.create_completion(request.prompt + "SELECT", max_tokens=16, temperature=0.0)
    total = time.perf_counter() - t0
    llm.close()
    return total


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="GGUF path (default: embedded model)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--with-builtin-grammar", action="store_true",
                        help="also time llama-cpp-python's own grammar sampling (slow)")
    parser.add_argument("--with-llama-ram-cache", action="store_true",
                        help="also time llama-cpp-python's LlamaRAMCache (slow, ~0.5 GB/entry)")
    args = parser.parse_args(argv)
    model = args.model or default_model_path()
    backend = LocalLlamaBackend(model, n_threads=args.threads)
    try:
        await speed(backend)
        await grammar_cost(backend, llama_builtin=args.with_builtin_grammar)
    finally:
        await backend.close()
    off = await interleaved(0, args.threads, model)
    on = await interleaved(DEFAULT_PREFIX_CACHE_BYTES, args.threads, model)
    print(f"interleave 3 queries x 3 rounds, cache off: {off[0]:.1f} s (later-round ttft "
          f"{off[1]:.2f} s); on: {on[0]:.1f} s (ttft {on[1]:.2f} s) -> "
          f"{off[0] / on[0]:.1f}x faster")
    if args.with_llama_ram_cache:
        total = llama_ram_cache_interleaved(model, args.threads)
        print(f"interleave with llama-cpp-python's LlamaRAMCache: {total:.1f} s")


if __name__ == "__main__":
    asyncio.run(main())
