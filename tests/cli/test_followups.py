"""``agentflow ask`` as a user runs it, in real subprocesses with a scripted cluster (not a
model): ``--json`` has the conversation id, ``--conversation`` follows up across runs,
``--db`` may be left out when only one database is known, and a call re-run after a failed
attempt says so (CLI, ``--json`` and the Python ``Answer``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_library_sqlite

ROOT = Path(__file__).resolve().parents[2]
SQL = "SELECT count(*) FROM stores"
pytestmark = pytest.mark.timeout(120)


def _config(tmp_path: Path, *, flaky: bool = False, extra: str = "") -> Path:
    instances = ""
    if flaky:  # listed first, so an idle cluster dispatches to it first; it always fails
        instances += ("  - name: flaky\n    backend: {type: scripted, default: 'x', "
                      "faults: [{fail: true}]}\n")
    instances += f"  - name: good\n    backend: {{type: scripted, default: '{SQL}'}}\n"
    path = tmp_path / ("flaky.yaml" if flaky else "cluster.yaml")
    path.write_text(f"fewshot: null\npipeline: single\n{extra}instances:\n{instances}")
    return path


def _ask(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTFLOW_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agentflow", "ask", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90)


def test_json_has_the_conversation_and_a_later_run_follows_up(tmp_path) -> None:
    config = _config(tmp_path)
    trace = tmp_path / "trace.jsonl"
    first = _ask(tmp_path, "How many stores are there?", "--config", str(config), "--json")
    assert first.returncode == 0, first.stderr
    conversation = json.loads(first.stdout)["conversation_id"]
    assert conversation and conversation.startswith("c-")

    # another process: no --db (the conversation's), the earlier turn in the prompt
    again = _ask(tmp_path, "now only those in Lisbon", "--config", str(config), "--json",
                 "--conversation", conversation, "--record", str(trace))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["conversation_id"] == conversation
    record = json.loads(trace.read_text().splitlines()[-1])
    prompt = record["nodes"][0]["calls"][0]["prompt"]
    assert "Earlier in this conversation" in prompt
    assert f"-- Question: How many stores are there?\n{SQL};" in prompt

    human = _ask(tmp_path, "and in Porto?", "--config", str(config), "--conversation",
                 conversation)
    assert human.returncode == 0, human.stderr
    assert f"--conversation {conversation}" in human.stdout  # how to follow up


def test_unknown_conversation_is_a_clear_error(tmp_path) -> None:
    done = _ask(tmp_path, "and in Porto?", "--config", str(_config(tmp_path)),
                "--conversation", "c-000000000000")
    assert done.returncode == 2 and "unknown conversation" in done.stderr
    assert "Traceback" not in done.stderr


def test_db_may_be_left_out_only_when_one_database_is_known(tmp_path) -> None:
    archive = make_library_sqlite(tmp_path / "archive.sqlite")
    two = _config(tmp_path, extra=f"databases:\n  archive: {{url: 'sqlite:///{archive}'}}\n")
    refused = _ask(tmp_path, "How many books?", "--config", str(two))
    assert refused.returncode == 2 and "--db is required" in refused.stderr
    assert "archive" in refused.stderr and "bookshop" in refused.stderr


def test_a_retried_call_is_shown_in_the_cli_and_json(tmp_path) -> None:
    config = _config(tmp_path, flaky=True)
    as_json = _ask(tmp_path, "How many stores are there?", "--config", str(config), "--json")
    assert as_json.returncode == 0, as_json.stderr
    retries = json.loads(as_json.stdout)["retries"]
    assert retries and retries[0]["failed_on"] == "flaky" and retries[0]["rerun_on"] == "good"
    assert "injected fault" in retries[0]["error"]
    human = _ask(tmp_path, "How many stores are there?", "--config", str(config))
    assert human.returncode == 0, human.stderr
    assert "retried generate_sql: flaky failed" in " ".join(human.stdout.split())
    assert "re-run on good" in human.stdout


def test_the_python_answer_lists_retries(tmp_path) -> None:
    from agentflow.api import AgentFlow
    from agentflow.config import AgentFlowConfig
    from agentflow.llm.scripted import Fault, ScriptedBackend

    flaky = ScriptedBackend({}, default="x", faults=[Fault(fail=True)])
    good = ScriptedBackend({}, default=SQL)
    with AgentFlow(AgentFlowConfig(fewshot=None), backends={"flaky": flaky,
                                                            "good": good}) as af:
        answer = af.ask("How many stores are there?", db="bookshop", pipeline="single")
    assert answer.status == "done"
    assert [(r["failed_on"], r["rerun_on"]) for r in answer.retries] == [("flaky", "good")]
    assert answer.to_dict()["retries"] == answer.retries
    call = answer.stages[0]["llm_calls"][0]
    assert call["instance"] == "good" and call["failed_attempts"][0]["instance"] == "flaky"
