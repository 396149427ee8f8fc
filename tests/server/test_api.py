"""The HTTP API end to end: the real uvicorn server on a loopback port, driven with httpx.

Instances use the scripted backend (not a model): answers by stage, fixed latencies,
injected failures. Each server below is started once per module and shared by its tests.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from agentflow.server.settings import API_KEYS_ENV, ServerSettings, load_serve_config  # noqa: E402
from agentflow.server.testing import GOOD_SQL, LiveServer, scripted_instance  # noqa: E402
from tests.server.utils import error_of, held_calls, serve_process, sigterm_with_a_query_in_flight  # noqa: E402

QUESTION = "How many stores are there?"
KEY = "test-key-123"
ADMIN_KEY = "test-admin-key-456"
pytestmark = pytest.mark.timeout(60)


# ---------------------------------------------------------------------------- servers
@pytest.fixture(scope="module")
def fast():
    """Two instances (different speeds), no keys, default admission bounds."""
    with LiveServer({"instances": [scripted_instance("gpu-a", latency_s=0.02, gpu="A100-80G"),
                                   scripted_instance("gpu-b", latency_s=0.04, gpu="L40S")],
                     "slo_s": 30}) as server:
        yield server


@pytest.fixture(scope="module")
def guarded():
    """API keys on, room for one query at a time, slow calls (so queries are catchable)."""
    with LiveServer({"instances": [scripted_instance("slow", latency_s=0.4, max_inflight=4)],
                     "scheduler": {"max_active_queries": 1}},
                    {"api_keys": [KEY], "admin_keys": [ADMIN_KEY],
                     "admission_wait_s": 5}) as server:
        yield server


@pytest.fixture
def auth(guarded):
    guarded.idle()
    yield {"Authorization": f"Bearer {KEY}"}
    for handle in list(guarded.service.af.handles.values()):
        if not handle.done():
            guarded.service.af.cancel(handle.query_id)
    guarded.idle()


def post(server, body, **kwargs):
    return httpx.post(f"{server.url}/v1/queries", json=body, timeout=30, **kwargs)


# ---------------------------------------------------------------------------- answers
def test_post_answers_with_sql_rows_stages_and_the_instance_of_every_call(fast) -> None:
    r = post(fast, {"question": QUESTION, "db": "bookshop", "slo_seconds": 20})
    assert r.status_code == 200, r.text
    a = r.json()
    assert a["status"] == "done" and a["error"] is None
    assert a["sql"] == GOOD_SQL and a["columns"] == ["count(*)"] and a["rows"] == [[12]]
    assert a["slo_s"] == 20 and a["met_slo"] is True and a["latency_s"] > 0
    assert a["pipeline"] == "chess" and a["retries"] == []
    llm = [s for s in a["stages"] if s["kind"] == "llm"]
    assert {s["stage"] for s in llm} >= {"extract_keywords", "generate_candidate"}
    calls = [c for s in llm for c in s["llm_calls"]]
    assert calls and {c["instance"] for c in calls} <= {"gpu-a", "gpu-b"}
    assert all(c["queue_s"] >= 0 and c["run_s"] >= 0.015 for c in calls)
    assert all(s["instances"] and s["start"] <= s["end"] for s in llm)
    assert a["usage"]["calls"] == len(calls)


def test_wait_false_answers_202_with_the_id_then_polling_gives_the_answer(fast) -> None:
    r = post(fast, {"question": QUESTION, "db": "bookshop", "wait": False})
    assert r.status_code == 202, r.text
    view = r.json()
    assert view["status"] in ("pending", "running") and view["query_id"].startswith("q-")
    assert r.headers["location"] == f"/v1/queries/{view['query_id']}"
    deadline = time.monotonic() + 60
    while True:
        got = httpx.get(f"{fast.url}/v1/queries/{view['query_id']}").json()
        if got["status"] not in ("pending", "running") or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert got["status"] == "done" and got["rows"] == [[12]]
    recent = httpx.get(f"{fast.url}/v1/queries").json()["queries"]
    assert recent[0]["query_id"] == view["query_id"] and recent[0]["latency_s"] > 0


def read_sse(response) -> list[tuple[str, str, dict]]:
    events, fields = [], {}
    for line in response.iter_lines():
        if not line:
            if "data" in fields:
                events.append((fields.get("id", ""), fields.get("event", "message"),
                               json.loads(fields["data"])))
            fields = {}
        elif not line.startswith(":") and ":" in line:
            key, _, value = line.partition(":")
            fields[key] = value.lstrip(" ")
    return events


def test_events_stream_stage_progress_live_and_end_with_done(fast) -> None:
    query_id = post(fast, {"question": QUESTION, "db": "bookshop", "wait": False}).json()[
        "query_id"]
    with httpx.stream("GET", f"{fast.url}/v1/queries/{query_id}/events", timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = read_sse(r)
    types = [t for _, t, _ in events]
    assert types[0] == "stage_started" and types[-1] == "done"
    assert types.count("done") == 1 and "stage_finished" in types
    assert [int(i) for i, _, _ in events] == list(range(1, len(events) + 1))
    finished = [e for _, t, e in events if t == "stage_finished" and e["kind"] == "llm"]
    assert finished and all(e["instance"] in ("gpu-a", "gpu-b") for e in finished)
    done = events[-1][2]
    assert done["status"] == "done" and done["answer"]["rows"] == [[12]]
    # After the end: the same events replay, and Last-Event-ID resumes after a given one.
    with httpx.stream("GET", f"{fast.url}/v1/queries/{query_id}/events", timeout=30) as r:
        assert [t for _, t, _ in read_sse(r)] == types
    with httpx.stream("GET", f"{fast.url}/v1/queries/{query_id}/events", timeout=30,
                      headers={"Last-Event-ID": str(len(events) - 2)}) as r:
        assert [t for _, t, _ in read_sse(r)] == types[-2:]


def test_databases_health_docs_and_metrics(fast) -> None:
    dbs = httpx.get(f"{fast.url}/v1/databases").json()["databases"]
    shop = next(d for d in dbs if d["id"] == "bookshop")
    assert shop["engine"] == "sqlite" and {"stores", "books", "orders"} <= set(shop["tables"])
    assert httpx.get(f"{fast.url}/healthz").json() == {"status": "ok", "instances": 2,
                                                      "instances_up": 2, "instances_down": []}
    assert httpx.get(f"{fast.url}/docs").status_code == 200
    paths = httpx.get(f"{fast.url}/openapi.json").json()["paths"]
    assert {"/v1/queries", "/v1/queries/{query_id}", "/v1/queries/{query_id}/events",
            "/v1/databases", "/healthz", "/metrics"} <= set(paths)
    assert post(fast, {"question": QUESTION, "db": "bookshop"}).json()["status"] == "done"
    text = httpx.get(f"{fast.url}/metrics").text
    for needle in ('agentflow_queries_total{status="done"}',
                   'agentflow_slo_queries_total{met="true"}', "agentflow_slo_attainment_ratio",
                   'agentflow_instance_waiting_calls{instance="gpu-a"}',
                   'agentflow_instance_inflight_calls{instance="gpu-b"}',
                   'agentflow_stage_latency_seconds_bucket{kind="llm"',
                   'agentflow_llm_call_queue_seconds_count{instance=',
                   'agentflow_scheduler_decision_seconds_count{event="call_ready"}'):
        assert needle in text, needle
    ready = 'agentflow_scheduler_decision_seconds_count{event="call_ready"}'
    decisions = [line for line in text.splitlines() if line.startswith(ready)]
    assert float(decisions[0].split()[-1]) > 0


def test_the_web_page_and_its_assets_are_served_locally(fast) -> None:
    page = httpx.get(f"{fast.url}/")
    assert page.status_code == 200 and "<title>agentflow" in page.text
    for asset in ("app.js", "sql.js", "style.css"):
        r = httpx.get(f"{fast.url}/static/{asset}")
        assert r.status_code == 200 and len(r.text) > 500
        assert "http://" not in r.text and "https://" not in r.text  # nothing from the internet
    assert "https://" not in page.text and "http://" not in page.text.replace(
        "http://www.w3.org/2000/svg", "")


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("body", "content_type", "status", "code", "words"), [
    (b'{"question": "x", "db": ', "application/json", 400, "malformed_json", "not valid JSON"),
    (b"", "application/json", 400, "malformed_json", "empty"),
    (b"question=x", "text/plain", 415, "unsupported_media_type", "JSON"),
    (b"[1, 2]", "application/json", 422, "invalid_request", "JSON object"),
    (json.dumps({"question": "   ", "db": "bookshop"}).encode(), "application/json", 422,
     "invalid_request", "question is empty"),
    (json.dumps({"question": "x" * 2001, "db": "bookshop"}).encode(), "application/json", 422,
     "invalid_request", "too long (2001 characters; at most 2000)"),
    (json.dumps({"question": "x" * 100_000, "db": "bookshop"}).encode(), "application/json",
     413, "payload_too_large", "at most"),
    (json.dumps({"question": "x", "db": "bookshop", "slo_seconds": -3}).encode(),
     "application/json", 422, "invalid_request", "slo_seconds: must be a positive number"),
    (json.dumps({"question": "x", "db": "bookshop", "slo_seconds": "soon"}).encode(),
     "application/json", 422, "invalid_request", "slo_seconds"),
    (json.dumps({"question": "x", "db": "bookshop", "slo_seconds": 10 ** 9}).encode(),
     "application/json", 422, "invalid_request", "at most 86400"),
    (json.dumps({"question": "x", "db": "bookshop", "slo_seconds": True}).encode(),
     "application/json", 422, "invalid_request", "got true"),
    (json.dumps({"db": "bookshop"}).encode(), "application/json", 422, "invalid_request",
     "question: this field is required"),
    (json.dumps({"question": "x", "db": "bookshop", "slo_s": 5}).encode(), "application/json",
     422, "invalid_request", "slo_s: unknown field"),
    (json.dumps({"question": "x", "db": "bookshop", "slo": 5, "slo_seconds": 9}).encode(),
     "application/json", 422, "invalid_request", "given twice"),
    (json.dumps({"question": "x", "db": "bookshp"}).encode(), "application/json", 404,
     "unknown_database", "did you mean bookshop"),
    (json.dumps({"question": "x", "db": "/etc/passwd.sqlite"}).encode(), "application/json",
     404, "unknown_database", "unknown database"),
    (json.dumps({"question": "x", "db": "bookshop", "pipeline": "magic"}).encode(),
     "application/json", 422, "invalid_request", "unknown pipeline 'magic'"),
    # a lone surrogate is valid JSON but not text: refused before the query starts
    (b'{"question": "How many stores \\ud800 are there?", "db": "bookshop", "wait": false}',
     "application/json", 422, "invalid_request", "invalid Unicode (a lone surrogate U+D800"),
    (b'{"question": "x", "db": "bookshop", "evidence": "\\udfff"}', "application/json", 422,
     "invalid_request", "evidence: "),
])
def test_bad_input_gets_a_4xx_with_a_readable_message(fast, body, content_type, status, code,
                                                      words) -> None:
    r = httpx.post(f"{fast.url}/v1/queries", content=body,
                   headers={"Content-Type": content_type}, timeout=30)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["code"] == code and words in err["message"], err


def test_a_huge_body_without_content_length_is_cut_off_too(fast) -> None:
    def chunks():
        yield b'{"question": "'
        for _ in range(100):
            yield b"x" * 1000
        yield b'", "db": "bookshop"}'
    r = httpx.post(f"{fast.url}/v1/queries", content=chunks(),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"


def test_agentflow_serve_is_a_cli_subcommand() -> None:
    from agentflow.cli.main import build_parser

    args = build_parser().parse_args(["serve", "--port", "9999", "--data", "/x", "--drain", "3"])
    assert (args.command, args.port, args.host, args.data, args.drain) == (
        "serve", 9999, "127.0.0.1", ["/x"], 3.0)


def test_unknown_ids_and_routes_use_the_same_error_shape(fast) -> None:
    for method, path, status, code in [("GET", "/v1/queries/q-nope", 404, "query_not_found"),
                                       ("DELETE", "/v1/queries/q-nope", 404, "query_not_found"),
                                       ("GET", "/v1/queries/q-nope/events", 404,
                                        "query_not_found"),
                                       ("GET", "/v2/anything", 404, "not_found"),
                                       ("PUT", "/v1/queries", 405, "method_not_allowed")]:
        r = httpx.request(method, f"{fast.url}{path}")
        assert r.status_code == status and error_of(r)["code"] == code, (method, path, r.text)
    assert "agentflow_http_errors_total" in httpx.get(f"{fast.url}/metrics").text


# ---------------------------------------------------------------------------- keys, load
def test_api_keys_are_required_when_configured_but_healthz_stays_open(guarded, auth) -> None:
    url = f"{guarded.url}/v1/databases"
    missing = httpx.get(url)
    assert missing.status_code == 401 and error_of(missing)["code"] == "unauthorized"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url, headers={"X-API-Key": "wrong"}).status_code == 401
    assert post(guarded, {"question": QUESTION, "db": "bookshop"}).status_code == 401
    assert httpx.get(f"{guarded.url}/metrics").status_code == 401
    assert httpx.get(url, headers=auth).status_code == 200
    assert httpx.get(url, headers={"X-API-Key": KEY}).status_code == 200
    assert httpx.get(f"{guarded.url}/healthz").status_code == 200
    assert httpx.get(f"{guarded.url}/").status_code == 200  # the page asks for a key itself


def test_keys_from_the_environment_add_to_the_config(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(API_KEYS_ENV, " env-a, env-b ,")
    assert ServerSettings(api_keys=["file-key"]).keys() == ["file-key", "env-a", "env-b"]
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("instances: [{name: x, backend: {type: scripted, default: 'SELECT 1'}}]\n"
                   "server: {api_keys: [k], drain_s: 2}\n")
    config, settings = load_serve_config(cfg)
    assert config.instances[0].name == "x" and settings.drain_s == 2
    cfg.write_text("server: {api_key: [k]}\n")
    with pytest.raises(ValueError, match="api_key"):
        load_serve_config(cfg)


def test_overload_is_429_with_retry_after_not_a_growing_queue(guarded, auth) -> None:
    with held_calls(guarded) as hold:  # the first query holds the one slot throughout
        first = post(guarded, {"question": QUESTION, "db": "bookshop", "wait": False},
                     headers=auth)
        assert first.status_code == 202, first.text
        hold.wait_held(1)
        for wait in (False, True):
            r = post(guarded, {"question": QUESTION, "db": "bookshop", "wait": wait},
                     headers=auth)
            assert r.status_code == 429, r.text
            err = error_of(r)
            assert err["code"] == "overloaded" and "limit 1" in err["message"]
            assert int(r.headers["retry-after"]) >= 1 and err["retry_after_s"] >= 1
            rejected = httpx.get(f"{guarded.url}/v1/queries/{err['query_id']}",
                                 headers=auth).json()
            assert rejected["status"] == "rejected"
    assert httpx.get(f"{guarded.url}/metrics", headers=auth).status_code == 403  # not admin
    text = httpx.get(f"{guarded.url}/metrics",
                     headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text
    assert 'agentflow_queries_total{status="rejected"} 2.0' in text
    assert 'agentflow_http_errors_total{code="overloaded",status="429"}' in text


def test_delete_cancels_a_running_query_and_says_so(guarded, auth) -> None:
    with held_calls(guarded) as hold:  # running when DELETE comes, by construction
        r = post(guarded, {"question": QUESTION, "db": "bookshop", "wait": False},
                 headers=auth)
        query_id = r.json()["query_id"]
        hold.wait_held(1)
        cancelled = httpx.delete(f"{guarded.url}/v1/queries/{query_id}", headers=auth)
    assert cancelled.status_code == 200, cancelled.text
    view = cancelled.json()
    assert view["status"] == "cancelled" and "cancelled by request" in view["error"]
    assert view["met_slo"] is None and view["rows"] == []
    again = httpx.delete(f"{guarded.url}/v1/queries/{query_id}", headers=auth)
    assert again.status_code == 409 and error_of(again)["code"] == "already_finished"
    # the freed admission slot takes the next query
    assert post(guarded, {"question": QUESTION, "db": "bookshop", "pipeline": "single"},
                headers=auth).json()["status"] == "done"


# ---------------------------------------------------------------------------- failures
def test_an_instance_dying_mid_query_is_retried_on_another_and_the_answer_says_so() -> None:
    # round-robin dispatch: "broken" serves its first call, then dies mid-query
    with LiveServer({"instances": [scripted_instance("broken", fail_after=1, max_inflight=1),
                                   scripted_instance("healthy", max_inflight=1)],
                     "scheduler": {"policy": "vllm", "revive_after_s": None}}) as server:
        a = post(server, {"question": QUESTION, "db": "bookshop"}).json()
        assert a["status"] == "done" and a["rows"] == [[12]], a["error"]
        assert a["retries"], "the broken instance should have failed a call"
        for retry in a["retries"]:
            assert retry["failed_on"] == "broken" and retry["rerun_on"] == "healthy"
            assert "injected failure" in retry["error"]
        failed_calls = [c for s in a["stages"] for c in s["llm_calls"] if c["failed_attempts"]]
        assert failed_calls and all(c["instance"] == "healthy" for c in failed_calls)
        instances = httpx.get(f"{server.url}/v1/instances").json()["instances"]
        assert {i["name"]: i["up"] for i in instances} == {"broken": False, "healthy": True}
        text = httpx.get(f"{server.url}/metrics").text
        assert 'agentflow_instance_up{instance="broken"} 0.0' in text
        assert 'agentflow_llm_call_failures_total{instance="broken"}' in text


def test_when_the_only_instance_dies_the_query_fails_with_the_reason_then_503() -> None:
    with LiveServer({"instances": [scripted_instance("only", fail_after=1)],
                     "scheduler": {"revive_after_s": None}}) as server:
        a = post(server, {"question": QUESTION, "db": "bookshop", "slo_seconds": 30}).json()
        assert a["status"] == "failed" and a["met_slo"] is False
        assert "no instance can run the call" in a["error"] or "injected failure" in a["error"]
        assert a["retries"] and a["retries"][0]["rerun_on"] is None
        assert httpx.get(f"{server.url}/healthz").json()["instances_up"] == 0
        r = post(server, {"question": QUESTION, "db": "bookshop"})
        assert r.status_code == 503 and error_of(r)["code"] == "unavailable"
        assert "no model instance is up" in error_of(r)["message"]
        assert int(r.headers["retry-after"]) >= 1


# ---------------------------------------------------------------------------- shutdown
def test_sigterm_drains_then_cancels_in_flight_queries_with_a_status(tmp_path) -> None:
    # The call waits for a file nobody creates: the query outlives the 0.5 s drain by
    # construction, not because 3 s of latency outlasted a loaded machine's SIGTERM handling.
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(json.dumps({
        "fewshot": None, "instances": [scripted_instance(
            "slow", hold_until_file=str(tmp_path / "never-created"))],
        "server": {"drain_s": 0.5}}))
    with serve_process(cfg) as (proc, url):
        waiter, result = sigterm_with_a_query_in_flight(
            proc, url, {"question": QUESTION, "db": "bookshop"}, timeout_s=30)
        waiter.join(30)
        # uvicorn re-raises the signal after its graceful shutdown: exit by SIGTERM is normal
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    log = proc.stdout.read()
    assert "query statuses: {'cancelled': 1}" in log, log
    answer = result["r"].json()
    assert result["r"].status_code == 200
    assert answer["status"] == "cancelled" and "shutting down" in answer["error"]
