"""Confidence: the scoring on hand-made signals, then real runs on the demo database through
the scripted backend (not a model) and every interface that shows an answer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow.api import AgentFlow, InvalidRequest
from agentflow.confidence import Signals, assess, below, implausibility, level_of
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend

ROOT = Path(__file__).resolve().parents[1]
COUNT = "SELECT count(*) FROM stores"
DISAGREEING = [COUNT, "SELECT count(*) FROM customers", "SELECT count(*) FROM books"]


def signals(**kw) -> Signals:
    base = {"question": "How many stores are there?", "sql": COUNT, "executed": True,
            "rows": [(12,)], "n_candidates": 3, "chosen_cluster": 3, "n_clusters": 1}
    return Signals(**{**base, **kw})


# ----------------------------------------------------------------------------- scoring
def test_all_candidates_agreeing_is_high() -> None:
    c = assess(signals())
    assert c.level == "high" and c.score >= 0.9
    assert c.reasons == ["all 3 candidates return the same result"]


def test_disagreeing_candidates_without_tests_are_low_and_say_the_tests_are_missing() -> None:
    c = assess(signals(chosen_cluster=1, n_clusters=3, unit_tests=[]))
    assert c.level == "low"
    assert "1 of 3 candidates agree (3 different results)" in c.reasons
    assert any("no usable unit test" in r for r in c.reasons)


def test_unit_tests_count_only_when_they_single_out_the_choice() -> None:
    untested = assess(signals(chosen_cluster=2, n_clusters=2, unit_tests=[]))
    alone = assess(signals(chosen_cluster=2, n_clusters=2, unit_tests=["one number"],
                           tests_passed=True))
    shared = assess(signals(chosen_cluster=2, n_clusters=2, unit_tests=["one number"],
                            tests_passed=True, other_clusters_passed=1))
    none = assess(signals(chosen_cluster=2, n_clusters=2, unit_tests=["one number"],
                          tests_passed=False))
    assert none.score < untested.score == shared.score < alone.score
    assert any("passed the model's 1 unit test" in r for r in alone.reasons)


def test_single_candidate_says_what_it_cannot_know_and_is_never_high() -> None:
    c = assess(signals(n_candidates=1, chosen_cluster=None, n_clusters=None))
    assert c.level == "medium"
    assert "cannot tell a consistent answer from a lucky one" in c.reasons[0]


def test_no_sql_or_sql_that_fails_scores_zero() -> None:
    assert assess(signals(sql=None)).score == 0.0
    failed = assess(signals(executed=False, rows=[]))
    assert (failed.score, failed.level) == (0.0, "low")


def test_empty_and_all_null_results_lower_the_score() -> None:
    full = assess(signals(question="Which stores are in Paris?", rows=[("a",)])).score
    empty = assess(signals(question="Which stores are in Paris?", rows=[]))
    nulls = assess(signals(question="Which stores are in Paris?", rows=[(None,)]))
    assert empty.score < nulls.score < full
    assert "the result is empty" in empty.reasons
    assert "every value in the result is NULL" in nulls.reasons


def test_the_demo_count_question_answered_with_one_row_is_low() -> None:
    """The issue's case: 'How many stores are there?' -> SELECT * ... WHERE store_id = 1."""
    c = assess(signals(sql="SELECT * FROM stores WHERE store_id = 1",
                       rows=[(1, "Central", "Paris", 120.0)], n_candidates=1,
                       chosen_cluster=None, n_clusters=None))
    assert c.level == "low"
    assert "a 'how many' question answered without COUNT or SUM" in c.reasons


def test_implausibility_rules() -> None:
    q = "How many stores are there?"
    assert implausibility(q, COUNT, [(12,)]) is None
    assert "2 rows" in implausibility(q, "SELECT count(*) FROM stores GROUP BY city",
                                      [(1,), (2,)])
    assert implausibility("How many books does each store have?",
                          "SELECT store_id, count(*) FROM books GROUP BY store_id",
                          [(1, 3), (2, 4)]) is None
    assert implausibility("Which store is largest?", "SELECT name FROM stores", [("a",)]) is None
    assert "without a number" in implausibility(q, "SELECT count(*), 'x' FROM stores "
                                                   "WHERE 0 GROUP BY 2", [("x",)])


def test_each_repair_lowers_the_score() -> None:
    scores = [assess(signals(repairs=n)).score for n in range(3)]
    assert scores[0] > scores[1] > scores[2]
    assert "2 failed or empty execution(s) had to be repaired first" in \
        assess(signals(repairs=2)).reasons


def test_levels_and_threshold() -> None:
    assert [level_of(s) for s in (0.9, 0.75, 0.6, 0.45, 0.2)] == \
        ["high", "high", "medium", "medium", "low"]
    assert below({"score": 0.3}, 0.5) and not below({"score": 0.5}, 0.5)
    assert not below({"score": 0.1}, None) and not below(None, 0.9)


# ----------------------------------------------------------------------------- real runs
def connect(answers: dict, **config) -> AgentFlow:
    backend = ScriptedBackend(answers, default=COUNT)
    return AgentFlow(AgentFlowConfig(fewshot=None, **config), backends={"scripted-0": backend})


def test_chess_with_disagreeing_candidates_is_low_and_reports_missing_tests() -> None:
    script = {"extract_keywords": "stores", "generate_candidate": DISAGREEING,
              "generate_unit_test": ""}  # the model writes no usable unit test
    with connect(script) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    # low is below the default min_confidence: unsure, never a green done; the guess stays
    assert answer.status == "unsure" and answer.sql and answer.rows, answer.error
    assert answer.confidence["level"] == "low"
    assert any("no usable unit test" in r for r in answer.confidence["reasons"])
    assert answer.details["unit_tests"] == []
    stages = {s["node_id"]: s for s in answer.stages}
    # No test exists, so nothing is evaluated against one, and nothing reads "pass".
    assert not any(n.startswith("evaluate.") for n in stages)
    assert "no usable unit test" in stages["generate_unit_tests"]["summary"]
    assert "untested" in stages["choose"]["summary"]
    assert not any("pass" in (s["summary"] or "") for s in answer.stages)


def test_chess_evaluates_real_unit_tests_per_cluster() -> None:
    script = {"extract_keywords": "stores", "generate_candidate": DISAGREEING,
              "generate_unit_test": " the result is one number", "evaluate": ["no", "yes", "no"]}
    with connect(script) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "done", answer.error
    evaluated = [s for s in answer.stages if s["node_id"].startswith("evaluate.")]
    assert len(evaluated) == 3
    assert any("only the chosen result passed" in r for r in answer.confidence["reasons"])


def test_chess_with_agreeing_candidates_is_high() -> None:
    with connect({"extract_keywords": "stores", "generate_candidate": COUNT}) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.confidence["level"] == "high", answer.confidence
    assert answer.to_dict()["confidence"] == answer.confidence


def test_single_and_macsql_carry_confidence() -> None:
    with connect({"generate_sql": "SELECT * FROM stores WHERE store_id = 1",
                  "decomposer": COUNT}) as af:
        single = af.ask("How many stores are there?", db="bookshop", pipeline="single")
        macsql = af.ask("How many stores are there?", db="bookshop", pipeline="macsql")
    assert single.confidence["level"] == "low"
    assert "one candidate only" in single.confidence["reasons"][0]
    assert macsql.confidence["level"] == "medium"


def test_the_default_threshold_is_the_measured_one_and_null_turns_it_off() -> None:
    from agentflow.confidence import DEFAULT_MIN_CONFIDENCE, MEDIUM_AT

    assert AgentFlowConfig().min_confidence == DEFAULT_MIN_CONFIDENCE == MEDIUM_AT
    script = {"extract_keywords": "stores", "generate_candidate": DISAGREEING,
              "generate_unit_test": ""}
    with connect(script, min_confidence=None) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "done" and answer.confidence["level"] == "low"


def test_threshold_turns_low_confidence_into_unsure_with_the_best_guess() -> None:
    script = {"extract_keywords": "stores", "generate_candidate": DISAGREEING,
              "generate_unit_test": ""}
    with connect(script, min_confidence=0.5) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
        agreed = af.ask("How many stores are there?", db="bookshop", pipeline="single",
                        min_confidence=0.0)
        with pytest.raises(InvalidRequest, match="between 0 and 1"):
            af.ask("How many stores are there?", db="bookshop", min_confidence=2)
    assert answer.status == "unsure" and not answer.ok
    assert answer.error.startswith("not sure: confidence 0.38 is below the threshold 0.50")
    assert answer.sql and answer.rows  # the best guess stays attached
    assert agreed.status == "done"


def test_mcp_ask_returns_confidence() -> None:
    pytest.importorskip("mcp")
    from agentflow.mcp.server import AgentflowTools

    with connect({"extract_keywords": "stores", "generate_candidate": COUNT}) as af:
        tools = AgentflowTools(af)
        low = asyncio.run(tools.ask("How many stores are there?", "bookshop",
                                    pipeline="single", min_confidence=0.9))
    assert low["status"] == "unsure" and low["confidence"]["level"] == "medium"


def test_cli_json_has_confidence_and_the_threshold_flag(tmp_path) -> None:
    cfg = tmp_path / "scripted.yaml"
    cfg.write_text("fewshot: null\npipeline: chess\ninstances:\n  - name: scripted-0\n"
                   "    backend:\n      type: scripted\n      answers:\n"
                   "        extract_keywords: stores\n        generate_unit_test: ''\n"
                   f"        generate_candidate: {json.dumps(DISAGREEING)}\n"
                   f"      default: {COUNT}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def ask(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agentflow.cli.main", "ask",
                               "How many stores are there?", "--db", "bookshop", "--config",
                               str(cfg), *extra], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)

    out = ask("--json")  # the default min_confidence holds a low answer back
    assert out.returncode == 1, out.stderr
    data = json.loads(out.stdout)
    assert data["status"] == "unsure" and data["confidence"]["level"] == "low"
    out = ask("--json", "--min-confidence", "0")  # lowered: every answer is done
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == "done"
    out = ask("--min-confidence", "0")
    assert "confidence low" in out.stdout and "check this answer" in out.stdout
    out = ask("--min-confidence", "7")
    assert out.returncode == 2 and "between 0 and 1" in out.stderr


def test_http_answer_has_confidence_and_min_confidence() -> None:
    pytest.importorskip("fastapi")
    import httpx

    from agentflow.server.testing import LiveServer

    instance = {"name": "s0", "backend": {
        "type": "scripted", "answers": {"extract_keywords": "stores", "generate_unit_test": "",
                                        "generate_candidate": DISAGREEING}, "default": COUNT}}
    with LiveServer({"instances": [instance], "fewshot": None}) as live:
        body = {"question": "How many stores are there?", "db": "bookshop"}
        unsure = httpx.post(live.url + "/v1/queries", json=body, timeout=60).json()
        done = httpx.post(live.url + "/v1/queries", json={**body, "min_confidence": 0},
                          timeout=60).json()
        bad = httpx.post(live.url + "/v1/queries", json={**body, "min_confidence": -1},
                         timeout=60)
    assert done["status"] == "done" and done["confidence"]["level"] == "low"
    assert unsure["status"] == "unsure" and unsure["sql"] and unsure["rows"]
    assert bad.status_code == 422
