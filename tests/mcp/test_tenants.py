"""MCP over HTTP under the HTTP API's keys and tenant rules (issue 20 §1): the real
``agentflow mcp --http`` process, the official SDK's client. No key or a wrong key: 401
before MCP; a tenant cannot follow up on another's conversation (the same error as an
unknown one), sees only its databases, and is held to its rate limit. The instance is
scripted (not a model)."""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("mcp")
httpx = pytest.importorskip("httpx")
from mcp import Client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from mcp.shared._httpx_utils import create_mcp_http_client  # noqa: E402

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.mcp.server import AgentflowTools  # noqa: E402
from agentflow.tenants import LimitExceeded, Tenant  # noqa: E402
from tests.mcp.utils import mcp_http_server  # noqa: E402

pytestmark = pytest.mark.timeout(120)
KEYS = {"acme": "mcp-acme-key-1", "bolt": "mcp-bolt-key-2", "narrow": "mcp-narrow-key-3",
        "metered": "mcp-metered-key-4", "ops": "mcp-admin-key-5", "envops": "mcp-env-admin-6"}
CONFIG = f"""
fewshot: null
pipeline: single
instances:
  - name: scripted-0
    backend: {{type: scripted, answers: {{extract_keywords: stores}},
               default: SELECT count(*) FROM stores}}
server:
  admin_keys: [{KEYS["ops"]}]
  admin_rate_per_min: 1
  tenants:
    - {{name: acme, keys: [{KEYS["acme"]}]}}
    - {{name: bolt, keys: [{KEYS["bolt"]}]}}
    - {{name: narrow, keys: [{KEYS["narrow"]}], databases: [elsewhere]}}
    - {{name: metered, keys: [{KEYS["metered"]}], rate_per_min: 1}}
"""


@pytest.fixture(scope="module")
def mcp_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("mcp-tenants") / "serve.yaml"
    path.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTFLOW_")}
    with mcp_http_server(path, {**env, "AGENTFLOW_ADMIN_KEYS": KEYS["envops"]}) as url:
        yield url


def session(url: str, who: str, calls: list[tuple[str, dict]]) -> list:
    async def main():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {KEYS[who]}"})
        async with Client(streamable_http_client(url, http_client=http),
                          read_timeout_seconds=60) as client:
            return [await client.call_tool(name, args) for name, args in calls]
    return asyncio.run(main())


def text_of(result) -> str:
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_no_key_or_a_wrong_key_is_401_before_mcp(mcp_url) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for extra in ({}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"}):
        r = httpx.post(mcp_url, json=body, headers={**headers, **extra}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", extra


def test_tenants_over_mcp_keep_to_their_own(mcp_url) -> None:
    asked = "How many stores are there?"
    (first,) = session(mcp_url, "acme", [("ask", {"question": asked, "db": "bookshop"})])
    assert not first.is_error, text_of(first)
    cid = first.structured_content["conversation_id"]

    theirs, unknown = session(mcp_url, "bolt", [
        ("ask", {"question": "and in Lisbon?", "db": "bookshop", "conversation_id": cid}),
        ("ask", {"question": "and in Lisbon?", "db": "bookshop",
                 "conversation_id": "c-000000000000"})])
    assert theirs.is_error and unknown.is_error
    assert "ConversationNotFoundError" in text_of(theirs)
    assert text_of(theirs).replace(cid, "ID") == text_of(unknown).replace("c-000000000000",
                                                                           "ID")
    (own,) = session(mcp_url, "acme", [("ask", {"question": "and in Lisbon?", "db": "bookshop",
                                                "conversation_id": cid})])
    assert not own.is_error and own.structured_content["conversation_id"] == cid

    listed, hidden, missing, sql = session(mcp_url, "narrow", [
        ("list_databases", {}), ("describe_database", {"db": "bookshop"}),
        ("describe_database", {"db": "nosuchdb"}),
        ("run_sql", {"db": "bookshop", "sql": "SELECT count(*) FROM stores"})])
    assert listed.structured_content["databases"] == []
    assert hidden.is_error and sql.is_error and missing.is_error
    assert text_of(hidden).replace("bookshop", "X") == text_of(missing).replace("nosuchdb", "X")

    ok, limited = session(mcp_url, "metered", [
        ("run_sql", {"db": "bookshop", "sql": "SELECT count(*) FROM stores"}),
        ("ask", {"question": asked, "db": "bookshop"})])
    assert not ok.is_error and ok.structured_content["rows"] == [[12]]
    assert limited.is_error and "rate limit" in text_of(limited)
    assert "retry after" in text_of(limited)


@pytest.mark.parametrize("who", ["ops", "envops"])
def test_admin_keys_are_held_to_the_admin_limits(mcp_url, who: str) -> None:
    """Admins are limited on the standalone MCP server too (``admin_rate_per_min`` and
    ``admin_max_concurrent`` of the config's server section, for configured admin keys and
    those of ``AGENTFLOW_ADMIN_KEYS``): an admin key flooding took B's P95 to 44 s when
    admins had no limits. An admin still reads the engine's catalog."""
    catalog, limited, teach = session(mcp_url, who, [
        ("run_sql", {"db": "bookshop", "sql": "SELECT file FROM pragma_database_list"}),
        ("run_sql", {"db": "bookshop", "sql": "SELECT count(*) FROM stores"}),
        ("teach", {"db": "bookshop", "question": "How many stores?",
                   "sql": "SELECT count(*) FROM stores"})])
    assert not catalog.is_error, text_of(catalog)
    assert str(catalog.structured_content["rows"][0][0]).endswith(".sqlite")
    assert limited.is_error and "rate limit" in text_of(limited), text_of(limited)
    assert teach.is_error and "rate limit" in text_of(teach), text_of(teach)


def test_a_session_answers_only_the_key_that_opened_it(mcp_url) -> None:
    """Issue 35 §6: with acme's session id, bolt's key can neither read the session's event
    stream nor end it (404, as for an unknown session); acme's own key still can."""
    accept = {"Accept": "application/json, text/event-stream"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    opened = httpx.post(mcp_url, json=body, headers={
        **accept, "Authorization": f"Bearer {KEYS['acme']}"}, timeout=30)
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]

    def as_(who: str, extra: dict | None = None) -> dict:
        return {**accept, "Authorization": f"Bearer {KEYS[who]}", "mcp-session-id": sid,
                "mcp-protocol-version": "2025-03-26", **(extra or {})}

    unknown = httpx.delete(mcp_url, headers={**as_("bolt"), "mcp-session-id": "0" * 32},
                           timeout=30)
    ended = httpx.delete(mcp_url, headers=as_("bolt"), timeout=30)
    with httpx.stream("GET", mcp_url, headers=as_("bolt"), timeout=30) as stream:
        stream_status = stream.status_code
    assert ended.status_code == stream_status == unknown.status_code == 404
    assert ended.text == unknown.text
    closed = httpx.delete(mcp_url, headers=as_("acme"), timeout=30)
    assert closed.status_code in (200, 204), closed.text
    after = httpx.delete(mcp_url, headers=as_("acme"), timeout=30)
    assert after.status_code == 404


def test_tools_act_for_the_callers_tenant_without_a_transport() -> None:
    backend = ScriptedBackend({"extract_keywords": "stores"},
                              default="SELECT count(*) FROM stores", latency_s=0.01)
    with AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"cpu-0": backend}) as af:
        tools = AgentflowTools(af)
        acme = Tenant(name="acme", max_concurrent=1)
        answer = asyncio.run(tools.ask("How many stores?", "bookshop", caller=acme))
        assert answer["status"] == "done" and af.get(answer["query_id"]).tenant == "acme"
        assert tools.limits.inflight("acme") == 0  # the slot came back
        tools.limits.acquire(acme)  # one in flight elsewhere: the next is refused
        with pytest.raises(LimitExceeded):
            asyncio.run(tools.run_sql("bookshop", "SELECT 1", caller=acme))
