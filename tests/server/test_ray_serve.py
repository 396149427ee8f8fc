"""``agentflow serve --ray local --replicas 2``: the server as a Ray Serve deployment on a
real local Ray, over real HTTP through Serve's proxy on loopback (issue 37). Scripted
instances (not a model). Both replicas join the state store; queries are answered and any
of them can be read back whichever replica ran it; SIGTERM takes the deployment down and
the replicas leave the store cleanly."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed "
                                        "(pip install 'agentflow[serve]')")
httpx = pytest.importorskip("httpx")

from agentflow.bench.serving.served import serve  # noqa: E402
from agentflow.server.testing import scripted_instance  # noqa: E402
from agentflow.state import open_store  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.mark.parametrize("scheduler", [{}, {"shard_hosts": "ray"}], ids=["own", "shared-actors"])
def test_two_serve_replicas_share_the_store_and_answer_any_query(scheduler: dict) -> None:
    """With ``shard_hosts: ray`` both replicas find the same named shard actors (the shared
    scheduler); SIGTERM's undeploy then stops those detached actors as the last one out."""
    config = {"fewshot": None, "pipeline": "chess", "slo_s": 60,
              "instances": [scripted_instance("cpu-0", latency_s=0.01)],
              "server": {"drain_s": 2, "lease_s": 5}, "scheduler": scheduler}
    proc, url, path = serve(config, prefix="agentflow-rayserve-", start_timeout_s=400,
                            extra_args=["--ray", "local", "--replicas", "2"])
    store = open_store(path.parent / "state.sqlite")
    try:
        deadline = time.monotonic() + 120
        while len(store.live_replicas(5.0)) < 2:
            assert time.monotonic() < deadline, "two Serve replicas did not join the store"
            time.sleep(0.5)
        ids = []
        for i in range(8):
            r = httpx.post(f"{url}/v1/queries", json={"question": f"How many stores? {i}",
                                                      "db": "bookshop", "wait": True},
                           timeout=120)
            assert r.status_code == 200 and r.json()["status"] == "done", r.text
            ids.append(r.json()["query_id"])
        owners = {store.get_query(q).owner for q in ids}
        assert owners <= set(store.live_replicas(5.0))
        for query_id in ids:  # whichever replica Serve routes this to answers it
            seen = httpx.get(f"{url}/v1/queries/{query_id}", timeout=60)
            assert seen.status_code == 200 and seen.json()["status"] == "done", seen.text
        assert httpx.get(f"{url}/readyz", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    try:
        assert proc.returncode == 0, out[-3000:]
        assert store.live_replicas(60.0) == [], "the replicas left the store on SIGTERM"
    finally:
        store.close()
