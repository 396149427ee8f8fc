"""SELECT * answers are asked again and are no evidence; taught SQL runs as a candidate.

Real demo database, scripted backend (no model): the script answers like the embedded model
did in issue 39 (``SELECT *`` for a specific question), and the tests check what the pipelines
do with that, and with a pair the user taught.
"""

from __future__ import annotations

import pytest

from agentflow.answer_shape import asks_for_everything, degenerate, star_projection
from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.llm.grammars import SQL_AFTER_SELECT_GBNF, schema_sql_grammar, without_star
from agentflow.llm.scripted import ScriptedBackend

STAR = "SELECT * FROM stores"
CITIES = "SELECT city FROM stores"
QUESTION = "Which cities have a store?"


@pytest.mark.parametrize("sql, star", [
    ("SELECT * FROM stores", True),
    ("SELECT T1.* FROM stores AS T1", True),
    ("SELECT city FROM stores UNION SELECT * FROM stores", True),
    ("SELECT count(*) FROM stores", False),
    ("SELECT city FROM (SELECT * FROM stores)", False),
    ("SELECT city FROM stores WHERE store_id IN (SELECT * FROM stores)", False),
    ("SELEC * FRM", False),
])
def test_star_projection_is_the_result_columns_only(sql: str, star: bool) -> None:
    assert star_projection(sql) is star


def test_select_star_is_degenerate_unless_the_question_asks_for_everything() -> None:
    assert degenerate("What is the name of the oldest store?", STAR)
    assert degenerate(QUESTION, CITIES) is None
    assert asks_for_everything("Show all information about each store")
    assert asks_for_everything("List all the details of stores in Paris")
    assert degenerate("Show all information about each store", STAR) is None
    assert not asks_for_everything("List all stores")


def test_the_grammar_without_star_keeps_count_star_and_multiplication() -> None:
    for grammar in (SQL_AFTER_SELECT_GBNF,
                    schema_sql_grammar({"stores": ["store_id", "city"]}, "SELECT")):
        rewritten = without_star(grammar)
        result_col = next(line for line in rewritten.splitlines()
                          if line.startswith("result-col  ::="))
        column = next(line for line in rewritten.splitlines()
                      if line.startswith("column      ::="))
        assert '"*"' not in result_col and '"*"' not in column
        assert '"(" ows ("*"' in rewritten  # COUNT(*) still allowed
        assert 'mul-op      ::= "*"' in rewritten
    with pytest.raises(ValueError, match="not an agentflow SQL grammar"):
        without_star("root ::= \"x\"")


def test_the_grammar_without_star_compiles_in_llama_cpp() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    grammar = without_star(schema_sql_grammar({"stores": ["store_id", "city"]}, "SELECT"))
    assert llama_cpp.LlamaGrammar.from_string(grammar, verbose=False) is not None


def _connect(script, tmp_path) -> tuple[AgentFlow, list]:
    calls: list = []

    def recording(request):
        calls.append(request)
        return script(request)
    config = AgentFlowConfig(fewshot=None, teaching_store=str(tmp_path / "t.sqlite"))
    return AgentFlow(config, backends={"s": ScriptedBackend(recording, default="no")}), calls


def test_chess_asks_a_select_star_candidate_again_warmer_and_without_star(tmp_path) -> None:
    def script(request):
        return {"extract_keywords": "cities", "generate_candidate": STAR,
                "revise": CITIES}.get(request.stage, "no")

    af, calls = _connect(script, tmp_path)
    with af:
        answer = af.ask(QUESTION, db="bookshop", pipeline="chess")
    assert answer.status == "done", answer.error
    assert answer.sql == CITIES
    retries = [c for c in calls if c.stage == "revise"]
    assert len(retries) == 3  # each SELECT * candidate once; the retry answered specifically
    for call in retries:
        assert call.params.temperature >= 0.7
        assert "only the columns the question asks for" in call.prompt
        assert call.params.grammar and '"*" |' not in next(
            line for line in call.params.grammar.splitlines() if line.startswith("result-col"))


def test_agreeing_select_star_candidates_are_not_evidence(tmp_path) -> None:
    def script(request):  # the model insists on SELECT * even when asked again
        return {"extract_keywords": "cities", "generate_candidate": STAR,
                "revise": STAR}.get(request.stage, "no")

    af, _ = _connect(script, tmp_path)
    with af:
        answer = af.ask(QUESTION, db="bookshop", pipeline="chess")
    assert answer.sql == STAR
    assert answer.confidence["level"] == "low"
    assert any("only on SELECT *" in r for r in answer.confidence["reasons"])
    assert answer.confidence["features"]["degenerate"] == 1.0


def test_a_real_answer_outvotes_two_select_star_candidates(tmp_path) -> None:
    def script(request):
        if request.stage == "generate_candidate":
            return CITIES if "Select only the columns" in request.prompt else STAR
        return {"extract_keywords": "cities", "revise": STAR}.get(request.stage, "no")

    af, _ = _connect(script, tmp_path)
    with af:
        answer = af.ask(QUESTION, db="bookshop", pipeline="chess")
    assert answer.sql == CITIES, answer.details


@pytest.mark.parametrize("pipeline", ["chess", "single"])
def test_a_taught_question_runs_its_sql_as_a_candidate_and_wins(tmp_path, pipeline) -> None:
    def script(request):  # the model is wrong every time
        return {"extract_keywords": "cities", "generate_candidate": STAR, "generate_sql": STAR,
                "revise": "SELECT store_id FROM stores"}.get(request.stage, "no")

    af, _ = _connect(script, tmp_path)
    with af:
        af.teach("Which cities have a store?", "SELECT DISTINCT city FROM stores",
                 db="bookshop")
        exact = af.ask(QUESTION, db="bookshop", pipeline=pipeline)
        para = af.ask("Which cities have stores?", db="bookshop", pipeline=pipeline)
        other = af.ask("Which cities have no store?", db="bookshop", pipeline=pipeline)
    assert exact.sql == "SELECT DISTINCT city FROM stores", exact.details
    assert "taught_candidate" in [s["node_id"] for s in exact.stages]
    assert exact.confidence["features"]["taught"] == 1.0
    assert exact.confidence["level"] == "high"
    assert para.sql == "SELECT DISTINCT city FROM stores"
    assert any("paraphrase" in r for r in para.confidence["reasons"])
    # "no store" is another question: the taught SQL does not enter
    assert "taught_candidate" not in [s["node_id"] for s in other.stages]
    assert other.sql != "SELECT DISTINCT city FROM stores"
