"""``Answer.to_dict`` is ``dataclasses.asdict`` plus two derived fields, built faster: the same
value for a real CHESS answer (scripted backend, demo database), nothing shared with the
answer, and the uncommon types (a dataclass, a set, a date inside ``details``) still
converted or copied as ``asdict`` does."""

from __future__ import annotations

import dataclasses
from datetime import date

from agentflow.api import AgentFlow, Answer
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend


def expected(answer: Answer) -> dict:
    d = dataclasses.asdict(answer)
    d["met_slo"] = answer.met_slo
    d["retries"] = answer.retries
    return d


def test_a_real_answer_is_what_asdict_gives_and_shares_nothing(tmp_path) -> None:
    config = AgentFlowConfig(fewshot=None, teaching_store=str(tmp_path / "t.sqlite"))
    script = {"extract_keywords": "stores", "generate_candidate": "SELECT city FROM stores"}
    backend = ScriptedBackend(lambda r: script.get(r.stage, "SELECT city FROM stores"))
    with AgentFlow(config, backends={"s": backend}) as af:
        answer = af.ask("Which cities have a store?", db="bookshop", pipeline="chess")
    assert answer.status == "done", answer.error
    assert answer.rows and answer.stages and answer.details
    d = answer.to_dict()
    assert d == expected(answer)
    d["rows"][0][0] = "changed"
    d["stages"][0]["stage"] = "changed"
    d["details"]["added"] = True
    assert d != expected(answer)
    assert answer.rows[0][0] != "changed" and answer.stages[0]["stage"] != "changed"
    assert "added" not in answer.details


@dataclasses.dataclass
class Inner:
    n: int
    tags: list[str]


def test_uncommon_values_are_converted_as_asdict_converts_them() -> None:
    answer = Answer(query_id="q", question="?", db="d", pipeline="chess", status="done",
                    error=None, sql="SELECT 1", rows=[[1, date(2026, 12, 7), (2, 3)]],
                    details={"inner": Inner(1, ["x"]), "set": {1, 2},
                             "nested": ({"k": [Inner(2, [])]},)})
    d = answer.to_dict()
    assert d == expected(answer)
    assert d["details"]["inner"] == {"n": 1, "tags": ["x"]}
    assert d["details"]["set"] is not answer.details["set"]
    assert d["details"]["nested"][0]["k"][0] == {"n": 2, "tags": []}
