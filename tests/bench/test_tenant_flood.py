"""The tenant flood benchmark measures its victim while the flood is really running: the
flood process (spawned: it imports for seconds on a loaded machine) says when its clients
have started, and the victim waits for that. Before, a fixed 1 s head start let the whole
victim block finish before the flood sent anything ("flooder: 0 requests"). Real server on
loopback, scripted instances (NOT a model)."""

from __future__ import annotations

import argparse
import asyncio

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import httpx

from agentflow.bench.serving.served import stop_server
from agentflow.bench.serving.tenant_flood import Phase, block, start_server

pytestmark = pytest.mark.timeout(240)


def test_the_flood_is_under_way_while_the_victim_is_measured() -> None:
    args = argparse.Namespace(inflight=4, latency=0.01, rate=6.0, concurrent=1, max_active=8,
                              queries=1, flood_clients=4, flood_rps=40.0, max_s=60.0)
    proc, url = start_server(args, limited=True)
    try:
        phase = Phase()

        async def run() -> None:
            async with httpx.AsyncClient(timeout=60) as http:
                await block(http, url, args, True, phase)
        asyncio.run(run())
    finally:
        stop_server(proc, 20)
    assert phase.victim_status == {"200 done": 1}, phase.victim_status
    # the flooder is limited (1 in flight, 6/min): answered or refused, it sent something
    # while the victim asked
    assert sum(phase.flood_status.values()) >= 1, phase.flood_status
