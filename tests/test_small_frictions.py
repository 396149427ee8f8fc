"""Small frictions a new user met: the SLO's two names, the serve log's database line."""

from __future__ import annotations

import pytest

from agentflow.api import AgentFlow, InvalidRequest
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend


def test_http_takes_slo_and_slo_seconds_alike() -> None:
    pytest.importorskip("fastapi")
    from pydantic import ValidationError

    from agentflow.server.models import QueryRequest

    body = {"question": "How many stores?", "db": "bookshop"}
    assert QueryRequest.model_validate({**body, "slo": 30}).slo_seconds == 30
    assert QueryRequest.model_validate({**body, "slo_seconds": 30}).slo_seconds == 30
    assert QueryRequest.model_validate({**body, "slo": 30, "slo_seconds": 30}).slo_seconds == 30
    with pytest.raises(ValidationError, match="given twice"):
        QueryRequest.model_validate({**body, "slo": 30, "slo_seconds": 10})
    with pytest.raises(ValidationError, match="positive"):
        QueryRequest.model_validate({**body, "slo": -1})


def test_python_takes_slo_seconds_too() -> None:
    backend = ScriptedBackend({}, default="SELECT count(*) FROM stores")
    with AgentFlow(AgentFlowConfig(fewshot=None), backends={"s": backend}) as af:
        answer = af.ask("How many stores?", db="bookshop", pipeline="single", slo_seconds=60)
        assert answer.slo_s == 60
        with pytest.raises(InvalidRequest, match="given twice"):
            af.ask("How many stores?", db="bookshop", slo=5, slo_seconds=60)


def test_cli_takes_slo_seconds_too() -> None:
    from agentflow.cli.main import build_parser

    args = build_parser().parse_args(["ask", "How many?", "--slo-seconds", "12"])
    assert args.slo == 12.0


def test_the_serve_log_names_a_few_databases_not_all() -> None:
    from agentflow.cli.serve import databases_line

    ids = [f"db_{i:03d}" for i in range(135)] + ["bookshop"]
    line = databases_line(ids)
    assert line.startswith("136 databases: bookshop, db_000")
    assert "and 128 more" in line and "db_100" not in line
    assert databases_line(["bookshop"]) == "1 database: bookshop"
