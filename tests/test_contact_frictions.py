"""The smaller frictions of a first contact (issue 39, item 6), each on real runs through the
scripted backend (not a model) on the demo database: the CLI's "unsure" line, a cancelled
answer's confidence, a candidate cut at its token limit."""

from __future__ import annotations

import io

from rich.console import Console

from agentflow.api import AgentFlow
from agentflow.cli.ask import print_answer, status_line
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend

COUNT = "SELECT count(*) FROM stores"
DISAGREEING = [COUNT, "SELECT count(*) FROM customers", "SELECT count(*) FROM books"]


def connect(answers: dict, backend_kw: dict | None = None, **config) -> AgentFlow:
    backend = ScriptedBackend(answers, default=COUNT, **(backend_kw or {}))
    return AgentFlow(AgentFlowConfig(fewshot=None, **config), backends={"scripted-0": backend})


def printed(answer) -> str:
    console = Console(width=200, file=io.StringIO())
    print_answer(console, answer)
    return console.file.getvalue()


# ----------------------------------------------------------------------------- CLI lines
def test_cli_prints_an_unsure_answer_as_one_clear_line() -> None:
    script = {"extract_keywords": "stores", "generate_candidate": DISAGREEING,
              "generate_unit_test": ""}
    with connect(script, min_confidence=0.5) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "unsure"
    text = printed(answer)
    assert "unsure: not sure" not in text, text
    lines = [line for line in text.splitlines() if "not sure" in line]
    assert len(lines) == 1, text
    assert "confidence 0.38 is below the threshold 0.50" in lines[0]
    # the reasons are in that line; the level line would repeat score and reasons
    assert "no usable unit test" in lines[0]
    assert not any(line.lstrip().startswith("·") for line in text.splitlines()), text
    assert "confidence low (" not in text, text


def test_status_line_names_the_status_once() -> None:
    assert status_line("cancelled", "cancelled by request") == "cancelled by request"
    assert status_line("failed", "no such table: x") == "failed: no such table: x"
    assert status_line("unsure", "not sure: confidence 0.20 ...") == (
        "not sure: confidence 0.20 ...")


# ----------------------------------------------------------------------------- cancelled
def test_a_cancelled_answer_has_no_confidence() -> None:
    from agentflow.llm.scripted import Hold

    hold = Hold(lambda r: r.stage == "generate_candidate")
    backend = ScriptedBackend({"extract_keywords": "stores"}, default=COUNT, hold=hold)
    with AgentFlow(AgentFlowConfig(fewshot=None), backends={"s": backend}) as af:
        try:
            handle = af.submit("How many stores are there?", db="bookshop", pipeline="chess")
            hold.wait_held(1)  # the candidates are running: the pipeline state is half done
            assert af.cancel(handle.query_id)
            answer = handle.result(timeout=60)
        finally:
            hold.release()
    assert answer.status == "cancelled"
    assert answer.confidence is None
    assert "cancelled" in printed(answer) and "confidence low" not in printed(answer)


# ----------------------------------------------------------------------------- cut SQL
# Longer than the SQL token limit (160) wherever the scripted backend cuts it (by whole
# words): the cut always lands inside the IN list, so the text never parses.
LONG = "SELECT count(*) FROM stores WHERE store_id IN (" + ", ".join(
    str(i) for i in range(400)) + ")"


def test_a_candidate_cut_at_its_token_limit_says_so_in_plain_words() -> None:
    with connect({"generate_sql": LONG}) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="single")
    assert answer.status == "failed"
    execute = next(s for s in answer.stages if s["node_id"] == "execute")
    for text in (answer.error, execute["summary"]):
        assert "cut at the token limit" in text and "write a shorter query" in text, text
        assert "<class" not in text and "Required keyword" not in text, text
    generate = next(s for s in answer.stages if s["node_id"] == "generate_sql")
    assert generate["llm_calls"][0]["completion_tokens"] >= 150


def test_the_revision_of_a_cut_candidate_is_told_it_was_cut() -> None:
    prompts: list[str] = []

    def script(request) -> str:
        if request.stage == "revise":
            prompts.append(request.prompt)
            return COUNT
        return {"extract_keywords": "stores", "generate_unit_test": ""}.get(
            request.stage, LONG if request.stage == "generate_candidate" else COUNT)

    backend = ScriptedBackend(script)
    with AgentFlow(AgentFlowConfig(fewshot=None), backends={"s": backend}) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert prompts and all("cut at the token limit" in p for p in prompts), prompts[:1]
    assert answer.status == "done" and answer.sql == COUNT, answer.error


def test_a_complete_query_that_does_not_parse_is_not_called_cut() -> None:
    with connect({"generate_sql": "SELECT name FROM stores WHERE store_id = - ORDER BY name"},
                 ) as af:
        answer = af.ask("Which stores?", db="bookshop", pipeline="single")
    assert answer.status == "failed"
    assert "cut at the token limit" not in answer.error
    assert "'-' is missing what must follow it" in answer.error, answer.error
    assert "<class" not in answer.error


def test_parse_errors_name_the_sql_word_not_sqlglot_classes() -> None:
    import pytest

    from agentflow.sql.errors import SqlSyntaxError
    from agentflow.sql.guard import parse_single_query

    for sql, word in (("SELECT a FROM t WHERE x = -", "'-'"),
                      ("SELECT a FROM t ORDER BY", "'ORDER BY'"),
                      ("SELECT a FROM t WHERE x >", "'>'")):
        with pytest.raises(SqlSyntaxError) as err:
            parse_single_query(sql, "sqlite")
        assert f"{word} is missing what must follow it" in err.value.message
        assert "<class" not in err.value.message and "line 1" in err.value.message
