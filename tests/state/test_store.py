"""The state store against a real SQLite file and a real PostgreSQL server (the session's
``pg_server``): the same behaviour from both."""

from __future__ import annotations

import threading
import uuid

import pytest

from agentflow.errors import ConversationNotFoundError
from agentflow.state import QueryRecord, QueryRequest, open_store
from agentflow.state.conversations import StoreConversations
from agentflow.state.limits import StoreLimits
from agentflow.tenants import LimitExceeded, Tenant


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _sqlite(tmp_path, **kw):
    return open_store(f"sqlite:///{tmp_path / 'state.sqlite'}", **kw)


def _pg(pg_server, **kw):
    name = f"state_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(name)
    url = (f"postgresql://postgres@/{name}?host={pg_server.socket_dir}"
           f"&port={pg_server.port}")
    return open_store(url, **kw)


@pytest.fixture(params=["sqlite", "postgres"])
def make(request, tmp_path):
    def build(**kw):
        if request.param == "sqlite":
            return _sqlite(tmp_path, **kw)
        return _pg(request.getfixturevalue("pg_server"), **kw)
    stores = []

    def tracked(**kw):
        s = build(**kw)
        stores.append(s)
        return s
    yield tracked
    for s in stores:
        s.close()


def _query(qid: str, tenant: str | None = "a", owner: str = "r1") -> QueryRecord:
    return QueryRecord(query_id=qid, tenant=tenant, owner=owner,
                       request=QueryRequest(question="How many?", db="bookshop",
                                            pipeline="chess"))


def _answer(qid: str, rows=None) -> dict:
    return {"query_id": qid, "status": "done", "rows": rows or [[1]], "columns": ["n"]}


def test_answers_survive_a_reopen_and_are_written_once(make):
    store = make()
    store.register_replica("r1")
    store.create_query(_query("q1"))
    store.add_event("q1", 1, {"type": "stage_started", "node_id": "a"})
    assert store.finish_query("q1", "r1", _answer("q1"))
    assert not store.finish_query("q1", "r1", _answer("q1"))  # a second answer is refused
    url = store.url
    store.close()
    again = open_store(url)
    try:
        got = again.get_query("q1")
        assert got is not None and got.status == "done" and got.answer["rows"] == [[1]]
        assert again.events("q1") == [{"type": "stage_started", "node_id": "a"}]
        assert got.tenant == "a" and got.request.db == "bookshop"
    finally:
        again.close()


def test_rows_are_capped_by_bytes(make):
    store = make(max_row_bytes=100)
    store.create_query(_query("q1"))
    store.finish_query("q1", "r1", _answer("q1", rows=[[i, "x" * 20] for i in range(50)]))
    got = store.get_query("q1").answer
    assert 0 < len(got["rows"]) < 50 and got["truncated"] is True


def test_a_tenants_flood_evicts_only_its_own(make, request):
    """5,000 queries from tenant A (500 on PostgreSQL, where each commit waits for the
    test server's fsync) leave tenant B's finished queries readable."""
    flood = 500 if "postgres" in request.node.name else 5000
    store = make(keep_per_tenant=50)
    for i in range(5):
        store.create_query(_query(f"b{i}", tenant="b"))
        store.finish_query(f"b{i}", "r1", _answer(f"b{i}"))
    for i in range(flood):
        store.create_query(_query(f"a{i}", tenant="a"))
        store.finish_query(f"a{i}", "r1", _answer(f"a{i}"))
    assert all(store.get_query(f"b{i}").status == "done" for i in range(5))
    assert store.count_queries("a") == 50
    assert store.get_query("a0") is None and store.get_query(f"a{flood - 1}") is not None
    assert [r.query_id for r in store.recent("b", 10)] == [f"b{i}" for i in range(4, -1, -1)]


def test_orphans_move_once_to_a_live_replica(make):
    clock = Clock()
    store = make(clock=clock)
    store.register_replica("r1")
    store.register_replica("r2")
    store.create_query(_query("q1", owner="r1"))
    store.create_query(_query("q2", owner="r2"))
    assert store.claim_orphans("r2", lease_s=5) == []  # r1 is alive
    clock.t += 10
    store.heartbeat("r2")
    moved = store.claim_orphans("r2", lease_s=5)
    assert [r.query_id for r in moved] == ["q1"] and moved[0].attempt == 2
    assert moved[0].moves[0]["from"] == "r1" and moved[0].moves[0]["to"] == "r2"
    assert store.claim_orphans("r2", lease_s=5) == []  # taken once
    assert not store.finish_query("q1", "r1", _answer("q1"))  # the dead owner is refused
    assert store.finish_query("q1", "r2", _answer("q1"))


def test_cancel_requests_reach_the_owner(make):
    store = make()
    store.create_query(_query("q1", owner="r1"))
    assert store.request_cancel("q1", "cancelled by request")
    assert store.cancel_requests("r1") == [("q1", "cancelled by request")]
    store.finish_query("q1", "r1", {"status": "cancelled"})
    assert not store.request_cancel("q1", "again")
    assert store.cancel_requests("r1") == []


def test_conversations_follow_across_store_objects_and_tenants(make):
    one = make()
    two = open_store(one.url)
    try:
        a, b = StoreConversations(one), StoreConversations(two)
        cid = a.start("bookshop", owner="acme")
        a.add(cid, "How many stores?", "SELECT count(*) FROM stores")
        one.sync()  # add is queued (the engine's loop does not wait); commits keep order
        turns = b.follow(cid, "bookshop", viewer=Tenant(name="acme"))
        assert [t.sql for t in turns] == ["SELECT count(*) FROM stores"]
        with pytest.raises(ConversationNotFoundError):
            b.follow(cid, "bookshop", viewer=Tenant(name="other"))
        with pytest.raises(ConversationNotFoundError):
            b.follow("c-unknown", "bookshop", viewer=Tenant(name="other"))
    finally:
        two.close()


def test_concurrency_limit_holds_across_replicas_under_races(make):
    """Two replicas (two store objects, many threads) admitting one tenant with
    max_concurrent=3: exactly 3 admitted, never 6."""
    one = make()
    two = open_store(one.url)
    try:
        one.register_replica("r1")
        one.register_replica("r2")
        tenant = Tenant(name="acme", max_concurrent=3)
        limits = [StoreLimits(one, "r1", 30), StoreLimits(two, "r2", 30)]
        admitted, refused = [], []
        lock = threading.Lock()

        def go(i: int) -> None:
            try:
                ok = limits[i % 2].acquire(tenant)
                with lock:
                    admitted.append((i % 2, ok))
            except LimitExceeded as err:
                with lock:
                    refused.append(err.kind)
        threads = [threading.Thread(target=go, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(admitted) == 3 and set(refused) == {"concurrency"}
        assert limits[0].inflight("acme") == 3
        side = admitted[0][0]
        limits[side].release(tenant)
        limits[side].store.sync()  # queued (the engine's loop releases); commits keep order
        assert limits[1 - side].acquire(tenant)  # a slot freed on one is usable on the other
    finally:
        two.close()


def test_rate_bucket_is_shared(make):
    clock = Clock()
    store = make(clock=clock)
    store.register_replica("r1")
    tenant = Tenant(name="acme", rate_per_min=60, burst=2)
    a, b = StoreLimits(store, "r1", 30), StoreLimits(store, "r2", 30)
    a.acquire(tenant)
    b.acquire(tenant)
    with pytest.raises(LimitExceeded) as err:
        a.acquire(tenant)
    assert err.value.kind == "rate" and 0 < err.value.retry_after_s <= 1.0
    clock.t += 1.0
    b.acquire(tenant)


def test_slots_of_a_dead_replica_do_not_count(make):
    clock = Clock()
    store = make(clock=clock)
    store.register_replica("r1")
    store.register_replica("r2")
    tenant = Tenant(name="acme", max_concurrent=1)
    StoreLimits(store, "r1", 5).acquire(tenant)
    with pytest.raises(LimitExceeded):
        StoreLimits(store, "r2", 5).acquire(tenant)
    clock.t += 10
    store.heartbeat("r2")
    assert StoreLimits(store, "r2", 5).acquire(tenant)


def test_bad_urls_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown state store"):
        open_store("mysql://x")
    with pytest.raises(ValueError, match="must be a file"):
        open_store(":memory:")


# ---------------------------------------------------------------------- the writer thread
def test_a_failing_write_fails_alone_in_its_batch(make):
    """Writes queued while one runs commit together, in order; one that breaks a
    constraint (a second query with the same id) fails alone, under its savepoint."""
    store = make()
    started, go = threading.Event(), threading.Event()

    def slow(q):  # holds the writer so the next three queue up behind it
        started.set()
        go.wait(10)

    def insert(query_id):
        return lambda q: q("INSERT INTO af_queries (id, tenant, status, owner, attempt, "
                           "created, request, moves) VALUES (?, '', 'pending', NULL, 1, 0, "
                           "?, '[]')", query_id, _query(query_id).request.to_json())
    first = store._later(slow)
    assert started.wait(10)
    batches_before = store.writes_committed[0]
    ok1, dup, ok2 = (store._later(insert(i)) for i in ("q1", "q1", "q2"))
    go.set()
    first.result(10)
    ok1.result(10), ok2.result(10)
    with pytest.raises(Exception, match="(?i)unique|duplicate"):
        dup.result(10)
    assert store.get_query("q1") is not None and store.get_query("q2") is not None
    assert store.writes_committed[0] - batches_before <= 2  # one batch, not one each


def test_a_queued_answer_is_readable_everywhere_once_its_future_is_set(make):
    one = make()
    two = open_store(one.url)
    try:
        one.create_query(_query("q1", owner="r1"))
        one.conversation_start("c1", None, "bookshop")
        one.conversation_add("c1", "How many?", "SELECT 1", 4, wait=False)
        future = one.finish_later("q1", "r1", {"status": "done", "rows": [[1]]})
        assert future.result(10) is True
        record = two.get_query("q1")
        assert record is not None and record.status == "done"
        assert two.conversation("c1")[2] == [("How many?", "SELECT 1")]  # queued first
    finally:
        two.close()


def test_close_writes_what_is_queued(tmp_path):
    store = _sqlite(tmp_path)
    store.create_query(_query("q1", owner="r1"))
    for i in range(50):
        store.add_events({"q1": [(i + 1, {"type": "x", "i": i})]}, wait=False)
    store.finish_later("q1", "r1", {"status": "done"})
    store.close()
    again = _sqlite(tmp_path)
    try:
        assert len(again.events("q1")) == 50 and again.get_query("q1").status == "done"
    finally:
        again.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.create_query(_query("q2"))


def test_many_threads_share_few_commits(tmp_path):
    """Group commit: 8 threads creating 25 queries each commit in fewer transactions than
    writes, and every query is there."""
    store = _sqlite(tmp_path)
    try:
        def work(t: int) -> None:
            for i in range(25):
                store.create_query(_query(f"t{t}-{i}"))
        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        batches, writes = store.writes_committed
        assert store.count_queries("a") == 200
        assert writes >= 200 and batches < writes
    finally:
        store.close()


# ---------------------------------------------------------------------- taught pairs, glossary
def test_teaching_in_the_store_keeps_scopes_and_replaces(make):
    from agentflow.state.teaching import StoreTeaching
    from agentflow.teaching import TeachingError

    one = make()
    two = open_store(one.url)
    try:
        a, b = StoreTeaching(one), StoreTeaching(two)
        shared = a.add_example("bookshop", "How many stores?", "SELECT count(*) FROM stores;")
        own = a.add_example("bookshop", "Cities?", "SELECT city FROM stores", tenant="acme")
        again = b.add_example("bookshop", "Cities?", "SELECT DISTINCT city FROM stores",
                              tenant="acme")
        assert again.id == own.id  # taught again: replaced, not added
        assert [e.sql for e in b.examples("bookshop", tenant="acme")] == [
            "SELECT count(*) FROM stores", "SELECT DISTINCT city FROM stores"]
        assert [e.id for e in b.examples("bookshop", tenant="bolt")] == [shared.id]
        assert not b.delete_example("bookshop", own.id, tenant="bolt")  # not bolt's
        assert not b.delete_example("bookshop", "99999999999999999999")
        assert b.delete_example("bookshop", own.id, tenant="acme")
        assert [e.id for e in a.examples("bookshop", tenant="acme")] == [shared.id]
        term = a.add_term("bookshop", "Active  customer", "ordered in the last 90 days",
                          tenant="acme")
        assert b.add_term("bookshop", "active customer", "ordered this year",
                          tenant="acme").id == term.id  # the same term, any case
        found = b.terms_in("bookshop", "list every ACTIVE customer", tenant="acme")
        assert [(t.term, t.meaning) for t in found] == [("Active customer",
                                                          "ordered this year")]
        assert b.terms_in("bookshop", "list every active customer", tenant="bolt") == []
        assert b.delete_term("bookshop", "ACTIVE customer", tenant="acme")
        assert a.glossary("bookshop", tenant="acme") == []
        with pytest.raises(TeachingError, match="empty"):
            a.add_example("bookshop", "  ", "SELECT 1")
        with pytest.raises(TeachingError, match="no words"):
            a.add_term("bookshop", "!!", "nothing")
    finally:
        two.close()


def test_shipped_teaching_is_seeded_once_by_racing_replicas(make):
    from agentflow.state.teaching import StoreTeaching

    one = make()
    stores = [one, open_store(one.url), open_store(one.url)]
    try:
        seeded = []
        threads = [threading.Thread(target=lambda s=s: seeded.append(StoreTeaching(s).seed(
            "bookshop", "v1", [("How many stores?", "SELECT count(*) FROM stores")],
            [("flagship", "the biggest store")]))) for s in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(seeded) == [False, False, True]
        assert len(StoreTeaching(one).examples("bookshop")) == 1
        assert len(StoreTeaching(one).glossary("bookshop")) == 1
    finally:
        for s in stores[1:]:
            s.close()


def test_a_state_url_as_teaching_store_opens_the_state_stores_tables(tmp_path):
    """``teaching_store: sqlite:///...`` or ``postgresql://...`` in a config (a server's,
    or ``agentflow teach --config``'s) teaches into that state store."""
    from agentflow.state.teaching import StoreTeaching
    from agentflow.state.teaching import open_teaching_store as open_teaching

    url = f"sqlite:///{tmp_path / 'state.sqlite'}"
    teaching = open_teaching(url)
    try:
        assert isinstance(teaching, StoreTeaching)
        assert teaching.examples("bookshop"), "the demo's shipped pairs are seeded"
        teaching.add_example("bookshop", "Any stores?", "SELECT 1 FROM stores LIMIT 1")
    finally:
        teaching.state.close()
    store = open_store(url)
    try:
        assert ("Any stores?",) in store.read("SELECT question FROM af_examples")
    finally:
        store.close()
