"""``agentflow mcp`` against the official MCP SDK's own client, over stdio and streamable HTTP.

The server is the real process (``python -m agentflow.cli.main mcp``); its one instance is
the scripted backend (the project's test backend, not a model), so answers are fast and
fixed. The stdio session is written to ``artifacts/mcp-transcript.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp")
from mcp import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from tests.mcp.utils import mcp_http_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mcp") / "scripted.yaml"
    path.write_text(
        "fewshot: null\npipeline: chess\ninstances:\n  - name: scripted-0\n    backend:\n"
        "      type: scripted\n      answers: {extract_keywords: stores}\n"
        "      default: SELECT count(*) FROM stores\n")
    return path


def _dump(result) -> dict:
    return {"is_error": result.is_error, "structured": result.structured_content,
            "text": [getattr(c, "text", None) for c in result.content]}


async def _session(client, transcript: list) -> dict:
    tools = await client.list_tools()
    names = sorted(t.name for t in tools.tools)
    transcript.append({"request": "tools/list", "response": names})
    calls = [("list_databases", {}),
             ("describe_database", {"db": "bookshop"}),
             ("ask", {"question": "How many stores are there?", "db": "bookshop",
                      "slo_seconds": 60}),
             ("run_sql", {"db": "bookshop", "sql": "SELECT city, count(*) FROM stores "
                                                   "GROUP BY city ORDER BY 2 DESC LIMIT 3"}),
             ("run_sql", {"db": "bookshop", "sql": "DELETE FROM stores"}),
             ("ask", {"question": "How many stores?", "db": "nosuchdb"})]
    results = {"tools": names}
    for i, (name, args) in enumerate(calls):
        result = await client.call_tool(name, args)
        transcript.append({"request": f"tools/call {name}", "arguments": args,
                           "response": _dump(result)})
        results[f"{i}:{name}"] = result
    return results


def _check(results: dict) -> None:
    assert results["tools"] == ["ask", "describe_database", "forget_taught", "list_databases",
                                "list_taught", "run_sql", "teach"]
    dbs = results["0:list_databases"].structured_content
    assert [d["id"] for d in dbs["databases"]] == ["bookshop"]
    assert "stores" in dbs["databases"][0]["tables"]
    schema = results["1:describe_database"].structured_content
    stores = next(t for t in schema["tables"] if t["name"] == "stores")
    assert {"name": "store_id", "type": "INTEGER", "primary_key": True} in stores["columns"]
    answer = results["2:ask"]
    assert not answer.is_error
    a = answer.structured_content
    assert a["status"] == "done" and a["sql"] == "SELECT count(*) FROM stores"
    assert a["rows"] == [[12]] and a["columns"] == ["count(*)"]
    assert a["conversation_id"] and a["llm_calls"] >= 4
    stages = {s["stage"] for s in a["timeline"]}
    assert {"extract_keywords", "select"} <= stages
    assert all(s["instances"] == ["scripted-0"] for s in a["timeline"] if s["kind"] == "llm")
    rows = results["3:run_sql"].structured_content
    assert rows["rows"][0] == ["Lisbon", 2] and len(rows["rows"]) == 3
    refused = results["4:run_sql"]
    assert refused.is_error and "SELECT" in refused.content[0].text
    unknown = results["5:ask"]
    assert unknown.is_error and "bookshop" in unknown.content[0].text


def test_stdio_session_with_the_sdk_client(config) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agentflow.cli.main", "mcp", "--config",
                                      str(config)],
        cwd=str(ROOT), env={"PYTHONPATH": str(ROOT)})
    transcript: list = []

    async def main():
        async with Client(params, read_timeout_seconds=60) as client:
            return await _session(client, transcript)

    results = asyncio.run(main())
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "mcp-transcript.json").write_text(json.dumps(transcript, indent=1,
                                                              default=str))
    _check(results)


def test_streamable_http_session_with_the_sdk_client(config) -> None:
    pytest.importorskip("uvicorn")
    with mcp_http_server(config, os.environ) as url:

        async def main():
            async with Client(url, read_timeout_seconds=60) as c:
                return await _session(c, [])

        _check(asyncio.run(main()))


def test_list_databases_names_tables_and_engine_of_a_configured_database(library_db,
                                                                        tmp_path) -> None:
    """A database from ``databases:`` (a URL, no benchmark metadata) is listed with the
    tables its schema has and the engine it runs on, as the HTTP API lists it."""
    from agentflow.api import AgentFlow
    from agentflow.config import AgentFlowConfig
    from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb
    from agentflow.llm.scripted import ScriptedBackend
    from agentflow.mcp.server import AgentflowTools

    duck = tmp_path / "library.duckdb"
    convert_sqlite_to_duckdb(library_db, duck)
    config = AgentFlowConfig(fewshot=None, databases={"lib": {"url": f"duckdb:///{duck}"}})
    with AgentFlow(config, backends={"cpu-0": ScriptedBackend(lambda r: "SELECT 1")}) as af:
        listed = {d["id"]: d for d in AgentflowTools(af).list_databases()["databases"]}
        assert listed["lib"]["engine"] == "duckdb" and af.catalog.engine == "sqlite"
        assert sorted(listed["lib"]["tables"]) == sorted(
            af.catalog.open("lib").schema().table_names)
        assert "book" in listed["lib"]["tables"]
