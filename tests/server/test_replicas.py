"""Two replicas over real HTTP (issue 37): two servers (uvicorn on loopback, each its own
engine with a scripted backend — not a model) sharing one state store file. A query started
on one is read, streamed, downloaded, cancelled and followed up through the other; tenant
isolation (404 identical to unknown) holds across them; a tenant limited to N in flight gets
N across both; a restart of both keeps answers and conversations."""

from __future__ import annotations

import threading

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

from agentflow.api import AgentFlow  # noqa: E402
from agentflow.config import AgentFlowConfig  # noqa: E402
from agentflow.llm.scripted import ScriptedBackend  # noqa: E402
from agentflow.server.testing import LiveServer  # noqa: E402
from tests.server.utils import held_calls  # noqa: E402

pytestmark = pytest.mark.timeout(120)

SQL = "SELECT city, count(*) AS n FROM stores GROUP BY city ORDER BY city"
KEYS = {"acme": "acme-key-0001", "bolt": "bolt-key-0002", "duo": "duo-key-0003"}
UNKNOWN = "q-000000000000"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def settings(state: str, name: str) -> dict:
    return {"state": state, "replica_id": name, "lease_s": 3, "admission_wait_s": 5,
            "tenants": [{"name": "acme", "keys": [KEYS["acme"]]},
                        {"name": "bolt", "keys": [KEYS["bolt"]]},
                        {"name": "duo", "keys": [KEYS["duo"]], "max_concurrent": 2}]}


class Pair:
    """Two replicas on one store."""

    def __init__(self, state: str):
        self.engines, self.servers = [], []
        for name in ("r1", "r2"):
            config = AgentFlowConfig(fewshot=None, pipeline="single", slo_s=30)
            backend = ScriptedBackend(
                lambda r: "stores" if r.stage == "extract_keywords" else SQL, latency_s=0.05)
            af = AgentFlow(config, backends={"cpu-0": backend})
            self.engines.append(af)
            self.servers.append(LiveServer({}, settings(state, name), agentflow=af).start())

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        for af in self.engines:
            af.close()


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('replicas') / 'state.sqlite'}"


@pytest.fixture(scope="module")
def pair(state):
    p = Pair(state)
    yield p
    p.close()


def ask(server, who: str, wait: bool = True, **body) -> httpx.Response:
    body = {"question": "How many stores per city?", "db": "bookshop", "wait": wait, **body}
    return httpx.post(f"{server.url}/v1/queries", json=body, headers=auth(who), timeout=60)


def get(server, path: str, who: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers=auth(who), timeout=60)


def same_404(theirs, unknown, their_id: str) -> None:
    assert theirs.status_code == unknown.status_code == 404, (theirs.text, unknown.text)
    assert theirs.text.replace(their_id, "ID") == unknown.text.replace(UNKNOWN, "ID")


def test_a_finished_query_is_read_and_downloaded_through_the_other(pair) -> None:
    one, two = pair.servers
    r = ask(one, "acme")
    assert r.status_code == 200 and r.json()["status"] == "done", r.text
    qid = r.json()["query_id"]
    seen = get(two, f"/v1/queries/{qid}", "acme")
    assert seen.status_code == 200 and seen.json()["rows"] == r.json()["rows"]
    assert seen.json()["sql"] == r.json()["sql"]
    csv = get(two, f"/v1/queries/{qid}/rows.csv", "acme")
    assert csv.status_code == 200 and csv.text.splitlines()[0] == "city,n"
    listed = [q["query_id"] for q in get(two, "/v1/queries", "acme").json()["queries"]]
    assert qid in listed
    for path in ("", "/rows.csv", "/events"):  # another tenant: the very same 404
        same_404(get(two, f"/v1/queries/{qid}{path}", "bolt"),
                 get(two, f"/v1/queries/{UNKNOWN}{path}", "bolt"), qid)
    assert qid not in [q["query_id"] for q in get(two, "/v1/queries", "bolt").json()["queries"]]


def test_a_running_query_is_streamed_and_cancelled_through_the_other(pair) -> None:
    one, two = pair.servers
    with held_calls(one) as hold:
        r = ask(one, "acme", wait=False)
        assert r.status_code == 202, r.text
        qid = r.json()["query_id"]
        hold.wait_held(1)
        assert get(two, f"/v1/queries/{qid}", "acme").json()["status"] in ("pending",
                                                                           "running")
        theirs = httpx.delete(f"{two.url}/v1/queries/{qid}", headers=auth("bolt"), timeout=60)
        unknown = httpx.delete(f"{two.url}/v1/queries/{UNKNOWN}", headers=auth("bolt"),
                               timeout=60)
        same_404(theirs, unknown, qid)
        lines: list[str] = []

        def read() -> None:
            with httpx.stream("GET", f"{two.url}/v1/queries/{qid}/events",
                              headers=auth("acme"), timeout=60) as s:
                assert s.status_code == 200
                lines.extend(s.iter_lines())
        reader = threading.Thread(target=read)
        reader.start()
        gone = httpx.delete(f"{two.url}/v1/queries/{qid}", headers=auth("acme"), timeout=60)
        reader.join(60)
    assert gone.status_code == 200 and gone.json()["status"] == "cancelled", gone.text
    text = "\n".join(lines)
    assert "event: stage_started" in text and "event: done" in text
    assert '"status":"cancelled"' in text
    assert get(one, f"/v1/queries/{qid}", "acme").json()["status"] == "cancelled"


def test_a_follow_up_goes_through_the_other(pair) -> None:
    one, two = pair.servers
    first = ask(one, "acme").json()
    follow = ask(two, "acme", question="and only for Lisbon?",
                 conversation_id=first["conversation_id"])
    assert follow.status_code == 200, follow.text
    assert follow.json()["conversation_id"] == first["conversation_id"]
    theirs = ask(two, "bolt", conversation_id=first["conversation_id"])
    unknown = ask(two, "bolt", conversation_id="c-000000000000")
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["code"] == "conversation_not_found"


def test_a_limit_of_two_in_flight_is_two_across_both(pair) -> None:
    one, two = pair.servers
    with held_calls(one) as h1, held_calls(two) as h2:
        a = ask(one, "duo", wait=False)
        b = ask(two, "duo", wait=False)
        assert a.status_code == b.status_code == 202, (a.text, b.text)
        refused = [ask(s, "duo", wait=False) for s in (one, two)]
        assert [r.status_code for r in refused] == [429, 429], [r.text for r in refused]
        assert all(r.json()["error"]["code"] == "too_many_queries" for r in refused)
        assert "retry-after" in refused[0].headers
        h1.release()
        h2.release()
    for r, s in ((a, one), (b, two)):
        done = httpx.get(f"{s.url}/v1/queries/{r.json()['query_id']}", headers=auth("duo"),
                         timeout=60)
        assert done.status_code == 200
    from tests.utils import wait_until

    wait_until(lambda: ask(one, "duo", wait=False).status_code == 202,
               what="a slot free again once both finished")


def test_a_restart_of_both_keeps_answers_and_conversations(state) -> None:
    first = Pair(state)
    try:
        r = ask(first.servers[0], "acme").json()
    finally:
        first.close()
    again = Pair(state)  # new processes' worth of engines on the same store
    try:
        one, two = again.servers
        seen = get(two, f"/v1/queries/{r['query_id']}", "acme")
        assert seen.status_code == 200 and seen.json()["rows"] == r["rows"]
        follow = ask(one, "acme", question="and in Porto?", conversation_id=r["conversation_id"])
        assert follow.status_code == 200 and follow.json()["status"] == "done", follow.text
    finally:
        again.close()


def test_a_restart_keeps_answers_and_conversations_in_postgresql(pg_server) -> None:
    pg_server.create_database("replica_state")
    state = (f"postgresql://postgres@/replica_state?host={pg_server.socket_dir}"
             f"&port={pg_server.port}")
    test_a_restart_of_both_keeps_answers_and_conversations(state)
    pair = Pair(state)  # and the cross-replica reads work on PostgreSQL as on SQLite
    try:
        test_a_finished_query_is_read_and_downloaded_through_the_other(pair)
    finally:
        pair.close()


def test_resolve_state_order(monkeypatch, tmp_path) -> None:
    from agentflow.server.settings import resolve_state

    monkeypatch.setenv("AGENTFLOW_STATE", "off")
    assert resolve_state(None, None) is None
    assert resolve_state("x.sqlite", "y.sqlite") == "x.sqlite"
    assert resolve_state(None, "y.sqlite") == "y.sqlite"
    monkeypatch.delenv("AGENTFLOW_STATE")
    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path))
    assert resolve_state(None, None, 8123) == str(tmp_path / "server-state-8123.sqlite")


@pytest.mark.parametrize("argv, says", [
    (["--replicas", "2", "--state", "off"], "--replicas needs a state store"),
    (["--replicas", "0"], "at least 1"),
])
def test_replicas_options_fail_clearly_before_anything_starts(argv, says) -> None:
    import subprocess
    import sys

    from tests.utils import ROOT

    done = subprocess.run([sys.executable, "-m", "agentflow", "serve", *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_the_supervisor_restarts_a_replica_that_dies_and_stops_on_request() -> None:
    import sys
    import time

    from agentflow.server.supervisor import Supervisor

    sup = Supervisor([sys.executable, "-c", "import sys; sys.exit(3)"], 1, restart_after_s=0.1)
    thread = threading.Thread(target=lambda: setattr(sup, "code", sup.run(
        install_signals=False)))
    thread.start()
    deadline = time.monotonic() + 60
    while sup.restarts < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    sup.stop()
    thread.join(30)
    assert sup.restarts >= 2 and not thread.is_alive()


def teach_through(server, who: str) -> dict:
    taught = httpx.post(f"{server.url}/v1/databases/bookshop/examples", headers=auth(who),
                        json={"question": "Which cities have a store?",
                              "sql": "SELECT DISTINCT city FROM stores"}, timeout=60)
    assert taught.status_code == 201, taught.text
    term = httpx.post(f"{server.url}/v1/databases/bookshop/glossary", headers=auth(who),
                      json={"term": "Flagship store", "meaning": "the store with most sales"},
                      timeout=60)
    assert term.status_code == 201, term.text
    return taught.json()


def test_taught_pairs_and_glossary_are_shared_by_replicas_on_postgresql(pg_server) -> None:
    """Teaching through one replica reaches the other's pipelines (PostgreSQL state: the
    teaching goes into it, as replicas on many hosts share nothing else); tenants stay
    apart; a delete through the other is seen by the first."""
    pg_server.create_database("replica_teaching")
    state = (f"postgresql://postgres@/replica_teaching?host={pg_server.socket_dir}"
             f"&port={pg_server.port}")
    pair = Pair(state)
    try:
        one, two = pair.servers
        example = teach_through(one, "acme")
        from agentflow.state import open_store

        store = open_store(state)  # it is in the state store (hosts share nothing else)
        try:
            assert store.read("SELECT question FROM af_examples WHERE tenant = ?", "acme") \
                == [("Which cities have a store?",)]
        finally:
            store.close()
        mine = get(two, "/v1/databases/bookshop/examples", "acme").json()
        assert example["id"] in [e["id"] for e in mine["examples"]]
        theirs = get(two, "/v1/databases/bookshop/examples", "bolt").json()
        assert example["id"] not in [e["id"] for e in theirs["examples"]]
        terms = get(two, "/v1/databases/bookshop/glossary", "acme").json()
        assert "Flagship store" in [t["term"] for t in terms["glossary"]]
        # the other replica's engine retrieves it for a question (what pipelines get)
        hits = pair.engines[1].teaching.similar("bookshop", "Which cities have stores?", 1,
                                                tenant="acme")
        assert hits and hits[0].example.sql == "SELECT DISTINCT city FROM stores"
        found = pair.engines[1].teaching.terms_in("bookshop", "sales of the flagship STORE",
                                                  tenant="acme")
        assert [t.term for t in found] == ["Flagship store"]
        gone = httpx.delete(f"{two.url}/v1/databases/bookshop/examples/{example['id']}",
                            headers=auth("acme"), timeout=60)
        assert gone.status_code == 200, gone.text
        after = get(one, "/v1/databases/bookshop/examples", "acme").json()
        assert example["id"] not in [e["id"] for e in after["examples"]]
        shipped = get(one, "/v1/databases/bookshop/examples", "bolt").json()
        assert shipped["examples"], "the demo's shipped pairs are seeded into the store once"
        once = {e["question"] for e in shipped["examples"]}
        assert len(once) == len(shipped["examples"])
    finally:
        pair.close()


def test_where_teaching_lives(tmp_path) -> None:
    from agentflow.server.service import teaching_in_state
    from agentflow.state import open_store

    sqlite_state = open_store(tmp_path / "state.sqlite")
    try:
        assert not teaching_in_state(sqlite_state, None)  # one host: the teaching file
    finally:
        sqlite_state.close()

    class Pg:
        url = "postgresql://h/db"
    assert teaching_in_state(Pg(), None)  # type: ignore[arg-type]
    assert not teaching_in_state(Pg(), "/some/teaching.sqlite")  # type: ignore[arg-type]
