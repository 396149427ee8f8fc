"""The HTTP API's result shapes and follow-ups, on the real server over loopback: CSV, chart
(Vega-Lite / SVG / PNG), conversation ids, /docs without a CDN, and the log format."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402

PER_CITY = "SELECT city, count(*) AS stores FROM stores GROUP BY city ORDER BY 2 DESC"


def script(request) -> str:
    if "Earlier in this conversation" in request.prompt:
        return "SELECT city, count(*) AS stores FROM stores WHERE city = 'Lisbon' GROUP BY city"
    if "per city" in request.prompt:
        return PER_CITY
    return "SELECT count(*) FROM stores"


@pytest.fixture(scope="module")
def server():
    af = AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"b": ScriptedBackend(script)})
    try:
        with LiveServer({}, agentflow=af) as live:
            yield live
    finally:
        af.close()


def ask(server, question: str, **extra) -> dict:
    r = httpx.post(f"{server.url}/v1/queries", json={"question": question, "db": "bookshop",
                                                    **extra}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_csv_and_chart_of_a_categorical_result(server) -> None:
    view = ask(server, "How many stores per city?")
    assert set(view["links"]) >= {"csv", "chart"}
    csv = httpx.get(server.url + view["links"]["csv"])
    assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[:2] == ["city,stores", "Lisbon,2"]
    spec = httpx.get(server.url + view["links"]["chart"]).json()
    assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/")
    assert spec["mark"]["type"] == "bar"
    assert spec["encoding"]["x"]["title"] == "city" and spec["encoding"]["y"]["title"] == "stores"
    svg = httpx.get(server.url + view["links"]["chart"], params={"format": "svg"})
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert svg.text.lstrip().startswith("<svg") and "Lisbon" in svg.text
    png = httpx.get(server.url + view["links"]["chart"], params={"format": "png"})
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_single_number_has_a_csv_but_no_chart(server) -> None:
    view = ask(server, "How many stores are there?")
    assert "csv" in view["links"] and "chart" not in view["links"]
    r = httpx.get(f"{server.url}/v1/queries/{view['query_id']}/chart")
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_chart"
    r = httpx.get(f"{server.url}/v1/queries/q-nope/rows.csv")
    assert r.status_code == 404 and r.json()["error"]["code"] == "query_not_found"


def test_follow_up_over_http(server) -> None:
    first = ask(server, "How many stores per city?")
    second = ask(server, "now only Lisbon", conversation_id=first["conversation_id"])
    assert second["conversation_id"] == first["conversation_id"]
    assert second["query_id"] != first["query_id"] and second["rows"] == [["Lisbon", 2]]
    r = httpx.post(f"{server.url}/v1/queries", json={
        "question": "and now?", "db": "bookshop", "conversation_id": "c-nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"


def test_docs_are_served_without_a_cdn(server) -> None:
    html = httpx.get(server.url + "/docs").text
    assert "/docs-assets/swagger-ui-bundle.js" in html and "cdn" not in html.lower()
    js = httpx.get(server.url + "/docs-assets/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 100_000
    assert httpx.get(server.url + "/openapi.json").json()["paths"]["/v1/queries/{query_id}/chart"]


def test_access_log_skips_page_polling_but_keeps_the_rest() -> None:
    from agentflow.server.logs import PollingFilter

    def record(method, path, status):
        return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                                 '%s - "%s %s HTTP/%s" %d',
                                 ("127.0.0.1:5", method, path, "1.1", status), None)
    keep = PollingFilter().filter
    assert not keep(record("GET", "/v1/instances", 200))
    assert not keep(record("GET", "/v1/queries?limit=12", 200))
    assert not keep(record("GET", "/static/app.js", 304))
    assert keep(record("POST", "/v1/queries", 200))
    assert keep(record("GET", "/v1/instances", 500))
    assert keep(record("DELETE", "/v1/queries/q-1", 200))
