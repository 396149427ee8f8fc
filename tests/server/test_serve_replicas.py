"""``agentflow serve --replicas 2`` as real processes on one port (SO_REUSEPORT), scripted
instances (not a model): both replicas answer, and a replica killed with SIGKILL during 100
queries loses none — each is answered exactly once (one ``done`` event per id in the store),
and the ones that moved say so in their events and their answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.server.testing import free_socket  # noqa: E402
from agentflow.state import open_store  # noqa: E402
from tests.utils import ROOT, wait_until  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SQL = "SELECT count(*) FROM stores"
LEASE_S = 2.0


def start(tmp_path, replicas: int = 2) -> tuple[subprocess.Popen, str, str]:
    config = {"fewshot": None, "pipeline": "single", "slo_s": 120,
              "instances": [{"name": "scripted-0", "max_inflight": 16, "backend": {
                  "type": "scripted", "name": "scripted-0",
                  "answers": {"extract_keywords": "stores"}, "default": SQL,
                  "latency_s": 0.4}}],
              "scheduler": {"max_active_queries": 200, "admit_by_backlog": False},
              "server": {"drain_s": 2, "lease_s": LEASE_S}}
    path = tmp_path / "serve.json"
    path.write_text(json.dumps(config))
    state = str(tmp_path / "state.sqlite")
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTFLOW_")}
    proc = subprocess.Popen([sys.executable, "-m", "agentflow", "serve", "--config", str(path),
                             "--port", str(port), "--state", state, "--replicas", str(replicas),
                             "--log-level", "warning", "--no-access-log"], cwd=ROOT,
                            env={**env, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    store = open_store(state)
    try:
        wait_until(lambda: proc.poll() is None and len(store.live_replicas(LEASE_S)) == replicas
                   and _healthy(url), timeout_s=180, what=f"{replicas} replicas up")
    finally:
        store.close()
    return proc, url, state


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def pids(state: str) -> dict[str, int]:
    store = open_store(state)
    try:
        with store._tx(write=False) as q:
            rows = q("SELECT id, info FROM af_replicas WHERE heartbeat > ?",
                     time.time() - LEASE_S)
    finally:
        store.close()
    return {rid: int(info.split()[1]) for rid, info in rows}


def ask(url: str, i: int) -> str:
    """POST one question on a new connection (so the kernel picks a replica); retried when
    the replica that took the connection is the one killed."""
    for _ in range(20):
        try:
            r = httpx.post(f"{url}/v1/queries", json={
                "question": f"How many stores are there? ({i})", "db": "bookshop",
                "wait": False}, timeout=60)
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if r.status_code == 202 or r.status_code == 200:
            return r.json()["query_id"]
        time.sleep(0.2)
    raise AssertionError(f"query {i} was never accepted")


def final(url: str, qid: str) -> dict:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{url}/v1/queries/{qid}", timeout=30)
            if r.status_code == 200 and r.json()["status"] not in ("pending", "running"):
                return r.json()
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{qid} never finished")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_kill_9_of_one_of_two_replicas_loses_no_query(tmp_path) -> None:
    proc, url, state = start(tmp_path)
    try:
        with ThreadPoolExecutor(8) as pool:
            first = list(pool.map(lambda i: ask(url, i), range(40)))
            store = open_store(state)
            try:
                owners = Counter(store.get_query(q).owner for q in first)
            finally:
                store.close()
            assert len(owners) == 2, owners  # the kernel spread connections over both
            victim_id, victim = max(pids(state).items(), key=lambda kv: owners[kv[0]])
            os.kill(victim, signal.SIGKILL)
            rest = list(pool.map(lambda i: ask(url, i), range(40, 100)))
        ids = first + rest
        answers = {qid: final(url, qid) for qid in ids}
        assert Counter(a["status"] for a in answers.values()) == {"done": 100}, \
            Counter((a["status"], a["error"]) for a in answers.values())
        store = open_store(state)
        try:
            records = {qid: store.get_query(qid) for qid in ids}
            done_events = {qid: sum(e["type"] == "done" for e in store.events(qid))
                           for qid in ids}
        finally:
            store.close()
        assert set(done_events.values()) == {1}, done_events  # answered exactly once each
        moved = [qid for qid, r in records.items() if r.moves]
        assert moved, "no query was in flight on the killed replica"
        assert all(records[q].moves[0]["from"] == victim_id for q in moved)
        for qid in moved:
            assert answers[qid]["details"]["moved"][0]["from"] == victim_id
            events = httpx.get(f"{url}/v1/queries/{qid}/events", timeout=60).text
            assert "event: moved" in events and victim_id in events
        assert all(records[q].owner != victim_id and records[q].attempt == 2 for q in moved)
    finally:
        stop(proc)


def scheduler_process(supervisor: int) -> tuple[int, str]:
    """The supervisor's scheduler process: (pid, its socket), from ``/proc``."""
    from agentflow.bench.serving.replicas_load import children, cmdline

    for pid in children(supervisor):
        args = cmdline(pid)
        if "agentflow.distributed.shard_socket" in args:
            return pid, args[args.index("--socket") + 1]
    raise AssertionError("the supervisor runs no scheduler process")


def test_both_replicas_submit_to_one_scheduler_process_which_may_die(tmp_path) -> None:
    import asyncio

    from agentflow.distributed import shard_socket

    proc, url, state = start(tmp_path)
    try:
        sched_pid, sock = scheduler_process(proc.pid)
        with ThreadPoolExecutor(8) as pool:
            first = list(pool.map(lambda i: ask(url, i), range(16)))
            assert {final(url, q)["status"] for q in first} == {"done"}
            store = open_store(state)
            try:
                owners = Counter(store.get_query(q).owner for q in first)
            finally:
                store.close()
            assert len(owners) == 2, owners  # the kernel spread connections over both
            stats = asyncio.run(shard_socket.stats(sock))
            calls = {c["name"]: c["calls"].get(0, 0) for c in stats["clients"]
                     if c["name"] != "stats" and not c.get("closed")}
            replicas = {f"pid {pid}" for pid in pids(state).values()}
            assert set(calls) == replicas and all(n > 0 for n in calls.values()), \
                (calls, replicas)  # both replicas' calls in the one shard: one queue
            # each child in a session of its own (autogroup: its own share of a busy CPU)
            sessions = {os.getsid(p) for p in [*pids(state).values(), sched_pid]}
            assert len(sessions) == 3 and os.getsid(proc.pid) not in sessions
            rest = list(pool.map(lambda i: ask(url, i), range(16, 32)))
            time.sleep(0.2)  # calls in flight in the scheduler process
            os.kill(sched_pid, signal.SIGKILL)
            answers = [final(url, q) for q in rest]
        assert Counter(a["status"] for a in answers) == {"done": 16}, \
            Counter((a["status"], a["error"]) for a in answers)
        assert scheduler_process(proc.pid)[0] != sched_pid  # the supervisor started another
    finally:
        stop(proc)
