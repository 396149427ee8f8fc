"""No query hangs, no timeout can be skipped, no input breaks the service (issue 11, §1
serving side and §3). The real uvicorn server on loopback; instances are scripted backends
(NOT models) with injected faults."""

from __future__ import annotations

import json
import signal
import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.server.testing import LiveServer, metric_sum, scripted_instance  # noqa: E402
from tests.server.utils import error_of, serve_process, sigterm_with_a_query_in_flight  # noqa: E402
from tests.utils import wait_until  # noqa: E402

QUESTION = "How many stores are there?"
pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def edge():
    """Short slow-client timeouts and a small connection limit, so they are testable."""
    with LiveServer({"instances": [scripted_instance("a")]},
                    {"header_timeout_s": 0.5, "body_timeout_s": 0.5,
                     "max_connections": 20}) as server:
        yield server


def raw(server, data: bytes, wait_s: float = 5.0) -> tuple[bytes, float]:
    """Send raw bytes, return what comes back before the server closes, and when."""
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(data)
        sock.settimeout(wait_s)
        start, got = time.monotonic(), b""
        try:
            while chunk := sock.recv(4096):
                got += chunk
        except TimeoutError:
            pass
        return got, time.monotonic() - start


def json_error(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = body.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    return status, json.loads(body)["error"]


# ---------------------------------------------------------------------------- §3 input
def test_one_bad_record_can_never_poison_the_listing(edge) -> None:
    """Lone surrogates reaching a record by another road (the Python API, a model's output)
    are repaired for display; the listing and the record answer 200."""
    edge.idle()
    handle = edge.service.af.submit("How many stores \ud800 are there?", "bookshop",
                                    pipeline="single")
    handle.future.result(timeout=30)
    listing = httpx.get(f"{edge.url}/v1/queries")
    assert listing.status_code == 200, listing.text
    shown = next(q for q in listing.json()["queries"] if q["query_id"] == handle.query_id)
    assert shown["question"] == "How many stores \ufffd are there?"
    one = httpx.get(f"{edge.url}/v1/queries/{handle.query_id}")
    assert one.status_code == 200 and one.json()["status"] == "done"


def test_a_body_refused_by_content_length_is_counted(edge) -> None:
    before = metric_sum(httpx.get(f"{edge.url}/metrics").text, "agentflow_http_errors_total",
                    status="413")
    r = httpx.post(f"{edge.url}/v1/queries", content=b"x" * 100_000,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and error_of(r)["code"] == "payload_too_large"
    after = metric_sum(httpx.get(f"{edge.url}/metrics").text, "agentflow_http_errors_total",
                   status="413")
    assert after == before + 1


def test_json_without_content_type_and_a_nul_in_a_header_get_the_one_error_shape(edge) -> None:
    r = httpx.post(f"{edge.url}/v1/queries",
                   content=json.dumps({"question": QUESTION, "db": "bookshop"}))
    assert r.status_code == 415
    assert "no Content-Type" in error_of(r)["message"]
    got, _ = raw(edge, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n")
    status, err = json_error(got)
    assert status == 400 and err["code"] == "bad_request"
    text = httpx.get(f"{edge.url}/metrics").text
    assert metric_sum(text, "agentflow_http_errors_total", status="400",
                      code="bad_request") >= 1


def test_slow_clients_are_dropped_with_408(edge) -> None:
    got, _ = raw(edge, b"POST /v1/queries HTTP/1.1\r\nHost: x\r\n")  # headers never end
    status, err = json_error(got)
    assert status == 408 and "headers did not arrive within 0.5 s" in err["message"]
    got, _ = raw(edge, b"POST /v1/queries HTTP/1.1\r\nHost: x\r\nContent-Type: "
                           b"application/json\r\nContent-Length: 100\r\n\r\n{\"quest")
    status, err = json_error(got)
    assert status == 408 and "body did not arrive within 0.5 s" in err["message"]
    # an idle event stream (body complete, waiting for disconnect) is not cut off
    assert httpx.get(f"{edge.url}/healthz").status_code == 200


def test_many_half_sent_requests_are_bounded_and_dropped(edge) -> None:
    """The issue's slowloris: held connections beyond the limit get 503 at once, and all of
    them are closed by the header timeout; the server keeps answering throughout."""
    socks = []
    try:
        for _ in range(30):
            sock = socket.create_connection(("127.0.0.1", edge.port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            socks.append(sock)
        refused = []
        for sock in socks[20:]:  # recv returns once the answer is there: 30 s is a ceiling
            sock.settimeout(30)
            refused.append(json_error(sock.recv(4096)))
        assert all(status == 503 and e["code"] == "too_many_connections"
                   for status, e in refused)
        time.sleep(0.8)  # past the header timeout: every held connection was dropped
        for sock in socks[:20]:
            sock.settimeout(30)
            assert json_error(sock.recv(4096))[0] == 408
        assert httpx.get(f"{edge.url}/healthz").status_code == 200
    finally:
        for sock in socks:
            sock.close()


# ---------------------------------------------------------------------------- §1 serving
def test_healthz_tells_the_truth_with_liveness_and_readiness_split() -> None:
    config = {"instances": [scripted_instance("dies", fail_after=0),
                            scripted_instance("ok")],
              "scheduler": {"policy": "vllm", "revive_after_s": None}}
    with LiveServer(config) as server:
        assert httpx.get(f"{server.url}/healthz").json()["status"] == "ok"
        assert httpx.get(f"{server.url}/readyz").status_code == 200
        a = httpx.post(f"{server.url}/v1/queries", json={"question": QUESTION,
                                                         "db": "bookshop"}, timeout=30).json()
        assert a["status"] == "done" and a["retries"]
        health = httpx.get(f"{server.url}/healthz")
        assert health.status_code == 200
        assert health.json() == {"status": "degraded", "instances": 2, "instances_up": 1,
                                 "instances_down": ["dies"]}
        dies = next(i for i in httpx.get(f"{server.url}/v1/instances").json()["instances"]
                    if i["name"] == "dies")
        assert dies["health"] == "down" and "injected failure" in dies["reason"]
    with LiveServer({"instances": [scripted_instance("only", fail_after=0)],
                     "scheduler": {"revive_after_s": None}}) as server:
        httpx.post(f"{server.url}/v1/queries", json={"question": QUESTION, "db": "bookshop"},
                   timeout=30)
        health = httpx.get(f"{server.url}/healthz")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        ready = httpx.get(f"{server.url}/readyz")
        assert ready.status_code == 503 and int(ready.headers["retry-after"]) >= 1
        assert httpx.get(f"{server.url}/livez").json() == {"status": "alive"}


def test_a_hung_instance_costs_a_retry_visible_in_the_answer_and_in_metrics() -> None:
    # Declared as A100s: with no call finished yet, the deadline comes from that profile
    # (gpu=None would mean a CPU model, whose calls may rightly take many seconds).
    config = {"instances": [scripted_instance("hung", latency_s=1000, max_inflight=4,
                                              gpu="A100-80G"),
                            scripted_instance("ok", max_inflight=4, gpu="A100-80G")],
              "scheduler": {"policy": "vllm", "revive_after_s": None,
                            "health": {"deadline_min_s": 0.3}}}
    with LiveServer(config) as server:
        a = httpx.post(f"{server.url}/v1/queries", json={"question": QUESTION,
                                                         "db": "bookshop"}, timeout=30).json()
        assert a["status"] == "done"  # within 30 s, beside a 1,000 s instance
        timed_out = [r for r in a["retries"] if r["failed_on"] == "hung"]
        assert timed_out and all(r["rerun_on"] == "ok" and "timed out" in r["error"]
                                 for r in timed_out)
        text = httpx.get(f"{server.url}/metrics").text
        assert metric_sum(text, "agentflow_llm_call_timeouts_total", instance="hung") >= 1
        assert metric_sum(text, "agentflow_llm_call_retries_total", instance="hung") >= 1
        assert metric_sum(text, "agentflow_instance_health", instance="hung",
                          state="healthy") == 0
        assert metric_sum(text, "agentflow_instance_up", instance="hung") == 0


def test_sigterm_drains_with_the_port_open_then_exits(tmp_path) -> None:
    """Observed from a client: during the drain new queries get 503 + Retry-After (not a
    refused connection), readiness is 503, liveness 200, and the wait=true request in
    flight gets its answer; then the process exits."""
    # The query's calls wait until the test creates ``release``: it is in flight for as long
    # as the test looks at the drain, however loaded the machine (the drain's 120 s is a
    # ceiling; a drain ends when its queries do).
    release = tmp_path / "release"
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(json.dumps({
        "fewshot": None, "pipeline": "single",
        "instances": [scripted_instance("slow", hold_until_file=str(release))],
        "server": {"drain_s": 120}}))
    with serve_process(cfg, ready="/readyz") as (proc, url):
        waiter, result = sigterm_with_a_query_in_flight(
            proc, url, {"question": QUESTION, "db": "bookshop"}, timeout_s=150)
        wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 503,
                   what="readiness 503 once SIGTERM is handled")
        during = httpx.post(f"{url}/v1/queries", json={"question": QUESTION, "db": "bookshop"},
                            timeout=10)
        assert during.status_code == 503, during.text
        assert error_of(during)["code"] == "shutting_down"
        assert int(during.headers["retry-after"]) >= 1
        assert httpx.get(f"{url}/readyz").status_code == 503
        assert httpx.get(f"{url}/healthz").json()["status"] == "draining"
        assert httpx.get(f"{url}/livez").status_code == 200
        assert waiter.is_alive()  # still held: the answer waits for the release
        release.touch()
        waiter.join(60)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    answer = result["r"]
    assert answer.status_code == 200 and answer.json()["status"] == "done", answer.text
    with pytest.raises(httpx.TransportError):  # and then the port is closed
        httpx.get(f"{url}/livez", timeout=2)


def test_a_bug_in_submit_is_a_500_not_a_shutdown(monkeypatch) -> None:
    """Only agentflow's own 'shutting down' answers 503 shutting_down; any other error
    raised while submitting is a bug: 500 internal (so it is not retried as a restart)."""
    with LiveServer({"instances": [scripted_instance("a")]}) as server:
        def broken(*args, **kwargs):
            raise RuntimeError("dictionary changed size during iteration")  # stands in: a bug

        monkeypatch.setattr(server.service.af, "submit", broken)
        r = httpx.post(f"{server.url}/v1/queries", json={"question": QUESTION,
                                                         "db": "bookshop"}, timeout=30)
        assert r.status_code == 500 and error_of(r)["code"] == "internal", r.text
        assert "retry-after" not in r.headers
        monkeypatch.undo()
        server.service.af.close()  # agentflow itself refusing new questions
        r = httpx.post(f"{server.url}/v1/queries", json={"question": QUESTION,
                                                         "db": "bookshop"}, timeout=30)
        assert r.status_code == 503 and error_of(r)["code"] == "shutting_down", r.text
