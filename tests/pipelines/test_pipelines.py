"""The pipelines end to end on the real demo database, with a scripted (not a model) backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.api import AgentFlow, InvalidRequest
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend
from agentflow.sql import DatabaseNotFoundError
from agentflow.workflow.trace import read_traces

GOOD = "SELECT count(*) FROM stores"
OTHER = "SELECT count(*) FROM customers"


def connect(script, **kwargs) -> AgentFlow:
    backend = ScriptedBackend(script, **kwargs)
    af = AgentFlow(AgentFlowConfig(fewshot=None), backends={"scripted-0": backend})
    af.test_backend = backend
    return af


def by_stage(answers: dict[str, object]):
    """A script answering by stage, with per-stage lists consumed in call order."""
    queues = {k: list(v) if isinstance(v, list) else v for k, v in answers.items()}

    def script(request):
        value = queues[request.stage]
        if isinstance(value, list):
            return value.pop(0) if len(value) > 1 else value[0]
        return value
    return script


def test_single_is_one_call_and_returns_rows() -> None:
    with connect(by_stage({"generate_sql": GOOD})) as af:
        answer = af.ask("How many stores are there?", db="bookshop", slo=30, pipeline="single")
    assert answer.status == "done" and answer.error is None
    assert answer.sql == GOOD and answer.rows == [[12]] and answer.columns == ["count(*)"]
    assert answer.usage["calls"] == 1
    assert [s["node_id"] for s in answer.stages] == ["generate_sql", "execute"]
    call = answer.stages[0]["llm_calls"][0]
    assert call["instance"] == "scripted-0" and call["queue_s"] >= 0 and call["run_s"] >= 0
    assert answer.met_slo is True


def test_chess_revises_failing_candidates_and_selects_by_result() -> None:
    script = by_stage({
        "extract_keywords": "stores, number",
        # candidate 0 fails (unknown column), 1 and 2 agree
        "generate_candidate": ["SELECT count(nope) FROM stores", GOOD, GOOD],
        "revise": GOOD,
    })
    with connect(script) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "done", answer.error
    assert answer.rows == [[12]]
    ids = [s["node_id"] for s in answer.stages]
    assert "revise.0.1" in ids and "execute.0.1" in ids  # grown at run time
    assert "generate_unit_tests" not in ids  # all candidates agree after revision
    select = next(s for s in answer.stages if s["node_id"] == "select")
    assert set(select["parents"]) == {"execute.0.0", "execute.0.1", "execute.1.0", "execute.2.0"}
    usage = answer.usage["by_stage"]
    assert usage["generate_candidate"]["calls"] == 3 and usage["revise"]["calls"] == 1
    assert usage["extract_keywords"]["calls"] == 1
    # the three candidates ran concurrently: each started before any of them finished
    cands = [s for s in answer.stages if s["stage"] == "generate_candidate"]
    assert max(s["start"] for s in cands) <= min(s["end"] for s in cands)


def test_chess_writes_unit_tests_when_candidates_disagree() -> None:
    script = by_stage({
        "extract_keywords": "stores",
        "generate_candidate": [OTHER, GOOD, GOOD],
        "generate_unit_test": " the result is one number\n-- Check 2: the number is below 100",
    })

    def judge(request):
        if request.stage == "evaluate":
            return " yes" if "FROM stores" in request.prompt.split("Candidate SQL:")[1] else " no"
        return script(request)

    with connect(judge) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "done"
    assert answer.sql == GOOD
    assert answer.details["unit_tests"] == ["the result is one number", "the number is below 100"]
    assert answer.usage["by_stage"]["evaluate"]["calls"] == 2  # one per result cluster
    assert [s["node_id"] for s in answer.stages][-1] == "choose"


def test_sql_that_never_executes_ends_with_a_clear_reason() -> None:
    bad = "SELECT missing_col FROM nowhere"
    revisions = iter(f"SELECT c{i} FROM nowhere" for i in range(100))

    def script(request):
        if request.stage == "revise":
            return next(revisions)
        return {"extract_keywords": "x", "generate_candidate": bad}[request.stage]

    with connect(script) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "failed"
    assert "no candidate SQL executes after 2 revision rounds" in answer.error
    assert "nowhere" in answer.error
    assert answer.usage["by_stage"]["revise"]["calls"] == 3 * 2  # k rounds per candidate
    assert answer.rows == []


def test_a_revision_that_repeats_itself_ends_the_loop() -> None:
    bad = "SELECT missing_col FROM nowhere"
    with connect(by_stage({"extract_keywords": "x", "generate_candidate": bad,
                           "revise": bad})) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "failed"
    assert answer.usage["by_stage"]["revise"]["calls"] == 3  # one round each, not k


def test_a_backend_dying_mid_query_fails_the_query_with_its_reason() -> None:
    with connect(by_stage({"extract_keywords": "stores", "generate_candidate": GOOD}),
                 fail_after=2) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="chess")
    assert answer.status == "failed"
    assert "LLM backend error" in answer.error and "generate_candidate" in answer.error
    assert any(s["status"] == "cancelled" for s in answer.stages)


def test_macsql_selects_tables_then_refines_until_the_sql_runs() -> None:
    script = by_stage({
        "selector": " stores, employees",
        "decomposer": " how many stores?\n-- SQL:\nSELECT count(*) FROM store",
        "refine": GOOD,
    })
    with connect(script) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="macsql")
    assert answer.status == "done" and answer.rows == [[12]]
    assert [s["node_id"] for s in answer.stages] == [
        "selector", "decomposer", "execute.0.0", "refine.0.1", "execute.0.1", "finalize"]
    assert answer.stages[0]["kind"] == "llm" and answer.stages[0]["summary"] == "stores, employees"
    decomposer_prompt = af.test_backend.calls[1].prompt
    assert "CREATE TABLE stores" in decomposer_prompt
    assert "CREATE TABLE reviews" not in decomposer_prompt  # pruned by the selector


def test_macsql_skips_the_selector_on_small_schemas(library_db: Path) -> None:
    script = by_stage({"decomposer": " count books\n-- SQL:\nSELECT count(*) FROM book"})
    with connect(script) as af:
        answer = af.ask("How many books?", db=str(library_db), pipeline="macsql")
    assert answer.status == "done" and answer.rows == [[4]] and answer.db == "library"
    assert answer.stages[0]["kind"] == "tool" and answer.usage["calls"] == 1


def test_bad_input_is_rejected_with_a_clear_error() -> None:
    with connect(by_stage({"generate_sql": GOOD})) as af:
        with pytest.raises(DatabaseNotFoundError, match="did you mean bookshop"):
            af.ask("How many?", db="bookshp")
        with pytest.raises(InvalidRequest, match="empty"):
            af.ask("   ", db="bookshop")
        with pytest.raises(InvalidRequest, match="slo"):
            af.ask("How many?", db="bookshop", slo=-1)
        with pytest.raises(InvalidRequest, match="unknown pipeline"):
            af.ask("How many?", db="bookshop", pipeline="nope")
        assert af.test_backend.calls == []


def test_trace_records_the_dag_with_tokens_text_and_timings(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    with connect(by_stage({"extract_keywords": "stores", "generate_candidate": GOOD})) as af:
        af.ask("How many stores are there?", db="bookshop", pipeline="chess", record=trace)
    [rec] = read_traces(trace)
    assert rec["format"] == "agentflow-trace/1" and rec["status"] == "done"
    assert rec["pipeline"]["name"] == "chess" and rec["pipeline"]["n_candidates"] == 3
    nodes = {n["id"]: n for n in rec["nodes"]}
    assert nodes["retrieve_values"]["parents"] == ["extract_keywords"]
    assert nodes["retrieve_values"]["kind"] == "tool" and nodes["retrieve_values"]["end"] >= 0
    call = nodes["generate_candidate.1"]["calls"][0]
    assert call["output"] == GOOD and call["prompt"].endswith("SELECT")
    assert call["prompt_tokens"] > 0 and call["completion_tokens"] > 0
    json.dumps(rec)


def test_submit_streams_stage_events_and_cancel_stops_the_query() -> None:
    import time

    with connect(by_stage({"extract_keywords": "stores", "generate_candidate": GOOD,
                           "generate_sql": GOOD}), latency_s=0.5) as af:
        seen = []
        handle = af.submit("How many stores are there?", db="bookshop", pipeline="chess")
        assert handle.query_id.startswith("q-") and handle.db == "bookshop"
        handle.subscribe(seen.append)
        deadline = time.monotonic() + 60  # a ceiling on an observed event, not a timing
        while not any(e["type"] == "stage_started" for e in handle.events):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert af.cancel(handle.query_id)
        answer = handle.result(timeout=60)
        assert answer.status == "cancelled" and answer.error == "cancelled by request"
        assert seen[-1]["type"] == "done" and seen[-1]["status"] == "cancelled"
        assert not af.cancel(handle.query_id)  # already finished
        assert af.router.coordinator.queries == {}  # nothing left in the scheduler
        done = af.submit("How many stores are there?", db="bookshop", pipeline="single")
        events = done.result(timeout=60) and done.events
        kinds = [e["type"] for e in events]
        assert kinds[0] == "stage_started" and kinds[-1] == "done"
        finished = [e for e in events if e["type"] == "stage_finished"]
        assert finished[0]["node_id"] == "generate_sql" and finished[0]["instance"] == "scripted-0"


def test_graceful_close_cancels_what_is_still_running() -> None:
    af = connect(by_stage({"generate_sql": GOOD}), latency_s=2.0)
    handle = af.submit("How many stores are there?", db="bookshop", pipeline="single")
    af.close(drain_s=0.1)
    answer = handle.result(timeout=1)
    assert answer.status == "cancelled" and "shutting down" in answer.error
    with pytest.raises(RuntimeError, match="closed|shutting down"):
        af.submit("How many stores are there?", db="bookshop")
