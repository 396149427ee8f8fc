"""The fault benchmark's scenarios, small: one instance hangs, answers non-retryable
errors, dies and comes back, or slows 10x — no query is lost, hung or failed, and the
client's counts agree with /metrics. (The full run, 200 queries x 20 clients with the P99
check, is ``agentflow bench fault_test``.) Scripted instances, NOT models."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.bench.serving.fault_test import run_scenario

pytestmark = pytest.mark.timeout(120)
# Enough queries that the run outlasts the start of "dies"' window (1 s after the instance's
# first call) on a fast idle machine too: 40 queries took ~1.6 s here, and a run that ends
# before the window opens never sees the instance die (0 outages).
QUERIES = 100


@pytest.mark.parametrize("scenario", ["hang", "errors", "dies", "slow"])
def test_a_misbehaving_instance_loses_hangs_and_fails_no_query(scenario: str) -> None:
    args = argparse.Namespace(queries=QUERIES, clients=8, inflight=4, latency=0.01, max_active=40,
                              retries=1000, timeout=60.0, policy="flowsage",
                              pipeline="chess", slo=5.0, instances=2, url=None, key=None)
    r = run_scenario(scenario, args)
    assert r["by"] == {"done": QUERIES}, (r["by"], r["reasons"])
    assert r["agree"], (r["server_total"], r["client_total"])
    if scenario in ("hang", "errors", "dies"):
        assert r["outages"] >= 1  # the instance was taken out of service
        assert r["retried"] >= 1
    if scenario == "hang":
        assert r["timeouts"] >= 1 and r["rerun"] >= 1
