"""Issue 35 §3: answers are bounded in bytes, what is kept is bounded, slow readers dropped.

Real SQLite (the demo database), the real uvicorn server on loopback, scripted backends
(NOT models) whose SQL builds 1 MB values. Before: 1,000 rows x 1 MB made a 1 GB answer that
the server kept, and an event stream that never read held its answer as long as it stayed.
"""

from __future__ import annotations

import socket
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402
from agentflow.sql import Database  # noqa: E402
from agentflow.sql.database import row_bytes  # noqa: E402

pytestmark = pytest.mark.timeout(120)
BIG = "replace(printf('%.1000c', 'x'), 'x', printf('%.1000c', 'y'))"  # 1 MB, as in the issue
MEGA = f"SELECT {BIG} AS big FROM stores"  # 12 x 1 MB
MANY = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000) "
        f"SELECT i, {BIG} FROM n")  # 1,000 x 1 MB
CROSS = f"SELECT 1 AS i, {BIG} AS big FROM stores a, stores b, stores c"  # 1,728 x 1 MB


def _script(sql: str):
    def script(request):
        return "stores" if request.stage == "extract_keywords" else sql
    return script


def test_rows_stop_at_the_byte_cap_and_say_so(library_db) -> None:
    with Database.open(library_db) as db:
        capped = db.execute(MANY, max_rows=5000, max_bytes=8_000_000)
        assert capped.truncated and capped.truncated_by == "bytes"
        assert len(capped.rows) == 7 and sum(map(row_bytes, capped.rows)) <= 8_000_000
        default = db.execute(MANY, max_rows=5000)  # the default cap: 16 MiB
        assert default.truncated_by == "bytes" and len(default.rows) == 16
        by_rows = db.execute(MANY, max_rows=3)
        assert by_rows.truncated_by == "rows" and len(by_rows.rows) == 3
        whole = db.execute("SELECT 1", max_rows=3)
        assert not whole.truncated and whole.truncated_by is None


def test_the_answer_says_which_cap_cut_it() -> None:
    config = AgentFlowConfig(fewshot=None, pipeline="single", max_rows=5000)
    with AgentFlow(config, backends={"s": ScriptedBackend(_script(CROSS))}) as af:
        answer = af.ask("big?", db="bookshop", slo=60)
    assert answer.status == "done", answer.error
    assert answer.truncated and answer.truncated_by == "bytes" and len(answer.rows) == 16


def test_kept_answers_are_bounded_in_bytes(monkeypatch) -> None:
    import agentflow.api as api

    monkeypatch.setattr(api, "KEPT_ANSWER_BYTES", 30_000_000)  # two 12 MB answers
    config = AgentFlowConfig(fewshot=None, pipeline="single")
    with AgentFlow(config, backends={"s": ScriptedBackend(_script(MEGA))}) as af:
        ids = []
        for _ in range(4):
            handle = af.submit("big?", "bookshop", slo=60)
            assert handle.result(timeout=60).status == "done"
            ids.append(handle.query_id)
        af.submit("and one more", "bookshop", slo=60).result(timeout=60)  # trims on submit
        kept = [q for q in ids if q in af.handles]
        assert len(kept) <= 2 and ids[-1] in kept
        assert sum(af.handles[q].kept_bytes for q in kept) <= 30_000_000


def test_an_event_stream_that_never_reads_is_dropped(monkeypatch) -> None:
    import agentflow.server.events as events

    monkeypatch.setattr(events, "WRITE_TIMEOUT_S", 1.0, raising=False)
    config = AgentFlowConfig(fewshot=None, pipeline="single")
    with AgentFlow(config, backends={"s": ScriptedBackend(_script(MEGA))}) as af, \
            LiveServer({}, {}, agentflow=af) as live:
        r = httpx.post(f"{live.url}/v1/queries", json={"question": "big?", "db": "bookshop",
                                                        "slo_seconds": 60}, timeout=60)
        assert r.status_code == 200, r.text
        query_id = r.json()["query_id"]
        handle = af.handles[query_id]
        assert handle.result(timeout=60).status == "done"
        with socket.create_connection(("127.0.0.1", live.port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.sendall(f"GET /v1/queries/{query_id}/events HTTP/1.1\r\nHost: x\r\n\r\n"
                         .encode())
            time.sleep(4.0)  # never read: the 12 MB done event cannot be taken in 1 s
            sock.settimeout(5.0)
            got, closed = b"", False
            try:
                while chunk := sock.recv(1 << 16):
                    got += chunk
                closed = True  # the server ended the connection
            except TimeoutError:
                pass  # still open: the server kept waiting on this reader
            assert closed, "a reader that never reads kept its stream"
            assert b"event: done" not in got or len(got) < 12_000_000
