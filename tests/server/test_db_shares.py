"""Issue 35 §4 and §5: database threads are shares, not one pool; teaching counts as asking.

Real SQLite (the demo database), the real uvicorn server on loopback, a scripted backend (NOT a
model) whose SQL for tenant A's questions is a recursive CTE that runs until the SQL time
limit stops it. Before: A's 8 slow queries (within A's own limits) held every thread of
asyncio's default executor (cpu + 4 = 6 here), and B's next query waited for them; A's
teach calls with SQL had no rate or concurrency limit at all.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import GOOD_SQL, LiveServer  # noqa: E402
from agentflow.shares import DbShares, Share, share_of  # noqa: E402
from agentflow.tenants import Tenant  # noqa: E402

pytestmark = pytest.mark.timeout(180)
SLOW = ("SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT x FROM c)")  # runs until the SQL time limit; starts as the model's SQL does
SQL_LIMIT_S = 8.0
KEYS = {"a": "key-tenant-a", "b": "key-tenant-b", "metered": "key-metered",
        "single": "key-single", "ops": "key-ops"}


def auth(name: str) -> dict[str, str]:
    return {"X-API-Key": KEYS[name]}


# ------------------------------------------------------------------------- the share rules
def test_caps_follow_the_weight_and_always_leave_threads_for_others() -> None:
    shares = DbShares(8)
    try:
        assert shares.cap(Share("a", 1.0)) == 4
        assert shares.cap(Share("a", 2.0)) == 5
        assert shares.cap(Share("a", 0.5)) == 2
        assert shares.cap(Share("a", 1000.0)) == 7  # never all of them
        assert shares.cap(Share("a", 0.001)) == 1  # never none
        assert shares.cap(Share()) == 8  # no tenant: the only user there is
    finally:
        shares.close()


def test_share_weight_is_tenant_weight_times_class_weight() -> None:
    from agentflow.slo_classes import SloClass

    classes = {"gold": SloClass(name="gold", weight=3.0),
               "standard": SloClass(name="standard", weight=1.0)}
    assert share_of(Tenant(name="t", weight=2, slo_class="gold"), classes) == Share("t", 6.0)
    assert share_of(Tenant(name="t"), classes) == Share("t", 1.0)
    assert share_of(None, classes) == Share()


def test_a_tenant_at_its_cap_waits_while_another_goes_in() -> None:
    shares = DbShares(4)
    gate = threading.Event()
    a, b = Share("a"), Share("b")

    async def scenario() -> tuple[int, float, int]:
        held = [asyncio.ensure_future(shares.run(a, gate.wait)) for _ in range(4)]
        await asyncio.sleep(0.2)
        assert shares.held("a") == shares.cap(a) == 2  # two run, two wait
        start = time.perf_counter()
        await shares.run(b, lambda: None)  # B is not behind A's queue
        b_s = time.perf_counter() - start
        a_held = shares.held("a")
        gate.set()
        await asyncio.gather(*held)
        return a_held, b_s, shares.held("a")

    try:
        a_held, b_s, after = asyncio.run(scenario())
    finally:
        gate.set()
        shares.close()
    assert a_held == 2 and b_s < 1.0 and after == 0


def test_a_cancelled_waiter_leaves_the_queue_and_a_freed_slot_goes_to_the_lighter_tenant() -> None:
    shares = DbShares(3)  # caps: 1 each for weight 1
    gates = [threading.Event() for _ in range(3)]
    order: list[str] = []

    async def scenario() -> None:
        running_a = asyncio.ensure_future(shares.run(Share("a"), gates[0].wait))
        running_b = asyncio.ensure_future(shares.run(Share("b"), gates[1].wait))
        await asyncio.sleep(0.1)
        queued_a = asyncio.ensure_future(shares.run(Share("a"), order.append, "a"))
        cancelled = asyncio.ensure_future(shares.run(Share("a"), order.append, "never"))
        await asyncio.sleep(0.1)
        cancelled.cancel()
        gates[0].set()  # a's slot frees: its next waiter (not the cancelled one) gets it
        await asyncio.wait_for(queued_a, 5)
        gates[1].set()
        await asyncio.gather(running_a, running_b)
        with pytest.raises(asyncio.CancelledError):
            await cancelled

    try:
        asyncio.run(scenario())
    finally:
        for g in gates:
            g.set()
        shares.close()
    assert order == ["a"] and shares.held("a") == 0 and shares.held("b") == 0


# ------------------------------------------------------------------------- on the server
def _script(request) -> str:
    if request.stage == "extract_keywords":
        return "stores"
    return SLOW if "slowly" in request.prompt else GOOD_SQL


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    store = tmp_path_factory.mktemp("shares") / "teaching.sqlite"
    config = AgentFlowConfig(fewshot=None, pipeline="single", slo_s=60,
                             sql_timeout_s=SQL_LIMIT_S, teaching_store=str(store),
                             instances=[{"name": "cpu-0", "max_inflight": 16}])
    backend = ScriptedBackend(_script, latency_s=0.01)
    settings = {"admission_wait_s": 5, "tenants": [
        {"name": "a", "keys": [KEYS["a"]], "max_concurrent": 16},
        {"name": "b", "keys": [KEYS["b"]]},
        {"name": "metered", "keys": [KEYS["metered"]], "rate_per_min": 1},
        {"name": "single", "keys": [KEYS["single"]], "max_concurrent": 1}]}
    with AgentFlow(config, backends={"cpu-0": backend}) as af, \
            LiveServer({}, settings, agentflow=af) as live:
        yield live


def _ask(server, who: str, question: str, wait: bool) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/queries", headers=auth(who), timeout=60,
                      json={"question": question, "db": "bookshop", "wait": wait})


def _wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_tenants_slow_sql_leaves_the_others_their_threads(server) -> None:
    server.idle()
    af = server.service.af
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:  # all at once: on a loaded machine a POST takes ~1 s
        posted = list(pool.map(lambda i: _ask(server, "a", f"count slowly ({i})", False),
                               range(8)))
    ids = [r.json()["query_id"] for r in posted]
    _wait_until(lambda: af.shares.held("a") >= af.shares.cap(af.share_of("a")), 30)
    asked = time.perf_counter()
    r = _ask(server, "b", "How many stores are there?", wait=True)
    b_s = time.perf_counter() - asked
    a_finished = [q for q in ids if af.handles[q].done()]
    assert r.status_code == 200 and r.json()["status"] == "done", r.text
    # B answered while every one of A's slow queries was still running (before: B waited
    # for A's to reach the time limit, ~6 s)
    assert a_finished == []
    assert b_s < SQL_LIMIT_S  # ~0.1 s on an idle machine; CPU-bound SQL beside it here
    assert af.shares.held("a") <= af.shares.cap(af.share_of("a"))
    server.idle(timeout=4 * SQL_LIMIT_S)


def _teach(server, who: str, question: str, sql: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/databases/bookshop/examples", headers=auth(who),
                      json={"question": question, "sql": sql}, timeout=60)


def test_teaching_counts_against_the_rate_limit(server) -> None:
    first = _teach(server, "metered", "How many stores are there?", GOOD_SQL)
    second = _teach(server, "metered", "How many stores, again?", GOOD_SQL)
    assert first.status_code == 201, first.text
    assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limited"
    assert int(second.headers["retry-after"]) >= 1
    taught = httpx.get(f"{server.url}/v1/databases/bookshop/examples",
                       headers=auth("metered"), timeout=30).json()["examples"]
    assert "How many stores, again?" not in [e["question"] for e in taught]  # nothing kept


def test_teaching_counts_against_the_concurrency_limit(server) -> None:
    server.idle()
    out: dict[str, httpx.Response] = {}
    slow = threading.Thread(target=lambda: out.setdefault(
        "slow", _teach(server, "single", "Count for ever?", SLOW)))
    slow.start()
    af = server.service.af
    try:
        _wait_until(lambda: af.shares.held("single") == 1)
        second = _teach(server, "single", "How many stores are there?", GOOD_SQL)
        query = _ask(server, "single", "How many stores are there?", wait=False)
    finally:
        slow.join(4 * SQL_LIMIT_S)
    assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_queries"
    assert query.status_code == 429  # the teach call holds the tenant's one slot
    assert out["slow"].status_code == 422  # the slow SQL hit the time limit: not taught


def test_a_teach_flood_leaves_the_others_reads_fast(server) -> None:
    server.idle()
    af = server.service.af
    threads = [threading.Thread(target=_teach, args=(server, "a", f"Forever {i}?", SLOW))
               for i in range(12)]
    for t in threads:
        t.start()
    try:
        _wait_until(lambda: af.shares.held("a") >= af.shares.cap(af.share_of("a")))
        start = time.perf_counter()
        r = httpx.get(f"{server.url}/v1/databases/bookshop/glossary", headers=auth("b"),
                      timeout=60)
        glossary_s = time.perf_counter() - start
        start = time.perf_counter()
        q = _ask(server, "b", "How many stores are there?", wait=True)
        ask_s = time.perf_counter() - start
    finally:
        for t in threads:
            t.join(6 * SQL_LIMIT_S)
    assert r.status_code == 200 and glossary_s < SQL_LIMIT_S
    assert q.status_code == 200 and q.json()["status"] == "done" and ask_s < SQL_LIMIT_S
