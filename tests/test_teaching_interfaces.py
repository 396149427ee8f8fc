"""Teaching end to end through the CLI (a real subprocess), HTTP (a real server on loopback)
and MCP (the real ``agentflow mcp`` process and the SDK's client). The instances are the
scripted backend (not a model); the taught pair is checked in the recorded prompt."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
Q = "How many distinct cities have a store?"
SQL = "SELECT count(DISTINCT city) FROM stores"
pytestmark = pytest.mark.timeout(120)


def _prompts(trace: Path) -> list[str]:
    out = []
    for line in trace.read_text().splitlines():
        for node in json.loads(line)["nodes"]:
            out += [c.get("prompt") or "" for c in node.get("calls", ())]
    return out


def _cli(*args: str, store: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AGENTFLOW_TEACHING": str(store), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "agentflow", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_teach_list_delete_and_the_pair_reaches_the_prompt(tmp_path) -> None:
    store = tmp_path / "t.sqlite"
    done = _cli("teach", "--db", "bookshop", Q, SQL, "--json", store=store)
    assert done.returncode == 0, done.stderr
    taught = json.loads(done.stdout)[0]
    assert taught["question"] == Q and taught["sql"] == SQL
    bad = _cli("teach", "--db", "bookshop", "How many?", "UPDATE stores SET city = 'x'",
               store=store)
    assert bad.returncode == 2 and "read-only" in bad.stderr and "Traceback" not in bad.stderr
    listed = json.loads(_cli("teach", "--db", "bookshop", "--list", "--json",
                             store=store).stdout)
    assert Q in [e["question"] for e in listed]
    term = _cli("glossary", "--db", "bookshop", "flagship store",
                "the store with the largest floor_area_m2", store=store)
    assert term.returncode == 0, term.stderr
    assert "flagship store" in _cli("glossary", "--db", "bookshop", "--list",
                                    store=store).stdout

    # the same store, read by the Python API as a server or `agentflow ask` would
    from agentflow.api import AgentFlow
    from agentflow.config import AgentFlowConfig
    from agentflow.llm.scripted import ScriptedBackend

    trace = tmp_path / "trace.jsonl"
    config = AgentFlowConfig(fewshot=None, teaching_store=str(store))
    with AgentFlow(config, backends={"s": ScriptedBackend({}, default=SQL)}) as af:
        af.ask("How many cities have a flagship store?", db="bookshop", pipeline="single",
               record=trace)
    prompt = _prompts(trace)[0]
    assert f"-- Question: {Q}\n{SQL};" in prompt
    assert "-- flagship store: the store with the largest floor_area_m2" in prompt

    gone = _cli("teach", "--db", "bookshop", "--delete", str(taught["id"]), store=store)
    assert gone.returncode == 0, gone.stderr
    again = _cli("teach", "--db", "bookshop", "--delete", str(taught["id"]), store=store)
    assert again.returncode == 2 and "no taught pair" in again.stderr


def test_http_examples_and_glossary_routes_on_a_real_server(tmp_path) -> None:
    pytest.importorskip("fastapi")
    import httpx

    from agentflow.server.testing import LiveServer, scripted_instance

    trace = tmp_path / "trace.jsonl"
    config = {"instances": [scripted_instance("s-0")], "teaching_store": str(tmp_path / "t.db"),
              "record": str(trace), "pipeline": "single"}
    with LiveServer(config) as live:
        base = f"{live.url}/v1/databases/bookshop"
        r = httpx.post(f"{base}/examples", json={"question": Q, "sql": SQL})
        assert r.status_code == 201, r.text
        taught = r.json()
        assert taught["sql"] == SQL and taught["db"] == "bookshop"
        assert Q in [e["question"] for e in httpx.get(f"{base}/examples").json()["examples"]]

        bad = httpx.post(f"{base}/examples", json={"question": "x", "sql": "DROP TABLE stores"})
        assert bad.status_code == 422 and "read-only" in bad.json()["error"]["message"]
        wrong = httpx.post(f"{base}/examples", json={"question": "x",
                                                     "sql": "SELECT nope FROM stores"})
        assert wrong.status_code == 422 and "nope" in wrong.json()["error"]["message"]
        unknown = httpx.post(f"{live.url}/v1/databases/nosuch/examples",
                             json={"question": "x", "sql": "SELECT 1"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == \
            "unknown_database"
        path = httpx.post(f"{live.url}/v1/databases/%2Fetc%2Fpasswd.sqlite/examples",
                          json={"question": "x", "sql": "SELECT 1"})
        assert path.status_code == 404

        t = httpx.post(f"{base}/glossary", json={"term": "flagship store",
                                                 "meaning": "the largest store by floor area"})
        assert t.status_code == 201, t.text
        assert "flagship store" in [g["term"] for g in
                                    httpx.get(f"{base}/glossary").json()["glossary"]]

        answer = httpx.post(f"{live.url}/v1/queries", timeout=30, json={
            "question": "How many cities have a flagship store?", "db": "bookshop"})
        assert answer.status_code == 200, answer.text
        prompt = _prompts(trace)[-1]
        assert f"-- Question: {Q}\n{SQL};" in prompt
        assert "-- flagship store: the largest store by floor area" in prompt

        assert httpx.delete(f"{base}/examples/{taught['id']}").json() == {"deleted":
                                                                          taught["id"]}
        assert httpx.delete(f"{base}/examples/{taught['id']}").status_code == 404
        assert httpx.delete(f"{base}/glossary/flagship store").status_code == 200
        assert httpx.delete(f"{base}/glossary/flagship store").status_code == 404
        assert Q not in [e["question"] for e in httpx.get(f"{base}/examples").json()["examples"]]


def test_mcp_teach_list_forget_and_version(tmp_path) -> None:
    pytest.importorskip("mcp")
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from agentflow import __version__

    trace = tmp_path / "trace.jsonl"
    config = tmp_path / "scripted.yaml"
    config.write_text(
        f"fewshot: null\npipeline: single\nrecord: {trace}\nteaching_store: {tmp_path / 't.db'}\n"
        "instances:\n  - name: scripted-0\n    backend:\n      type: scripted\n"
        f"      default: {SQL}\n")
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "agentflow.cli.main", "mcp", "--config",
                                      str(config)],
        cwd=str(ROOT), env={"PYTHONPATH": str(ROOT), "AGENTFLOW_TEACHING": str(tmp_path / "x")})

    async def session():
        async with Client(params, read_timeout_seconds=60) as client:
            info = client.server_info
            taught = await client.call_tool("teach", {"db": "bookshop", "question": Q,
                                                      "sql": SQL})
            refused = await client.call_tool("teach", {"db": "bookshop", "question": "x",
                                                       "sql": "DELETE FROM stores"})
            term = await client.call_tool("teach", {"db": "bookshop", "term": "flagship store",
                                                    "meaning": "the largest store"})
            listed = await client.call_tool("list_taught", {"db": "bookshop"})
            asked = await client.call_tool("ask", {"question": "How many cities have a "
                                                               "flagship store?",
                                                   "db": "bookshop"})
            example_id = taught.structured_content["example"]["id"]
            forgot = await client.call_tool("forget_taught", {"db": "bookshop",
                                                              "example_id": example_id})
            again = await client.call_tool("forget_taught", {"db": "bookshop",
                                                             "example_id": example_id})
            return info, taught, refused, term, listed, asked, forgot, again

    info, taught, refused, term, listed, asked, forgot, again = asyncio.run(session())
    assert info.version == __version__ and info.version
    assert not taught.is_error and taught.structured_content["example"]["sql"] == SQL
    assert refused.is_error and "read-only" in refused.content[0].text
    assert not term.is_error
    content = listed.structured_content
    assert Q in [e["question"] for e in content["examples"]]
    assert "flagship store" in [g["term"] for g in content["glossary"]]
    assert asked.structured_content["status"] == "done"
    prompt = _prompts(trace)[-1]
    assert f"-- Question: {Q}\n{SQL};" in prompt and "-- flagship store: the largest store" \
        in prompt
    assert not forgot.is_error and again.is_error


def test_http_teaching_per_tenant_with_api_keys(tmp_path) -> None:
    """With keys, each tenant teaches its own pairs: the other tenant neither sees nor gets
    them, may not delete them, and a database outside a key's list is a 404 here too."""
    pytest.importorskip("fastapi")
    import httpx

    from agentflow.api import AgentFlow
    from agentflow.config import AgentFlowConfig
    from agentflow.llm.scripted import ScriptedBackend
    from agentflow.server.testing import LiveServer
    from tests.conftest import make_library_sqlite

    prompts: list[str] = []

    def script(request) -> str:
        prompts.append(request.prompt)
        return SQL
    library = make_library_sqlite(tmp_path / "library.sqlite")
    config = AgentFlowConfig(fewshot=None, pipeline="single", teaching_store=str(tmp_path / "t"),
                             databases={"library": {"url": f"sqlite:///{library}"}})
    keys = {"acme": "acme-key-0001", "bolt": "bolt-key-0002", "narrow": "narrow-key-0003"}
    settings = {"tenants": [{"name": n, "keys": [k]} for n, k in keys.items() if n != "narrow"]
                + [{"name": "narrow", "keys": [keys["narrow"]], "databases": ["library"]}]}

    def h(name: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {keys[name]}"}
    with AgentFlow(config, backends={"s": ScriptedBackend(script)}) as af, \
            LiveServer({}, settings, agentflow=af) as live:
        base = f"{live.url}/v1/databases/bookshop"
        assert httpx.post(f"{base}/examples", json={"question": Q, "sql": SQL}).status_code \
            == 401
        taught = httpx.post(f"{base}/examples", json={"question": Q, "sql": SQL},
                            headers=h("acme"))
        assert taught.status_code == 201 and taught.json()["tenant"] == "acme"
        mine = [e["question"] for e in httpx.get(f"{base}/examples",
                                                  headers=h("acme")).json()["examples"]]
        theirs = [e["question"] for e in httpx.get(f"{base}/examples",
                                                    headers=h("bolt")).json()["examples"]]
        assert Q in mine and Q not in theirs
        assert "How many books are there?" in theirs  # the shared (shipped) pairs: everyone
        assert httpx.delete(f"{base}/examples/{taught.json()['id']}",
                            headers=h("bolt")).status_code == 404
        assert httpx.get(f"{base}/examples", headers=h("narrow")).status_code == 404

        for who, sees_it in (("acme", True), ("bolt", False)):
            prompts.clear()
            r = httpx.post(f"{live.url}/v1/queries", headers=h(who), timeout=30,
                           json={"question": "How many cities have stores?", "db": "bookshop"})
            assert r.status_code == 200, r.text
            assert (f"-- Question: {Q}\n{SQL};" in prompts[-1]) is sees_it, who
