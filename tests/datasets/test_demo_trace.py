"""The trace that ships with the project (databases/demo/trace.jsonl): recorded by agentflow
itself on the demo database, so `agentflow simulate` and the simulated eval run from a fresh
clone, without ../shared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.cli.main import main
from agentflow.datasets.demo import DEMO_DB_ID, QUESTIONS_FILE, TRACE_FILE
from agentflow.evaluation import run_eval
from agentflow.sim.workload import load_trace


def test_the_shipped_trace_is_an_agentflow_recording_of_demo_questions() -> None:
    lines = [json.loads(line) for line in TRACE_FILE.read_text().splitlines() if line.strip()]
    assert len(lines) >= 10
    asked = {q["question"] for q in json.loads(QUESTIONS_FILE.read_text())}
    for rec in lines:
        assert rec["format"] == "agentflow-trace/1"
        assert rec["db_id"] == DEMO_DB_ID and rec["question"] in asked
        assert rec["pipeline"]["name"] == "chess"
    queries = load_trace(TRACE_FILE)
    assert len(queries) == len(lines)
    for q in queries:  # real calls: every LLM stage has measured tokens
        llm = [n for n in q.nodes if n.kind == "llm"]
        assert llm and all(n.prompt_tokens > 0 for n in llm)
        assert sum(n.output_tokens for n in llm) > 0


def test_simulate_without_a_trace_replays_the_shipped_one(tmp_path: Path, capsys) -> None:
    out = tmp_path / "sim.json"
    assert main(["simulate", "--cluster", "paper-4gpu", "--policy", "vllm,flowsage",
                 "--queries", "12", "--rate", "0.05", "--json", str(out)]) == 0
    assert "demo trace" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["config"]["trace"] == str(TRACE_FILE)
    for policy in ("vllm", "flowsage"):
        run = result["policies"][policy]
        assert run["queries"] == 12 and run["p50"] > 0


def test_simulate_says_what_to_do_when_the_shipped_trace_is_missing(monkeypatch, capsys) -> None:
    import agentflow.datasets.demo as demo

    monkeypatch.setattr(demo, "TRACE_FILE", Path("/nonexistent/trace.jsonl"))
    with pytest.raises(SystemExit):
        main(["simulate", "--cluster", "paper-4gpu"])
    assert "give --trace FILE" in capsys.readouterr().err


def test_the_simulated_eval_judges_the_shipped_trace(tmp_path: Path) -> None:
    """The README's eval example on a fresh clone: the demo's recorded chess answers judged
    against the demo's gold SQL, replayed on a simulated cluster."""
    summary = run_eval("demo", out=tmp_path / "eval", cluster="paper-4gpu", traces=TRACE_FILE,
                       policies="flowsage", rate=0.05, progress=False, plots=False)
    run = summary["runs"]["chess__flowsage"]
    assert run["questions"] == 12
    # judged afresh against the gold SQL: the tiny model's recorded answers are all wrong,
    # as the real run that recorded them judged them (0 of 12)
    assert run["accuracy"]["accuracy"] == 0.0
    assert (tmp_path / "eval" / "simulated-paper-4gpu" / "report.md").is_file()
