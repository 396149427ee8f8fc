"""Taught pairs and glossary kept in the state store, so every replica — on any host —
teaches and answers from the same ones.

Why here and not in ``<cache>/teaching.sqlite``: that file is one host's; replicas on
several hosts share only the state store (PostgreSQL). Same behaviour as
``agentflow.teaching.TeachingStore`` (which this subclasses for its retrieval: similar
pairs, the terms a question uses): the same scopes (``tenant=None`` shared, a tenant sees
the shared entries and its own and changes only its own), the same caps, replacing a pair
taught again, terms matched without regard to case, shipped entries seeded once per tag.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from agentflow.state.store import StateStore
from agentflow.teaching import (
    MAX_ENTRIES_PER_DB,
    GlossaryEntry,
    TaughtExample,
    TeachingError,
    TeachingStore,
    _scope,
    checked_example,
    checked_term,
    row_id_of,
)

Q = Callable[..., list[tuple]]


class StoreTeaching(TeachingStore):
    def __init__(self, store: StateStore):  # no file: the tables are the store's
        self.state = store
        self.path = None  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._pools: dict[tuple, Any] = {}

    # -------------------------------------------------------------------------- examples
    def add_example(self, db: str, question: str, sql: str, *,
                    tenant: str | None = None) -> TaughtExample:
        scope = _scope(tenant)
        question, sql = checked_example(question, sql)
        now = time.time()

        def op(q: Q) -> list[tuple]:
            _check_room(q, "af_examples", scope, db, "question", question)
            return q("INSERT INTO af_examples (tenant, db, question, sql, created) VALUES "
                     "(?, ?, ?, ?, ?) ON CONFLICT (tenant, db, question) DO UPDATE SET "
                     "sql = excluded.sql, created = excluded.created RETURNING id, created",
                     scope, db, question, sql, now)
        rows = self.state.write(op)
        return TaughtExample(int(rows[0][0]), db, question, sql, tenant, float(rows[0][1]))

    def examples(self, db: str, *, tenant: str | None = None) -> list[TaughtExample]:
        rows = self.state.read("SELECT id, db, question, sql, tenant, created FROM "
                               "af_examples WHERE db = ? AND tenant IN ('', ?) ORDER BY id",
                               db, _scope(tenant))
        return [TaughtExample(int(r[0]), r[1], r[2], r[3], r[4] or None, float(r[5]))
                for r in rows]

    def delete_example(self, db: str, example_id: int | str, *,
                       tenant: str | None = None) -> bool:
        row_id = row_id_of(example_id)
        if row_id is None:
            return False
        return bool(self.state.write(lambda q: q(
            "DELETE FROM af_examples WHERE id = ? AND db = ? AND tenant = ? RETURNING id",
            row_id, db, _scope(tenant))))

    # -------------------------------------------------------------------------- glossary
    def add_term(self, db: str, term: str, meaning: str, *,
                 tenant: str | None = None) -> GlossaryEntry:
        scope = _scope(tenant)
        term, meaning = checked_term(term, meaning)
        key, now = term.casefold(), time.time()

        def op(q: Q) -> list[tuple]:
            _check_room(q, "af_glossary", scope, db, "term_key", key)
            return q("INSERT INTO af_glossary (tenant, db, term, term_key, meaning, created) "
                     "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, db, term_key) DO UPDATE "
                     "SET meaning = excluded.meaning, created = excluded.created "
                     "RETURNING id, created, term", scope, db, term, key, meaning, now)
        rows = self.state.write(op)
        return GlossaryEntry(int(rows[0][0]), db, rows[0][2], meaning, tenant,
                             float(rows[0][1]))

    def glossary(self, db: str, *, tenant: str | None = None) -> list[GlossaryEntry]:
        rows = self.state.read("SELECT id, db, term, meaning, tenant, created FROM "
                               "af_glossary WHERE db = ? AND tenant IN ('', ?) ORDER BY id",
                               db, _scope(tenant))
        return [GlossaryEntry(int(r[0]), r[1], r[2], r[3], r[4] or None, float(r[5]))
                for r in rows]

    def delete_term(self, db: str, term: str | int, *, tenant: str | None = None) -> bool:
        scope = _scope(tenant)
        value: Any
        if isinstance(term, int) or (isinstance(term, str) and term.isascii() and
                                     term.isdigit()):
            row_id = row_id_of(term)
            if row_id is None:
                return False
            sql, value = "id = ?", row_id
        else:
            sql, value = "term_key = ?", " ".join(str(term).split()).casefold()
        return bool(self.state.write(lambda q: q(
            f"DELETE FROM af_glossary WHERE {sql} AND db = ? AND tenant = ? RETURNING id",
            value, db, scope)))

    # ------------------------------------------------------------------------- shipped
    def seed(self, db: str, tag: str, examples: Iterable[tuple[str, str]] = (),
             terms: Iterable[tuple[str, str]] = ()) -> bool:
        """Shipped entries, once per (db, tag) across every replica: the first to claim
        the tag adds them (two replicas starting at once do not both)."""
        claimed = self.state.write(lambda q: q(
            "INSERT INTO af_seeded (db, tag) VALUES (?, ?) ON CONFLICT (db, tag) DO NOTHING "
            "RETURNING db", db, tag))
        if not claimed:
            return False
        for question, sql in examples:
            self.add_example(db, question, sql)
        for term, meaning in terms:
            self.add_term(db, term, meaning)
        return True


def _check_room(q: Q, table: str, scope: str, db: str, key: str, value: str) -> None:
    """In the write's transaction: the per-(tenant, db) cap, unless it replaces one."""
    n, same = q(f"SELECT count(*), sum(CASE WHEN {key} = ? THEN 1 ELSE 0 END) FROM {table} "
                "WHERE tenant = ? AND db = ?", value, scope, db)[0]
    if int(n) >= MAX_ENTRIES_PER_DB and not same:
        kind = "examples" if table == "af_examples" else "glossary"
        raise TeachingError(f"{db} already has {MAX_ENTRIES_PER_DB} taught {kind}; "
                            "delete some first")


def open_teaching(store: StateStore) -> StoreTeaching:
    """The state store's teaching, with the demo's shipped pairs and terms seeded once."""
    from agentflow.datasets.demo import DEMO_DB_ID, demo_teaching
    from agentflow.teaching import DEMO_SEED_TAG

    teaching = StoreTeaching(store)
    examples, terms = demo_teaching()
    teaching.seed(DEMO_DB_ID, DEMO_SEED_TAG, examples, terms)
    return teaching


STATE_URL_PREFIXES = ("postgresql://", "postgres://", "sqlite:///")


def open_teaching_store(path: str | None = None) -> TeachingStore:
    """A config's ``teaching_store``: a state store's URL (``postgresql://...`` or
    ``sqlite:///path``) keeps taught pairs in that store's tables (replicas on many hosts
    share it); anything else is a teaching file (``agentflow.teaching.open_store``)."""
    from agentflow.state import open_store as open_state
    from agentflow.teaching import open_store as open_file

    if path is not None and str(path).startswith(STATE_URL_PREFIXES):
        return open_teaching(open_state(str(path)))
    return open_file(path)
