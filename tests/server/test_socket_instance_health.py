"""``agentflow serve --replicas 2`` (one scheduler process, replicas without a coordinator):
/v1/instances, /healthz and /metrics show the instances' health as the scheduler process
sees it, as a one-process server shows its own. Real processes on a loopback port, scripted
instances (NOT a model): scripted-1 fails every call, so its circuit opens and its calls
move to scripted-0. Before the scheduler socket carried a health report, both replicas said
``healthy`` for an instance that was down and /metrics had no health series at all."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.state import open_store  # noqa: E402
from tests.utils import ROOT, wait_until  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SQL = "SELECT count(*) FROM stores"
LEASE_S = 2.0


def port_in_range(lo: int = 21200, hi: int = 21300) -> int:
    """A free port of this suite's range (21200-21299)."""
    for port in range(lo, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 21200-21299")


def instance(i: int, faults: list[dict]) -> dict:
    return {"name": f"scripted-{i}", "max_inflight": 8, "backend": {
        "type": "scripted", "name": f"scripted-{i}", "answers": {"extract_keywords": "stores"},
        "default": SQL, "latency_s": 0.02, "faults": faults}}


def fresh_get(url: str) -> httpx.Response:
    """A GET on a connection of its own, so the kernel picks the replica each time."""
    with httpx.Client(timeout=30) as http:
        return http.get(url)


def test_both_replicas_show_the_scheduler_process_view_of_instance_health(tmp_path) -> None:
    config = {"fewshot": None, "pipeline": "single", "slo_s": 120,
              "instances": [instance(0, []), instance(1, [{"fail": True, "retryable": True}])],
              "scheduler": {"max_active_queries": 100, "admit_by_backlog": False,
                            "revive_after_s": 600, "health": {"failures_to_open": 2}},
              "server": {"drain_s": 2, "lease_s": LEASE_S}}
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(config))
    state = str(tmp_path / "state.sqlite")
    port = port_in_range()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTFLOW_")}
    proc = subprocess.Popen([sys.executable, "-m", "agentflow", "serve", "--config", str(path),
                             "--port", str(port), "--state", state, "--replicas", "2",
                             "--log-level", "warning", "--no-access-log"], cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    store = open_store(state)
    try:
        wait_until(lambda: proc.poll() is None and len(store.live_replicas(LEASE_S)) == 2,
                   timeout_s=180, what="2 replicas up")
        wait_until(lambda: _status(f"{url}/healthz") == 200, timeout_s=60, what="healthy")
        # 16 at once, so that the scheduler uses both instances; every query is answered,
        # on scripted-0 once scripted-1's calls fail over
        def ask(i: int) -> dict:
            r = httpx.post(f"{url}/v1/queries", json={
                "question": f"How many stores are there? ({i})", "db": "bookshop",
                "wait": True}, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(16)))
        assert all(a["status"] == "done" for a in answers), answers
        seen = 0
        for _ in range(12):  # fresh connections: both replicas answer some of these
            listed = {i["name"]: i for i in fresh_get(f"{url}/v1/instances").json()["instances"]}
            down = listed["scripted-1"]
            assert down["health"] in ("down", "probing"), listed
            assert down["reason"], listed
            assert listed["scripted-0"]["health"] == "healthy" and listed["scripted-0"]["up"]
            seen += 1
            health = fresh_get(f"{url}/healthz").json()
            assert health["status"] in ("degraded", "ok"), health
            text = fresh_get(f"{url}/metrics").text
            states = dict(re.findall(r'^agentflow_instance_health\{instance="scripted-1",'
                                     r'state="(\w+)"\} ([0-9.]+)$', text, re.M))
            assert states and (states["down"] == "1.0" or states["probing"] == "1.0"), states
            outages = re.search(r'^agentflow_instance_outages_total\{instance="scripted-1"\} '
                                r'([0-9.]+)$', text, re.M)
            assert outages and float(outages.group(1)) >= 1, text[:2000]
            assert re.search(r'^agentflow_instance_health\{instance="scripted-0",'
                             r'state="healthy"\} 1\.0$', text, re.M)
        assert seen == 12
    finally:
        store.close()
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _status(url: str) -> int:
    try:
        return fresh_get(url).status_code
    except httpx.TransportError:
        return 0
