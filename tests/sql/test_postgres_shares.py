"""A tenant's ``pg_sleep`` flood does not hold another tenant's statements (PostgreSQL).

Each tenant may hold at most its share of the database threads (``agentflow.shares``), and a
thread holds at most one pooled connection, so with a pool at least as large as the threads a
flood of one tenant leaves connections for the others. Before the shares, 8 ``pg_sleep`` of one
tenant filled the pool (4 + 4) and the others' statements waited for them (B's max 8.7 s).
A real PostgreSQL server (the session's ``pg_server``), statements through MCP ``run_sql``'s
logic (``AgentflowTools``) as each tenant; who holds what is read from ``pg_stat_activity``.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend
from agentflow.mcp.server import AgentflowTools
from agentflow.tenants import Tenant

pytestmark = [pytest.mark.timeout(180), pytest.mark.postgres]
PASSWORD = "shares-Pa55-word"
SLEEP_S = 6.0
FLOOD = 8  # A's statements at once (within A's own limits: it has none)
A, B = Tenant(name="a"), Tenant(name="b")


@pytest.fixture(scope="module")
def url(pg_server) -> str:
    pg_server.create_database("shares")
    with pg_server.admin_connect("shares") as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS stores (id int PRIMARY KEY)")
        conn.execute("INSERT INTO stores SELECT g FROM generate_series(1, 6) g "
                     "ON CONFLICT DO NOTHING")
    pg_server.create_reader("shares_reader", PASSWORD, "shares")
    with pg_server.admin_connect("shares") as conn:
        conn.execute("GRANT SELECT ON stores TO shares_reader")
    os.environ["SHARES_DB_PASSWORD"] = PASSWORD
    return pg_server.url("shares_reader", "shares")


def _flow(url: str, **config) -> AgentFlow:
    return AgentFlow(AgentFlowConfig(
        fewshot=None, pipeline="single", sql_timeout_s=SLEEP_S + 20,
        databases={"shop": {"url": url, "password_env": "SHARES_DB_PASSWORD", **config.pop(
            "pool", {})}}, **config),
        backends={"cpu-0": ScriptedBackend({}, default="SELECT 1")})


def _sleeping(pg_server) -> int:
    """Statements of the reader running on the server right now (A's, by when it is
    called: a server-side cursor's FETCH waiting for the sleep)."""
    with pg_server.admin_connect("shares") as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = 'shares' "
                            "AND usename = 'shares_reader' AND state = 'active'").fetchone()[0]


async def _flood_then_b(af: AgentFlow, pg_server) -> tuple[float, int, int]:
    tools = AgentflowTools(af)
    deadline = time.monotonic() + SLEEP_S + 10
    while await asyncio.to_thread(_sleeping, pg_server):  # an earlier case's sleeps end
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    flood = [asyncio.ensure_future(tools.run_sql("shop", f"SELECT pg_sleep({SLEEP_S}), {i}",
                                                 caller=A)) for i in range(FLOOD)]
    deadline = time.monotonic() + 20
    while af.shares.held("a") < min(FLOOD, af.shares.cap(af.share_of(A))):
        assert time.monotonic() < deadline, "A's statements never started"
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # A's threads have their connections and are sleeping
    running = await asyncio.to_thread(_sleeping, pg_server)
    start = time.perf_counter()
    out = await tools.run_sql("shop", "SELECT count(*) FROM stores", caller=B)
    b_s = time.perf_counter() - start
    assert out["rows"] == [[6]]
    still = sum(not f.done() for f in flood)
    for f in flood:
        f.cancel()
    await asyncio.gather(*flood, return_exceptions=True)
    return b_s, running, still


@pytest.mark.parametrize("workers", [8, 16])
def test_a_pg_sleep_flood_leaves_the_other_tenant_a_connection(url, pg_server,
                                                                workers: int) -> None:
    # The weighted cap (workers x 1/2), not half this machine's cores, so A could take the
    # whole default pool of 4 + 4 with 16 workers unless the pool is sized to the threads.
    af = _flow(url, db_workers=workers, db_tenant_threads=workers)
    try:
        b_s, running, still = asyncio.run(_flood_then_b(af, pg_server))
    finally:
        af.close()
    cap = workers // 2
    assert running == min(FLOOD, cap)  # A holds its share of the threads and connections
    assert still == FLOOD  # every one of A's statements was still sleeping when B ran
    assert b_s < SLEEP_S / 2, f"B waited {b_s:.1f} s for A's statements"
