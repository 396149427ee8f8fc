"""Issue 35 §9 and the admin part of §4, on the real uvicorn server on loopback.

Before: one client holding more idle sockets than ``max_connections`` made ``/healthz`` 503
for everyone; 100 KB of headers and 5,000 headers were accepted; taught-example ids came from
one global counter (a tenant saw how many others taught between two of its pairs); admin
keys had no limits at all.
"""

from __future__ import annotations

import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.server.settings import ServerSettings  # noqa: E402
from agentflow.server.testing import LiveServer, scripted_instance  # noqa: E402

pytestmark = pytest.mark.timeout(120)
KEYS = {"a": "edge-key-a", "b": "edge-key-b", "ops": "edge-key-ops"}


def auth(name: str) -> dict[str, str]:
    return {"X-API-Key": KEYS[name]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("edge") / "teaching.sqlite"
    config = {"instances": [scripted_instance("s", latency_s=0.5, max_inflight=8)],
              "pipeline": "single", "teaching_store": str(store)}
    settings = {"max_connections": 110, "header_timeout_s": 30, "admission_wait_s": 5,
                "tenants": [{"name": "a", "keys": [KEYS["a"]]},
                            {"name": "b", "keys": [KEYS["b"]]},
                            {"name": "ops", "keys": [KEYS["ops"]], "admin": True}]}
    with LiveServer(config, settings) as live:
        yield live


def test_one_client_holding_sockets_does_not_take_healthz_from_the_others(server) -> None:
    held = []
    try:
        for _ in range(120):  # more than max_connections, all from 127.0.0.2, all idle
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.2", 0))
            sock.connect(("127.0.0.1", server.port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
            held.append(sock)
        time.sleep(0.5)
        r = httpx.get(f"{server.url}/healthz", timeout=30)  # another client: 127.0.0.1
        assert r.status_code == 200, r.text
        held[-1].settimeout(10)  # the hog's own connections beyond its cap were refused
        refused = held[-1].recv(4096)
        assert b" 503 " in refused.split(b"\r\n", 1)[0] and b"too_many_connections" in refused
    finally:
        for sock in held:
            sock.close()


def test_oversized_headers_get_431(server) -> None:
    big = httpx.get(f"{server.url}/healthz", headers={"x-big": "a" * 100_000}, timeout=30)
    assert big.status_code == 431 and big.json()["error"]["code"] == "headers_too_large"
    many = httpx.get(f"{server.url}/healthz", timeout=30,
                     headers=[(f"x-h{i}", "1") for i in range(5000)])
    assert many.status_code == 431 and "at most 100 are accepted" in \
        many.json()["error"]["message"]
    assert httpx.get(f"{server.url}/healthz", headers={"x-ok": "a" * 1000},
                     timeout=30).status_code == 200


def _teach(server, who: str, question: str) -> int:
    r = httpx.post(f"{server.url}/v1/databases/bookshop/examples", headers=auth(who),
                   json={"question": question, "sql": "SELECT count(*) FROM stores"},
                   timeout=60)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_taught_ids_tell_a_tenant_nothing_of_what_others_taught(server) -> None:
    first = _teach(server, "a", "How many stores? (a1)")
    for i in range(5):
        _teach(server, "b", f"How many stores? (b{i})")
    second = _teach(server, "a", "How many stores? (a2)")
    assert second - first != 6  # before: the global counter moved by B's five, plus one
    own = [_teach(server, "a", f"How many stores? (a-run {i})") for i in range(8)]
    steps = {b - a for a, b in zip(own, own[1:])}
    assert steps != {1}  # not a counter, even with nobody else teaching
    glossary = [httpx.post(f"{server.url}/v1/databases/bookshop/glossary", headers=auth("a"),
                           json={"term": f"term{i}", "meaning": "m"}, timeout=30).json()["id"]
                for i in range(4)]
    assert {b - a for a, b in zip(glossary, glossary[1:])} != {1}
    # the ids still work: delete by id, and another tenant cannot
    assert httpx.delete(f"{server.url}/v1/databases/bookshop/examples/{own[0]}",
                        headers=auth("b"), timeout=30).status_code == 404
    assert httpx.delete(f"{server.url}/v1/databases/bookshop/examples/{own[0]}",
                        headers=auth("a"), timeout=30).status_code == 200


def test_admin_keys_get_limits_by_default_and_they_are_configurable() -> None:
    table = ServerSettings(admin_keys=["k-admin"], api_keys=["k-plain"]).tenant_table()
    admin, plain = table.lookup("k-admin"), table.lookup("k-plain")
    assert admin is not None and admin.admin and admin.max_concurrent == 32
    assert plain is not None and plain.max_concurrent is None
    tuned = ServerSettings(admin_keys=["k"], admin_max_concurrent=2,
                           admin_rate_per_min=30).tenant_table().lookup("k")
    assert tuned is not None and (tuned.max_concurrent, tuned.rate_per_min) == (2, 30)
    off = ServerSettings(admin_keys=["k"], admin_max_concurrent=None).tenant_table()
    assert off.lookup("k").max_concurrent is None  # type: ignore[union-attr]
    own = ServerSettings(tenants=[{"name": "ops", "keys": ["k"], "admin": True,
                                   "max_concurrent": 5}]).tenant_table().lookup("k")
    assert own is not None and own.max_concurrent == 5  # its own limit wins


def test_an_admin_key_flooding_gets_429(tmp_path) -> None:
    config = {"instances": [scripted_instance("s", latency_s=1.0)], "pipeline": "single",
              "teaching_store": str(tmp_path / "t.sqlite")}
    with LiveServer(config, {"admin_keys": ["flood-admin"], "admin_max_concurrent": 1,
                             "admission_wait_s": 5}) as live:
        headers = {"X-API-Key": "flood-admin"}
        body = {"question": "How many stores are there?", "db": "bookshop", "wait": False}
        first = httpx.post(f"{live.url}/v1/queries", json=body, headers=headers, timeout=30)
        second = httpx.post(f"{live.url}/v1/queries", json=body, headers=headers, timeout=30)
        assert first.status_code in (200, 202), first.text
        assert second.status_code == 429 and \
            second.json()["error"]["code"] == "too_many_queries"
        live.idle(timeout=30)
