"""Tenants over HTTP (issue 20 §1), on the real server (uvicorn on loopback): for every route
that reaches a query or its results, tenant A gets the very same 404 on B's objects as on an
id never issued; lists show the caller's own; admins see all; a database outside a key's
list does not exist for it; /metrics wants an admin; rate and concurrency limits answer 429
with Retry-After while other tenants go on. Instances are scripted (not a model)."""

from __future__ import annotations

import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402
from tests.conftest import make_library_sqlite  # noqa: E402
from tests.server.utils import error_of, held_calls  # noqa: E402

pytestmark = pytest.mark.timeout(90)

CHART_SQL = "SELECT city, count(*) AS n FROM stores GROUP BY city ORDER BY city"
KEYS = {"acme": "acme-key-0001", "bolt": "bolt-key-0002", "ops": "ops-key-0003",
        "narrow": "narrow-key-0004", "metered": "metered-key-0005", "single": "single-key-0006"}
PLAIN = "plain-key-0007"
UNKNOWN_QUERY = "q-000000000000"
UNKNOWN_CONVERSATION = "c-000000000000"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name] if name in KEYS else name}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    library = make_library_sqlite(tmp_path_factory.mktemp("tenants") / "library.sqlite")
    config = AgentFlowConfig(fewshot=None, pipeline="single", slo_s=30,
                             databases={"library": {"url": f"sqlite:///{library}"}})
    backend = ScriptedBackend(lambda r: "stores" if r.stage == "extract_keywords" else CHART_SQL,
                              latency_s=0.4)
    settings = {"api_keys": [PLAIN], "admission_wait_s": 5, "tenants": [
        {"name": "acme", "keys": [KEYS["acme"]], "slo_class": "interactive"},
        {"name": "bolt", "keys": [KEYS["bolt"]]},
        {"name": "ops", "keys": [KEYS["ops"]], "admin": True},
        {"name": "narrow", "keys": [KEYS["narrow"]], "databases": ["library"]},
        {"name": "metered", "keys": [KEYS["metered"]], "rate_per_min": 2},
        {"name": "single", "keys": [KEYS["single"]], "max_concurrent": 1}]}
    with AgentFlow(config, backends={"cpu-0": backend}) as af, \
            LiveServer({}, settings, agentflow=af) as live:
        yield live


def ask(server, who: str, wait: bool = True, **body) -> httpx.Response:
    body = {"question": "How many stores per city?", "db": "bookshop", "wait": wait, **body}
    return httpx.post(f"{server.url}/v1/queries", json=body, headers=auth(who), timeout=60)


def get(server, path: str, who: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers=auth(who), timeout=60)


def same_404(theirs: httpx.Response, unknown: httpx.Response, their_id: str,
             unknown_id: str) -> None:
    """Another tenant's object answers exactly as an unknown one: nothing to tell apart."""
    assert theirs.status_code == unknown.status_code == 404, (theirs.text, unknown.text)
    assert theirs.text.replace(their_id, "ID") == unknown.text.replace(unknown_id, "ID")


@pytest.fixture(scope="module")
def bolt_done(server) -> dict:
    r = ask(server, "bolt")
    assert r.status_code == 200 and r.json()["status"] == "done", r.text
    return r.json()


def test_get_query_of_another_tenant_is_404(server, bolt_done) -> None:
    qid = bolt_done["query_id"]
    same_404(get(server, f"/v1/queries/{qid}", "acme"),
             get(server, f"/v1/queries/{UNKNOWN_QUERY}", "acme"), qid, UNKNOWN_QUERY)
    assert error_of(get(server, f"/v1/queries/{qid}", "acme"))["code"] == "query_not_found"
    assert get(server, f"/v1/queries/{qid}", "bolt").json()["tenant"] == "bolt"
    assert get(server, f"/v1/queries/{qid}", "ops").status_code == 200  # admin
    assert get(server, f"/v1/queries/{qid}", PLAIN).status_code == 404  # a plain key too


def test_list_shows_only_the_callers_queries_and_admins_see_all(server, bolt_done) -> None:
    mine = ask(server, "acme").json()
    assert mine["tenant"] == "acme" and mine["slo_class"] == "interactive"

    def listed(who: str) -> set[str]:
        return {q["query_id"] for q in get(server, "/v1/queries?limit=50", who).json()["queries"]}

    acme, bolt, ops = listed("acme"), listed("bolt"), listed("ops")
    assert mine["query_id"] in acme and bolt_done["query_id"] not in acme
    assert bolt_done["query_id"] in bolt and mine["query_id"] not in bolt
    assert {mine["query_id"], bolt_done["query_id"]} <= ops
    assert listed(PLAIN) == set()


def test_rows_csv_and_chart_of_another_tenant_are_404(server, bolt_done) -> None:
    qid = bolt_done["query_id"]
    assert set(bolt_done["links"]) >= {"csv", "chart"}
    for suffix in ("rows.csv", "chart", "chart?format=svg"):
        same_404(get(server, f"/v1/queries/{qid}/{suffix}", "acme"),
                 get(server, f"/v1/queries/{UNKNOWN_QUERY}/{suffix}", "acme"), qid,
                 UNKNOWN_QUERY)
        assert get(server, f"/v1/queries/{qid}/{suffix}", "bolt").status_code == 200, suffix
        assert get(server, f"/v1/queries/{qid}/{suffix}", "ops").status_code == 200, suffix
    assert get(server, f"/v1/queries/{qid}/rows.csv", "bolt").text.startswith("city,n")


def test_event_stream_of_another_tenant_is_404(server) -> None:
    running = ask(server, "bolt", wait=False)
    assert running.status_code == 202, running.text
    qid = running.json()["query_id"]
    same_404(get(server, f"/v1/queries/{qid}/events", "acme"),
             get(server, f"/v1/queries/{UNKNOWN_QUERY}/events", "acme"), qid, UNKNOWN_QUERY)
    with httpx.stream("GET", f"{server.url}/v1/queries/{qid}/events", headers=auth("bolt"),
                      timeout=60) as stream:
        assert stream.status_code == 200
        text = "".join(stream.iter_text())
    assert "event: done" in text and '"status":"done"' in text


def test_cancel_of_another_tenants_running_query_is_404_and_it_runs_on(server) -> None:
    with held_calls(server) as hold:  # in flight until its owner cancels it, however slow
        running = ask(server, "bolt", wait=False)
        assert running.status_code == 202, running.text
        hold.wait_held(1)
        qid = running.json()["query_id"]
        theirs = httpx.delete(f"{server.url}/v1/queries/{qid}", headers=auth("acme"),
                              timeout=60)
        unknown = httpx.delete(f"{server.url}/v1/queries/{UNKNOWN_QUERY}",
                               headers=auth("acme"), timeout=60)
        same_404(theirs, unknown, qid, UNKNOWN_QUERY)
        assert get(server, f"/v1/queries/{qid}", "bolt").json()["status"] in ("pending",
                                                                             "running")
        own = httpx.delete(f"{server.url}/v1/queries/{qid}", headers=auth("bolt"), timeout=60)
    assert own.status_code == 200 and own.json()["status"] == "cancelled", own.text


def test_follow_up_on_another_tenants_conversation_is_404(server, bolt_done) -> None:
    cid = bolt_done["conversation_id"]
    theirs = ask(server, "acme", conversation_id=cid, question="and only Lisbon?")
    unknown = ask(server, "acme", conversation_id=UNKNOWN_CONVERSATION,
                  question="and only Lisbon?")
    same_404(theirs, unknown, cid, UNKNOWN_CONVERSATION)
    assert error_of(theirs)["code"] == "conversation_not_found"
    again = ask(server, "bolt", conversation_id=cid, question="and only Lisbon?")
    assert again.status_code == 200 and again.json()["conversation_id"] == cid


def test_database_outside_the_keys_list_is_an_unknown_database(server) -> None:
    listed = [d["id"] for d in get(server, "/v1/databases", "narrow").json()["databases"]]
    assert listed == ["library"]
    assert {"bookshop", "library"} <= {
        d["id"] for d in get(server, "/v1/databases", "acme").json()["databases"]}
    hidden = ask(server, "narrow", db="bookshop")
    unknown = ask(server, "narrow", db="nosuchdb")
    same_404(hidden, unknown, "bookshop", "nosuchdb")
    assert error_of(hidden)["code"] == "unknown_database"
    assert "bookshop" not in error_of(unknown)["message"]  # hints name only its own


def test_metrics_need_an_admin_key(server) -> None:
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    r = get(server, "/metrics", "acme")
    assert r.status_code == 403 and error_of(r)["code"] == "forbidden"
    assert get(server, "/metrics", "ops").status_code == 200
    assert httpx.get(f"{server.url}/healthz").status_code == 200


def test_rate_limit_answers_429_with_retry_after_and_others_go_on(server) -> None:
    for _ in range(2):  # 2 per minute: a bucket of two
        assert ask(server, "metered", wait=False).status_code in (200, 202)
    limited = ask(server, "metered", wait=False)
    assert limited.status_code == 429, limited.text
    err = error_of(limited)
    assert err["code"] == "rate_limited" and "2 queries per minute" in err["message"]
    assert 25 <= int(limited.headers["retry-after"]) <= 30  # a token every 30 s
    assert 25 <= err["retry_after_s"] <= 30
    assert ask(server, "acme", wait=False).status_code in (200, 202)  # another tenant


def test_concurrency_limit_answers_429_with_retry_after_until_a_query_ends(server) -> None:
    single_q = "How many stores per city? (the single tenant's)"
    # the first query holds the tenant's one slot until the test has seen the 429
    with held_calls(server, lambda r: single_q in r.prompt) as hold:
        first = ask(server, "single", wait=False, question=single_q)
        assert first.status_code == 202, first.text
        hold.wait_held(1)
        second = ask(server, "single", wait=False)
        assert second.status_code == 429, second.text
        assert error_of(second)["code"] == "too_many_queries"
        assert int(second.headers["retry-after"]) >= 1
        assert ask(server, "acme", wait=False).status_code in (200, 202)  # another tenant
    qid = first.json()["query_id"]
    deadline = time.monotonic() + 30
    while get(server, f"/v1/queries/{qid}", "single").json()["status"] in ("pending",
                                                                          "running"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert ask(server, "single").json()["status"] == "done"  # the slot came back
