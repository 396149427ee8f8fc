"""The state store: what every replica of the server must see alike, in one database.

Queries (request, status, events, answer with rows up to a byte cap), conversations,
per-tenant usage (rate buckets, concurrency slots) and the replicas themselves (a heartbeat
each, so the others can tell when one died and take over its queries). Two engines behind
one class: SQLite (a file; the default for one host — WAL lets several processes share it)
and PostgreSQL (``postgresql://...``) for many hosts. The SQL is the same for both; they
differ in how a connection is made, how a write transaction takes its lock and the
placeholder style, which is all the subclasses say.

Why the store and not the processes hold this: a restart, a second replica or a replica that
dies must not lose an answer or double a tenant's limits; every limit is checked and taken
in one transaction, so two replicas admitting at once cannot both take the last slot.

Retention is per tenant: finishing a query forgets that tenant's oldest finished queries
beyond ``keep_per_tenant`` — another tenant's flood never evicts yours.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from agentflow.state.records import FINAL, QueryRecord, QueryRequest, cap_rows
from agentflow.state.writer import Writer, log_failure

T = TypeVar("T")

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS af_replicas (
        id TEXT PRIMARY KEY, info TEXT NOT NULL, started DOUBLE PRECISION NOT NULL,
        heartbeat DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS af_queries (
        id TEXT PRIMARY KEY, tenant TEXT NOT NULL, status TEXT NOT NULL, owner TEXT,
        attempt INTEGER NOT NULL, created DOUBLE PRECISION NOT NULL,
        finished DOUBLE PRECISION, request TEXT NOT NULL, answer TEXT, cancel TEXT,
        moves TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS af_queries_tenant ON af_queries (tenant, finished)",
    "CREATE INDEX IF NOT EXISTS af_queries_open ON af_queries (owner, finished)",
    """CREATE TABLE IF NOT EXISTS af_events (
        query_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL,
        PRIMARY KEY (query_id, seq))""",
    """CREATE TABLE IF NOT EXISTS af_conversations (
        id TEXT PRIMARY KEY, tenant TEXT NOT NULL, db TEXT NOT NULL, turns TEXT NOT NULL,
        updated DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS af_conversations_tenant ON af_conversations (tenant, updated)",
    """CREATE TABLE IF NOT EXISTS af_buckets (
        tenant TEXT PRIMARY KEY, tokens DOUBLE PRECISION NOT NULL,
        at DOUBLE PRECISION NOT NULL, rate DOUBLE PRECISION NOT NULL,
        size DOUBLE PRECISION NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS af_slots (
        token TEXT PRIMARY KEY, tenant TEXT NOT NULL, replica TEXT NOT NULL,
        since DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS af_slots_tenant ON af_slots (tenant)",
    # taught pairs and glossary (agentflow.state.teaching); {id}: the engine's row id
    """CREATE TABLE IF NOT EXISTS af_examples (
        id {id}, tenant TEXT NOT NULL, db TEXT NOT NULL, question TEXT NOT NULL,
        sql TEXT NOT NULL, created DOUBLE PRECISION NOT NULL, UNIQUE (tenant, db, question))""",
    """CREATE TABLE IF NOT EXISTS af_glossary (
        id {id}, tenant TEXT NOT NULL, db TEXT NOT NULL, term TEXT NOT NULL,
        term_key TEXT NOT NULL, meaning TEXT NOT NULL, created DOUBLE PRECISION NOT NULL,
        UNIQUE (tenant, db, term_key))""",
    """CREATE TABLE IF NOT EXISTS af_seeded (
        db TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (db, tag))""",
]

_SCHEMA_LOCK = 0x61660037  # PostgreSQL advisory lock id around schema creation


def _scope(tenant: str | None) -> str:
    return tenant or ""


def _tenant(scope: str) -> str | None:
    return scope or None


class StateStore:
    """The shared SQL; subclasses give ``_connect``, ``_begin`` and the placeholder."""

    placeholder = "?"
    url = ""
    id_type = "INTEGER PRIMARY KEY"  # a row id the database numbers (SQLite's rowid)

    def __init__(self, *, keep_per_tenant: int = 1000, max_row_bytes: int = 1_000_000,
                 keep_conversations: int = 1000, clock: Callable[[], float] = time.time,
                 writer: bool = True):
        if keep_per_tenant < 1 or keep_conversations < 1 or max_row_bytes < 0:
            raise ValueError("keep_per_tenant and keep_conversations must be >= 1, "
                             "max_row_bytes >= 0")
        self.keep_per_tenant = keep_per_tenant
        self.keep_conversations = keep_conversations
        self.max_row_bytes = max_row_bytes
        self.clock = clock
        self._local = threading.local()
        self._all: list[Any] = []
        self._all_lock = threading.Lock()
        self._closed = False
        self._use_writer = writer
        self._writer: Writer | None = None

    # ------------------------------------------------------------------ engine specifics
    def _connect(self) -> Any:
        raise NotImplementedError

    def _begin(self, conn: Any, write: bool) -> None:
        raise NotImplementedError

    def _lock_tenant(self, cur: Any, tenant: str) -> None:
        """Serialise read-modify-write of one tenant's usage (SQLite's write lock already
        serialises every writer)."""

    def _conn(self) -> Any:
        if self._closed:
            raise RuntimeError("the state store is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Callable[..., list[tuple]]]:
        """A transaction; yields ``q(sql, *params) -> rows``."""
        conn = self._conn()
        self._begin(conn, write)
        try:
            def q(sql: str, *params: Any) -> list[tuple]:
                cur = conn.execute(self._sql(sql), params)
                return list(cur.fetchall()) if cur.description else []
            yield q
        except BaseException:
            try:
                conn.rollback()
            except Exception:  # noqa: BLE001 - a broken connection: make a new one next time
                pass
            if getattr(conn, "closed", False) or getattr(conn, "broken", False):
                self._local.conn = None
            raise
        else:
            conn.commit()

    def create_schema(self) -> None:
        with self._tx() as q:
            for statement in SCHEMA:
                q(statement.replace("{id}", self.id_type))

    def read(self, sql: str, *params: Any) -> list[tuple]:
        """Rows of one read-only statement (for the store's other users, e.g. teaching)."""
        with self._tx(write=False) as q:
            return q(sql, *params)

    def write(self, op: Callable[[Callable[..., list[tuple]]], T]) -> T:
        """Run ``op(q)`` as one write, committed before this returns."""
        return self._write(op)

    def _write(self, op: Callable[[Callable[..., list[tuple]]], T]) -> T:
        """Run the write ``op(q)`` and return what it returned, once committed (through
        the writer thread, see ``agentflow.state.writer``, unless the store has none)."""
        return self._later(op).result()

    def _later(self, op: Callable[[Callable[..., list[tuple]]], T], what: str = ""
               ) -> Future[T]:
        """Queue the write ``op(q)``; the future is set once it is committed. With
        ``what``, nobody waits: a failure is logged under that name."""
        if self._closed:
            raise RuntimeError("the state store is closed")
        if not self._use_writer:
            future: Future[T] = Future()
            try:
                with self._tx() as q:
                    result = op(q)
            except Exception as err:  # noqa: BLE001 - handed to the caller
                future.set_exception(err)
            else:
                future.set_result(result)
        else:
            with self._all_lock:
                if self._writer is None:
                    self._writer = Writer(self._tx, name=type(self).__name__)
            future = self._writer.submit(op)
        if what:
            future.add_done_callback(log_failure(what))
        return future

    def sync(self) -> None:
        """Until every write queued so far is committed (they commit in order)."""
        self._write(lambda q: None)

    @property
    def writes_committed(self) -> tuple[int, int]:
        """(transactions, writes) the writer thread has committed so far."""
        w = self._writer
        return (w.batches, w.writes) if w is not None else (0, 0)

    def close(self) -> None:
        if self._writer is not None:  # what is queued is written first
            self._writer.close()
        self._closed = True
        with self._all_lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a connection of a finished thread
                pass

    # ------------------------------------------------------------------ replicas
    def register_replica(self, replica_id: str, info: str = "") -> None:
        now = self.clock()
        self._write(lambda q: q(
            "INSERT INTO af_replicas (id, info, started, heartbeat) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET heartbeat = excluded.heartbeat",
            replica_id, info, now, now))

    def heartbeat(self, replica_id: str) -> None:
        now = self.clock()
        self._write(lambda q: q("UPDATE af_replicas SET heartbeat = ? WHERE id = ?", now,
                                replica_id))

    def deregister_replica(self, replica_id: str) -> None:
        """A clean exit: its slots go (its queries were answered or cancelled first)."""
        def op(q: Callable[..., list[tuple]]) -> None:
            q("DELETE FROM af_slots WHERE replica = ?", replica_id)
            q("DELETE FROM af_replicas WHERE id = ?", replica_id)
        self._write(op)

    def live_replicas(self, lease_s: float) -> list[str]:
        with self._tx(write=False) as q:
            return [r[0] for r in q("SELECT id FROM af_replicas WHERE heartbeat > ? "
                                    "ORDER BY id", self.clock() - lease_s)]

    # ------------------------------------------------------------------ queries
    def create_query(self, record: QueryRecord) -> None:
        created = record.created or self.clock()
        self._write(lambda q: q(
              "INSERT INTO af_queries (id, tenant, status, owner, attempt, created, finished, "
              "request, answer, cancel, moves) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, NULL, NULL, "
              "'[]')", record.query_id, _scope(record.tenant), record.status, record.owner,
              record.attempt, created, record.request.to_json()))

    def set_status(self, query_id: str, owner: str, status: str) -> None:
        self._write(lambda q: q(
            "UPDATE af_queries SET status = ? WHERE id = ? AND owner = ? AND finished IS NULL",
            status, query_id, owner))

    def add_event(self, query_id: str, seq: int, event: dict[str, Any]) -> None:
        self.add_events({query_id: [(seq, event)]})

    def add_events(self, events: dict[str, list[tuple[int, dict[str, Any]]]],
                   running: Iterable[str] = (), owner: str | None = None, *,
                   wait: bool = True) -> None:
        """Many queries' events (by query id: ``(seq, event)``) in one transaction, and the
        queries of ``owner`` that have started running (a replica writes in batches: one
        commit per event would cost more than the query's own work). ``wait=False``:
        queued, not waited on (a failure is logged)."""
        rows = _event_rows(events)
        marks = list(running)

        def op(q: Callable[..., list[tuple]]) -> None:
            _insert_rows(q, rows)
            for query_id in marks:
                q("UPDATE af_queries SET status = 'running' WHERE id = ? AND owner = ? AND "
                  "finished IS NULL", query_id, owner)
        future = self._later(op, "" if wait else "writing events")
        if wait:
            future.result()

    def events(self, query_id: str, after: int = 0) -> list[dict[str, Any]]:
        """Events with ``seq > after``, in order (seq counts from 1)."""
        with self._tx(write=False) as q:
            rows = q("SELECT body FROM af_events WHERE query_id = ? AND seq > ? ORDER BY seq",
                     query_id, after)
        return [json.loads(r[0]) for r in rows]

    def last_seq(self, query_id: str) -> int:
        with self._tx(write=False) as q:
            rows = q("SELECT max(seq) FROM af_events WHERE query_id = ?", query_id)
        return int(rows[0][0] or 0)

    def finish_query(self, query_id: str, owner: str, answer: dict[str, Any],
                     events: Iterable[tuple[int, dict[str, Any]]] = ()) -> bool:
        """Store the answer — once: only the query's owner, and only the first time, may
        (a replica taken for dead that still finishes is refused) — with the query's last
        ``events`` in the same transaction. Then forget the tenant's oldest finished
        queries beyond ``keep_per_tenant``."""
        return self.finish_later(query_id, owner, answer, events, logged=False).result()

    def finish_later(self, query_id: str, owner: str, answer: dict[str, Any],
                     events: Iterable[tuple[int, dict[str, Any]]] = (), *,
                     logged: bool = True) -> Future[bool]:
        """``finish_query`` queued, not waited on (the replica serves the answer from
        memory meanwhile); its future says whether it was stored; a failure is logged."""
        status = answer.get("status", "failed")
        if status not in FINAL:
            raise ValueError(f"not a final status: {status!r}")
        body = json.dumps(cap_rows(answer, self.max_row_bytes), default=str,
                          separators=(",", ":"))
        rows = _event_rows({query_id: list(events)})
        now = self.clock()

        def op(q: Callable[..., list[tuple]]) -> bool:
            found = q("UPDATE af_queries SET status = ?, finished = ?, answer = ? "
                      "WHERE id = ? AND owner = ? AND finished IS NULL RETURNING tenant",
                      status, now, body, query_id, owner)
            if not found:
                return False
            _insert_rows(q, rows)
            self._retain(q, found[0][0])
            return True
        return self._later(op, f"storing the answer of {query_id}" if logged else "")

    def _retain(self, q: Callable[..., list[tuple]], scope: str) -> None:
        (count,) = q("SELECT count(*) FROM af_queries WHERE tenant = ? AND finished IS NOT "
                     "NULL", scope)[0]
        excess = int(count) - self.keep_per_tenant
        if excess <= 0:
            return
        old = [r[0] for r in q("SELECT id FROM af_queries WHERE tenant = ? AND finished IS NOT "
                               "NULL ORDER BY finished, id LIMIT ?", scope, excess)]
        for query_id in old:
            q("DELETE FROM af_events WHERE query_id = ?", query_id)
            q("DELETE FROM af_queries WHERE id = ?", query_id)

    def get_query(self, query_id: str) -> QueryRecord | None:
        with self._tx(write=False) as q:
            rows = q(f"SELECT {_COLUMNS} FROM af_queries WHERE id = ?", query_id)
        return _record(rows[0]) if rows else None

    def recent(self, tenant: str | None, limit: int, *, everyone: bool = False
               ) -> list[QueryRecord]:
        """Newest first: ``tenant``'s queries, or everyone's."""
        with self._tx(write=False) as q:
            if everyone:
                rows = q(f"SELECT {_COLUMNS} FROM af_queries ORDER BY created DESC, id "
                         "LIMIT ?", limit)
            else:
                rows = q(f"SELECT {_COLUMNS} FROM af_queries WHERE tenant = ? "
                         "ORDER BY created DESC, id LIMIT ?", _scope(tenant), limit)
        return [_record(r) for r in rows]

    def count_queries(self, tenant: str | None) -> int:
        with self._tx(write=False) as q:
            return int(q("SELECT count(*) FROM af_queries WHERE tenant = ?",
                         _scope(tenant))[0][0])

    def request_cancel(self, query_id: str, reason: str) -> bool:
        """Ask the owner to cancel; False when the query has finished (or is unknown)."""
        rows = self._write(lambda q: q("UPDATE af_queries SET cancel = ? WHERE id = ? AND "
                                       "finished IS NULL RETURNING id", reason, query_id))
        return bool(rows)

    def cancel_requests(self, owner: str) -> list[tuple[str, str]]:
        with self._tx(write=False) as q:
            rows = q("SELECT id, cancel FROM af_queries WHERE owner = ? AND finished IS NULL "
                     "AND cancel IS NOT NULL", owner)
        return [(r[0], r[1]) for r in rows]

    def claim_orphans(self, me: str, lease_s: float, limit: int = 100) -> list[QueryRecord]:
        """Take over unfinished queries whose owner's heartbeat is older than ``lease_s``:
        each moves to ``me`` at most once per death (compare-and-set on the owner), with
        the move noted in its record."""
        now = self.clock()

        def op(q: Callable[..., list[tuple]]) -> list[QueryRecord]:
            claimed = []
            rows = q(f"SELECT {_COLUMNS} FROM af_queries WHERE finished IS NULL AND "
                     "(owner IS NULL OR owner <> ?) AND (owner IS NULL OR owner NOT IN "
                     "(SELECT id FROM af_replicas WHERE heartbeat > ?)) ORDER BY created "
                     "LIMIT ?", me, now - lease_s, limit)
            for row in rows:
                record = _record(row)
                move = {"from": record.owner, "to": me, "at": now}
                moves = [*record.moves, move]
                done = q("UPDATE af_queries SET owner = ?, attempt = attempt + 1, moves = ?, "
                         "status = 'pending' WHERE id = ? AND finished IS NULL AND "
                         + ("owner IS NULL" if record.owner is None else "owner = ?")
                         + " RETURNING attempt", me, json.dumps(moves), record.query_id,
                         *(() if record.owner is None else (record.owner,)))
                if done:
                    record.owner, record.attempt, record.moves = me, int(done[0][0]), moves
                    record.status = "pending"
                    claimed.append(record)
            if rows:  # the dead replicas' slots are no longer held
                q("DELETE FROM af_slots WHERE replica NOT IN (SELECT id FROM af_replicas "
                  "WHERE heartbeat > ?)", now - lease_s)
            return claimed
        return self._write(op)

    # ------------------------------------------------------------------ conversations
    def conversation_start(self, conversation_id: str, tenant: str | None, db: str) -> None:
        scope = _scope(tenant)
        now = self.clock()

        def op(q: Callable[..., list[tuple]]) -> None:
            q("INSERT INTO af_conversations (id, tenant, db, turns, updated) "
              "VALUES (?, ?, ?, '[]', ?) ON CONFLICT (id) DO NOTHING",
              conversation_id, scope, db, now)
            (count,) = q("SELECT count(*) FROM af_conversations WHERE tenant = ?", scope)[0]
            excess = int(count) - self.keep_conversations
            if excess > 0:
                for (old,) in q("SELECT id FROM af_conversations WHERE tenant = ? "
                                "ORDER BY updated, id LIMIT ?", scope, excess):
                    q("DELETE FROM af_conversations WHERE id = ?", old)
        self._write(op)

    def conversation(self, conversation_id: str
                     ) -> tuple[str | None, str, list[tuple[str, str]]] | None:
        """(tenant, db, turns) of a conversation, or None."""
        with self._tx(write=False) as q:
            rows = q("SELECT tenant, db, turns FROM af_conversations WHERE id = ?",
                     conversation_id)
        if not rows:
            return None
        tenant, db, turns = rows[0]
        return _tenant(tenant), db, [(t[0], t[1]) for t in json.loads(turns)]

    def conversation_add(self, conversation_id: str, question: str, sql: str,
                         max_turns: int, *, wait: bool = True) -> None:
        """Append a turn (``wait=False``: queued; the next follow-up, on any replica, is
        at least a client round trip later)."""
        now = self.clock()

        def op(q: Callable[..., list[tuple]]) -> None:
            rows = q("SELECT turns FROM af_conversations WHERE id = ?", conversation_id)
            if not rows:
                return
            turns = [*json.loads(rows[0][0]), [question, sql]][-max_turns:]
            q("UPDATE af_conversations SET turns = ?, updated = ? WHERE id = ?",
              json.dumps(turns), now, conversation_id)
        future = self._later(op, "" if wait else f"adding a turn to {conversation_id}")
        if wait:
            future.result()

    def conversation_put(self, conversation_id: str, tenant: str | None, db: str,
                         turns: list[tuple[str, str]]) -> None:
        body, now = json.dumps([list(t) for t in turns]), self.clock()
        self._write(lambda q: q(
            "INSERT INTO af_conversations (id, tenant, db, turns, updated) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET turns = excluded.turns, "
            "db = excluded.db, updated = excluded.updated", conversation_id,
            _scope(tenant), db, body, now))

    # ------------------------------------------------------------------ usage
    def acquire(self, tenant: str, *, replica: str, lease_s: float,
                max_concurrent: int | None = None, rate_per_s: float | None = None,
                burst: float | None = None) -> tuple[str | None, str, float]:
        """Admit one query of ``tenant`` across every replica, in one transaction:
        ``(token, "", 0)`` — token is None without a concurrency limit — or
        ``(None, "concurrency" | "rate", seconds to wait)``. Slots of replicas whose
        heartbeat is older than ``lease_s`` do not count (they died holding them)."""
        now = self.clock()

        def op(q: Callable[..., list[tuple]]) -> tuple[str | None, str, float]:
            self._lock_tenant(q, tenant)
            if max_concurrent is not None:
                (held,) = q("SELECT count(*) FROM af_slots s JOIN af_replicas r ON "
                            "r.id = s.replica WHERE s.tenant = ? AND r.heartbeat > ?",
                            tenant, now - lease_s)[0]
                if int(held) >= max_concurrent:
                    return None, "concurrency", 1.0
            if rate_per_s is not None:
                size = float(burst or max(1, math.floor(rate_per_s * 60)))
                rows = q("SELECT tokens, at, rate, size FROM af_buckets WHERE tenant = ?",
                         tenant)
                if rows and rows[0][2] == rate_per_s and rows[0][3] == size:
                    tokens = min(size, rows[0][0] + max(0.0, now - rows[0][1]) * rate_per_s)
                else:
                    tokens = size
                if tokens < 1.0:
                    q("INSERT INTO af_buckets (tenant, tokens, at, rate, size) VALUES "
                      "(?, ?, ?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET tokens = "
                      "excluded.tokens, at = excluded.at, rate = excluded.rate, "
                      "size = excluded.size", tenant, tokens, now, rate_per_s, size)
                    return None, "rate", (1.0 - tokens) / rate_per_s
                q("INSERT INTO af_buckets (tenant, tokens, at, rate, size) VALUES "
                  "(?, ?, ?, ?, ?) ON CONFLICT (tenant) DO UPDATE SET tokens = "
                  "excluded.tokens, at = excluded.at, rate = excluded.rate, "
                  "size = excluded.size", tenant, tokens - 1.0, now, rate_per_s, size)
            if max_concurrent is None:
                return None, "", 0.0
            token = uuid.uuid4().hex
            q("INSERT INTO af_slots (token, tenant, replica, since) VALUES (?, ?, ?, ?)",
              token, tenant, replica, now)
            return token, "", 0.0
        return self._write(op)

    def take_slot(self, tenant: str, replica: str) -> str:
        """A slot without a check: for a query admitted before (moved after a death)."""
        token, now = uuid.uuid4().hex, self.clock()
        self._write(lambda q: q("INSERT INTO af_slots (token, tenant, replica, since) "
                                "VALUES (?, ?, ?, ?)", token, tenant, replica, now))
        return token

    def release(self, token: str, *, wait: bool = True) -> None:
        future = self._later(lambda q: q("DELETE FROM af_slots WHERE token = ?", token),
                             "" if wait else "releasing a slot")
        if wait:
            future.result()

    def inflight(self, tenant: str, lease_s: float) -> int:
        with self._tx(write=False) as q:
            return int(q("SELECT count(*) FROM af_slots s JOIN af_replicas r ON "
                         "r.id = s.replica WHERE s.tenant = ? AND r.heartbeat > ?",
                         tenant, self.clock() - lease_s)[0][0])


def _event_rows(events: dict[str, list[tuple[int, dict[str, Any]]]]
                ) -> list[tuple[str, int, str]]:
    """Events as rows, serialised by the caller (a bad event fails there, not in a batch)."""
    return [(query_id, seq, json.dumps(event, default=str, separators=(",", ":")))
            for query_id, items in events.items() for seq, event in items]


def _insert_rows(q: Callable[..., list[tuple]], rows: list[tuple[str, int, str]]) -> None:
    for row in rows:
        q("INSERT INTO af_events (query_id, seq, body) VALUES (?, ?, ?) "
          "ON CONFLICT (query_id, seq) DO NOTHING", *row)


_COLUMNS = "id, tenant, status, owner, attempt, created, finished, request, answer, moves"


def _record(row: tuple) -> QueryRecord:
    (query_id, tenant, status, owner, attempt, created, finished, request, answer,
     moves) = row
    return QueryRecord(query_id=query_id, tenant=_tenant(tenant),
                       request=QueryRequest.from_json(request), status=status, owner=owner,
                       attempt=int(attempt), created=float(created),
                       finished=None if finished is None else float(finished),
                       answer=None if answer is None else json.loads(answer),
                       moves=json.loads(moves))


class SqliteStore(StateStore):
    """A SQLite file shared by the processes of one host (WAL; a write transaction takes
    the database's write lock up front, so read-modify-write is atomic across them)."""

    def __init__(self, path: str | Path, **kwargs: Any):
        super().__init__(**kwargs)
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.url = f"sqlite:///{self.path}"
        self.create_schema()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None,
                               check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    def _begin(self, conn: sqlite3.Connection, write: bool) -> None:
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")


class PostgresStore(StateStore):
    """PostgreSQL for replicas on many hosts. Schema creation runs under an advisory lock
    (two replicas starting at once would otherwise race on ``CREATE TABLE IF NOT EXISTS``);
    a tenant's usage is updated under a per-tenant transaction lock."""

    placeholder = "%s"
    id_type = "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"

    def __init__(self, url: str, **kwargs: Any):
        super().__init__(**kwargs)
        try:
            import psycopg  # noqa: F401
        except ImportError as err:
            raise ImportError("a PostgreSQL state store needs psycopg: pip install "
                              "'agentflow[postgres]'") from err
        self.url = url
        self.create_schema()

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=False)

    def _begin(self, conn: Any, write: bool) -> None:
        pass  # psycopg opens a transaction at the first statement

    def _lock_tenant(self, q: Any, tenant: str) -> None:
        q("SELECT pg_advisory_xact_lock(hashtext(?))", tenant)

    def create_schema(self) -> None:
        with self._tx() as q:
            q("SELECT pg_advisory_xact_lock(?)", _SCHEMA_LOCK)
            for statement in SCHEMA:
                q(statement.replace("{id}", self.id_type))


def open_store(url: str | Path, **kwargs: Any) -> StateStore:
    """``postgresql://...`` (or ``postgres://``): PostgreSQL; ``sqlite:///path`` or a plain
    path: a SQLite file."""
    text = os.fspath(url)
    if text.startswith(("postgresql://", "postgres://")):
        return PostgresStore(text, **kwargs)
    if text.startswith("sqlite:///"):
        text = text[len("sqlite:///"):]  # sqlite:////abs/path, sqlite:///relative
    elif "://" in text:
        raise ValueError(f"unknown state store {url!r}: use a SQLite file path "
                         "(sqlite:///path) or postgresql://...")
    if text in ("", ":memory:"):
        raise ValueError("the state store must be a file (replicas and restarts share it), "
                         "not an in-memory database")
    return SqliteStore(text, **kwargs)
