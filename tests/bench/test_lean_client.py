"""The load generators' lean HTTP/1.1 client against the real server (uvicorn in a
thread, scripted instance: NOT a model): the same answers and error shapes as httpx,
keep-alive connections reused, a connection per request when asked, and a clear error
for what it does not speak."""

from __future__ import annotations

import argparse
import asyncio

import httpx
import pytest

from agentflow.bench.serving.lean_client import LeanClient
from agentflow.bench.serving.load_test import drive
from agentflow.server.testing import LiveServer, scripted_instance

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server():
    with LiveServer({"instances": [scripted_instance("a", max_inflight=4)],
                     "pipeline": "single"}) as live:
        yield live


def test_answers_and_errors_read_as_httpx_reads_them(server) -> None:
    body = {"question": "How many stores are there?", "db": "bookshop", "wait": True}

    async def run():
        async with LeanClient(server.url) as lean:
            ok = await lean.post(f"{server.url}/v1/queries", json=body)
            bad = await lean.post(f"{server.url}/v1/queries", json={**body, "db": "nope"})
            pooled = len(lean._idle)
        async with httpx.AsyncClient() as http:
            ref = await http.post(f"{server.url}/v1/queries", json={**body, "db": "nope"})
        return ok, bad, pooled, ref

    ok, bad, pooled, ref = asyncio.run(run())
    assert ok.status_code == 200 and ok.json()["status"] == "done"
    assert ok.json()["sql"] and ok.headers["content-type"] == "application/json"
    assert bad.status_code == ref.status_code == 404
    assert bad.json() == ref.json()  # the API's one error shape, byte for byte the same
    assert pooled == 1  # both requests went over one kept-alive connection


def test_drive_counts_every_query_with_either_connection_mode(server) -> None:
    for fresh in (False, True):
        args = argparse.Namespace(queries=6, clients=3, timeout=60, key=None, retries=0,
                                  fresh_connections=fresh, lean_client=True)
        run = asyncio.run(drive(server.url, args))
        assert sorted(o.index for o in run.outcomes) == list(range(6))
        assert {o.kind for o in run.outcomes} == {"done"}, [o.reason for o in run.outcomes]


def test_a_refused_connection_and_a_bad_url_are_clear(server) -> None:
    with pytest.raises(ValueError, match="plain http"):
        LeanClient("https://example.org")

    async def refused() -> None:
        async with LeanClient("http://127.0.0.1:9", timeout=5) as lean:  # discard port
            await lean.post("http://127.0.0.1:9/v1/queries", json={})
    with pytest.raises(httpx.ReadError):
        asyncio.run(refused())
