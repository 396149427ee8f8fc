"""What users teach agentflow about their databases: question/SQL pairs and a glossary.

A small model gets a database right far more often when it has seen how *this* database is
queried; benchmark train splits cover benchmark databases only, so a user's own database (and
the demo) would get no examples at all. Users teach pairs ("How many stores are there?" ->
``SELECT count(*) FROM stores``) and terms ("active customer" -> "placed an order in the last
90 days"); the pipelines get the most similar pairs ahead of dataset examples, and the
meanings of the terms a question uses next to the schema.

Everything lives in one SQLite file (``<cache>/teaching.sqlite``; ``AGENTFLOW_CACHE`` moves
it), keyed by (tenant, database). ``tenant=None`` is the shared scope: everyone sees it; a
tenant sees the shared entries and its own, and changes only its own. A pair is stored only
after its SQL passed the read-only guard and ran on the database (``validate_sql``).
``TeachingMixin`` is how the Python API (and through it the CLI, HTTP and MCP) teaches.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentflow.errors import InvalidRequest

MAX_QUESTION_CHARS = 2000
MAX_SQL_CHARS = 20_000
MAX_TERM_CHARS = 100
MAX_MEANING_CHARS = 1000
MAX_ENTRIES_PER_DB = 2000  # per (tenant, database) and kind: a glossary, not a data dump

_SCHEMA = """
CREATE TABLE IF NOT EXISTS examples (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    db TEXT NOT NULL,
    question TEXT NOT NULL,
    sql TEXT NOT NULL,
    created REAL NOT NULL,
    UNIQUE (tenant, db, question)
);
CREATE TABLE IF NOT EXISTS glossary (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL,
    db TEXT NOT NULL,
    term TEXT NOT NULL COLLATE NOCASE,
    meaning TEXT NOT NULL,
    created REAL NOT NULL,
    UNIQUE (tenant, db, term)
);
CREATE TABLE IF NOT EXISTS seeded (
    db TEXT NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (db, tag)
);
"""


class TeachingError(InvalidRequest):
    """A pair or term that cannot be taught as given (the SQL does not run, empty text...)."""


@dataclass(frozen=True)
class TaughtExample:
    """A taught pair. ``db_id``/``gold_sql`` let the few-shot pool index it like a dataset
    example."""

    id: int
    db: str
    question: str
    sql: str
    tenant: str | None = None
    created: float = 0.0

    @property
    def db_id(self) -> str:
        return self.db

    @property
    def gold_sql(self) -> str:
        return self.sql

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GlossaryEntry:
    id: int
    db: str
    term: str
    meaning: str
    tenant: str | None = None
    created: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_path() -> Path:
    """``AGENTFLOW_TEACHING`` (a file path) or ``<cache>/teaching.sqlite``."""
    import os

    from agentflow.datasets.types import cache_dir

    explicit = os.environ.get("AGENTFLOW_TEACHING")
    return Path(explicit) if explicit else cache_dir() / "teaching.sqlite"


def _scope(tenant: str | None) -> str:
    if tenant is not None and (not isinstance(tenant, str) or not tenant.strip()):
        raise TeachingError("tenant must be a non-empty string or None (shared)")
    return tenant or ""


def _text(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise TeachingError(f"the {what} is empty")
    value = value.strip()
    if len(value) > limit:
        raise TeachingError(f"the {what} is too long ({len(value)} characters; at most {limit})")
    return value


def checked_example(question: Any, sql: Any) -> tuple[str, str]:
    """A (question, SQL) pair as every store keeps it: both non-empty and within their caps,
    stripped, the SQL without a trailing ``;``. One place, so the file store and the state
    store refuse and normalise the same pairs."""
    question = _text(question, "question", MAX_QUESTION_CHARS)
    sql = _text(sql, "SQL", MAX_SQL_CHARS).rstrip("; \n\t")
    return question, sql


def checked_term(term: Any, meaning: Any) -> tuple[str, str]:
    """A (term, meaning) glossary entry as every store keeps it: the term's whitespace
    collapsed and with at least one word a question can contain, both within their caps."""
    term = " ".join(_text(term, "term", MAX_TERM_CHARS).split())
    meaning = _text(meaning, "meaning", MAX_MEANING_CHARS)
    if not _term_words(term):
        raise TeachingError(f"the term {term!r} has no words to look for in a question")
    return term, meaning


class TeachingStore:
    """The persistent store. Thread-safe; several processes may share the file (SQLite
    locking), e.g. ``agentflow teach`` while a server runs."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pools: dict[tuple, Any] = {}
        with self._connect() as conn:
            conn.executescript(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=10)
        conn.row_factory = sqlite3.Row
        return conn

    def _run(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            conn = self._connect()
            try:
                with conn:
                    return list(conn.execute(sql, params))
            finally:
                conn.close()

    def _insert(self, sql: str, params: Sequence[Any], table: str) -> list[sqlite3.Row]:
        """Insert with a new random id (the first parameter). Why not the counter: ids from
        one global counter told a tenant how many pairs the others had taught between two of
        its own; a random id in 1..2^53-1 (exact in JSON numbers) tells nothing. A clash
        with an existing id (about n / 2^53) draws again."""
        import secrets

        for _ in range(8):
            try:
                return self._run(sql, (1 + secrets.randbelow(_MAX_PUBLIC_ID), *params))
            except sqlite3.IntegrityError as err:
                if f"{table}.id" not in str(err):
                    raise
        raise TeachingError(f"could not draw a free id for the {table} entry; retry")

    # -------------------------------------------------------------------------- examples
    def add_example(self, db: str, question: str, sql: str, *,
                    tenant: str | None = None) -> TaughtExample:
        """Store (or replace: the same question taught again gets the new SQL) a pair. The
        caller validates the SQL first (``validate_sql``)."""
        scope = _scope(tenant)
        question, sql = checked_example(question, sql)
        self._check_room("examples", scope, db, "question", question)
        now = time.time()
        rows = self._insert(
            "INSERT INTO examples (id, tenant, db, question, sql, created) "
            "VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (tenant, db, question) DO UPDATE SET sql = excluded.sql, "
            "created = excluded.created RETURNING id, created",
            (scope, db, question, sql, now), "examples")
        return TaughtExample(rows[0]["id"], db, question, sql, tenant, rows[0]["created"])

    def examples(self, db: str, *, tenant: str | None = None) -> list[TaughtExample]:
        """The pairs ``tenant`` sees on ``db`` (shared ones and its own), oldest (last
        taught) first."""
        rows = self._run("SELECT * FROM examples WHERE db = ? AND tenant IN ('', ?) "
                         "ORDER BY created, id", (db, _scope(tenant)))
        return [TaughtExample(r["id"], r["db"], r["question"], r["sql"], r["tenant"] or None,
                              r["created"]) for r in rows]

    def delete_example(self, db: str, example_id: int | str, *,
                       tenant: str | None = None) -> bool:
        """Delete one of ``tenant``'s own pairs; False when there is none with that id (an id
        that cannot be one — negative, past int64, not ASCII digits — is simply not found)."""
        row_id = row_id_of(example_id)
        if row_id is None:
            return False
        rows = self._run("DELETE FROM examples WHERE id = ? AND db = ? AND tenant = ? "
                         "RETURNING id", (row_id, db, _scope(tenant)))
        return bool(rows)

    # -------------------------------------------------------------------------- glossary
    def add_term(self, db: str, term: str, meaning: str, *,
                 tenant: str | None = None) -> GlossaryEntry:
        scope = _scope(tenant)
        term, meaning = checked_term(term, meaning)
        self._check_room("glossary", scope, db, "term", term)
        rows = self._insert(
            "INSERT INTO glossary (id, tenant, db, term, meaning, created) "
            "VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (tenant, db, term) DO UPDATE SET meaning = excluded.meaning, "
            "created = excluded.created RETURNING id, created",
            (scope, db, term, meaning, time.time()), "glossary")
        return GlossaryEntry(rows[0]["id"], db, term, meaning, tenant, rows[0]["created"])

    def glossary(self, db: str, *, tenant: str | None = None) -> list[GlossaryEntry]:
        rows = self._run("SELECT * FROM glossary WHERE db = ? AND tenant IN ('', ?) "
                         "ORDER BY created, id", (db, _scope(tenant)))
        return [GlossaryEntry(r["id"], r["db"], r["term"], r["meaning"], r["tenant"] or None,
                              r["created"]) for r in rows]

    def delete_term(self, db: str, term: str | int, *, tenant: str | None = None) -> bool:
        """Delete one of ``tenant``'s own terms, by id or by the term itself."""
        scope = _scope(tenant)
        if isinstance(term, int) or (isinstance(term, str) and term.isascii() and
                                     term.isdigit()):
            row_id = row_id_of(term)
            if row_id is None:
                return False
            rows = self._run("DELETE FROM glossary WHERE id = ? AND db = ? AND tenant = ? "
                             "RETURNING id", (row_id, db, scope))
        else:
            rows = self._run("DELETE FROM glossary WHERE term = ? AND db = ? AND tenant = ? "
                             "RETURNING id", (" ".join(str(term).split()), db, scope))
        return bool(rows)

    def _check_room(self, table: str, scope: str, db: str, key: str, value: str) -> None:
        rows = self._run(f"SELECT count(*) AS n, sum({key} = ?) AS same FROM {table} "
                         "WHERE tenant = ? AND db = ?", (value, scope, db))
        if rows[0]["n"] >= MAX_ENTRIES_PER_DB and not rows[0]["same"]:
            raise TeachingError(f"{db} already has {MAX_ENTRIES_PER_DB} taught {table}; "
                                "delete some first")

    # ------------------------------------------------------------------------- shipped
    def seed(self, db: str, tag: str, examples: Iterable[tuple[str, str]] = (),
             terms: Iterable[tuple[str, str]] = ()) -> bool:
        """Add shipped entries (shared scope) once per (db, tag): a user who deletes one
        does not get it back on the next start. Returns whether anything was added."""
        if self._run("SELECT 1 FROM seeded WHERE db = ? AND tag = ?", (db, tag)):
            return False
        for question, sql in examples:
            self.add_example(db, question, sql)
        for term, meaning in terms:
            self.add_term(db, term, meaning)
        self._run("INSERT OR IGNORE INTO seeded (db, tag) VALUES (?, ?)", (db, tag))
        return True

    # ------------------------------------------------------------------------ retrieval
    def similar(self, db: str, question: str, k: int, *, tenant: str | None = None,
                database: Any = None) -> list[Any]:
        """The ``k`` taught pairs most like ``question`` (``FewShot`` objects, best first),
        ranked by the same masked-question similarity as dataset examples."""
        if k <= 0:
            return []
        taught = self.examples(db, tenant=tenant)
        if not taught:
            return []
        from agentflow.retrieval.fewshot import FewShotPool, schema_words_from_db

        key = (db, _scope(tenant), tuple((e.id, e.created) for e in taught))
        with self._lock:
            pool = self._pools.get(key)
        if pool is None:
            words = {db: schema_words_from_db(database)} if database is not None else None
            pool = FewShotPool(taught, schema_words=words)
            with self._lock:
                self._pools = {k2: p for k2, p in self._pools.items() if k2[:2] != key[:2]}
                self._pools[key] = pool
        return pool.query(question, k=k, db=database)

    def terms_in(self, db: str, question: str, *,
                 tenant: str | None = None) -> list[GlossaryEntry]:
        """The glossary entries whose term the question uses (word by word, plural or not);
        a tenant's own entry wins over a shared one with the same term."""
        asked = _term_words(question)
        found: dict[str, GlossaryEntry] = {}
        for entry in self.glossary(db, tenant=tenant):
            if _contains(asked, _term_words(entry.term)):
                key = entry.term.casefold()
                if key not in found or entry.tenant is not None:
                    found[key] = entry
        return list(found.values())


def _term_words(text: str) -> list[str]:
    from agentflow.retrieval.text import stem, words

    return [stem(w) for w in words(text)]


def _contains(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    n = len(needle)
    return n > 0 and any(list(haystack[i:i + n]) == list(needle)
                         for i in range(len(haystack) - n + 1))


def validate_sql(database: Any, sql: str, *, timeout_s: float = 10.0) -> None:
    """Raise ``TeachingError`` unless ``sql`` is one read-only query that runs on
    ``database``: ``Database.execute`` applies the guard before the engine sees it."""
    from agentflow.sql import SqlError

    sql = _text(sql, "SQL", MAX_SQL_CHARS)
    try:
        database.execute(sql, timeout_s=timeout_s, max_rows=1)
    except SqlError as err:
        raise TeachingError(f"not taught: the SQL does not run on {database.id!r}: "
                            f"{getattr(err, 'message', err)}") from None


def glossary_block(entries: Sequence[GlossaryEntry]) -> str:
    """The lines the schema context gets for the terms a question uses."""
    if not entries:
        return ""
    lines = ["-- Glossary (what these words mean in this database):"]
    lines += [f"-- {e.term}: {' '.join(e.meaning.split())}" for e in entries]
    return "\n".join(lines) + "\n"


class TaughtFewShots:
    """What a pipeline's ``env.fewshot`` is: taught pairs for this database first, then the
    dataset pool's examples for the slots that are left. Same ``query`` interface as
    ``FewShotPool``, so no pipeline needs to know whether examples were taught."""

    def __init__(self, store: TeachingStore, db: str, *, tenant: str | None = None,
                 base: Any = None):
        self.store = store
        self.db = db
        self.tenant = tenant
        self.base = base

    def query(self, question: str, k: int = 4, *, db: Any = None, **kwargs: Any) -> list[Any]:
        if k <= 0:
            return []
        taught = self.store.similar(self.db, question, k, tenant=self.tenant, database=db)
        out = list(taught)
        if self.base is not None and len(out) < k:
            seen = {" ".join(f.example.question.casefold().split()) for f in out}
            for hit in self.base.query(question, k=k, db=db, **kwargs):
                if " ".join(hit.example.question.casefold().split()) not in seen:
                    out.append(hit)
                if len(out) >= k:
                    break
        return out

    def match(self, question: str, threshold: float | None = None) -> Any:
        """The taught pair that answers ``question`` itself (``paraphrase.Match``): the same
        question or a paraphrase at or above ``threshold`` (default: the measured
        ``PARAPHRASE_THRESHOLD``); None otherwise. A tenant's own pair wins a tie over a
        shared one. Pipelines run its SQL as one more candidate."""
        from agentflow.retrieval.paraphrase import PARAPHRASE_THRESHOLD, best_match

        taught = self.store.examples(self.db, tenant=self.tenant)
        taught.sort(key=lambda e: e.tenant is None)  # own pairs first: they win ties
        return best_match(question, [(e.question, e.sql) for e in taught],
                          PARAPHRASE_THRESHOLD if threshold is None else threshold)

    def __len__(self) -> int:
        return len(self.store.examples(self.db, tenant=self.tenant)) + len(self.base or ())

    def __getattr__(self, name: str) -> Any:  # ensure_disjoint & co. of the dataset pool
        if self.base is None:
            raise AttributeError(name)
        return getattr(self.base, name)


# SQLite's INTEGER is a signed 64-bit number: a larger Python int cannot even be bound.
_MAX_ROW_ID = 2 ** 63 - 1
_MAX_PUBLIC_ID = 2 ** 53 - 1  # new ids: random below this (a JSON number holds it exactly)


def row_id_of(value: object) -> int | None:
    """``value`` as a row id, or None when it cannot be one: an int in 1..2^63-1, or a string
    of at most 19 ASCII digits (``"²".isdigit()`` is true, and ``int()`` of 4,300+ digits
    raises), so every id parse is total."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        if not (value.isascii() and value.isdigit()) or len(value) > 19:
            return None
        value = int(value)
    if not isinstance(value, int) or not 0 < value <= _MAX_ROW_ID:
        return None
    return value


# --------------------------------------------------------------------------- the API's verbs
DEMO_SEED_TAG = "demo-v1"


def _owner(tenant: Any) -> str | None:
    """The store's key for ``tenant``: its name (a ``Tenant`` or a name), None = shared."""
    from agentflow.tenants import as_tenant, owner_of

    return owner_of(as_tenant(tenant))


def open_store(path: str | None = None) -> TeachingStore:
    """The teaching file at ``path`` (the cache default when None), with the demo's shipped
    pairs and terms seeded into it once. A state store's URL is opened one layer up, by
    ``agentflow.state.teaching.open_teaching_store`` (the state package builds on this one)."""
    from agentflow.datasets.demo import DEMO_DB_ID, demo_teaching

    store = TeachingStore(path)
    examples, terms = demo_teaching()
    store.seed(DEMO_DB_ID, DEMO_SEED_TAG, examples, terms)
    return store


class TeachingMixin:
    """The Python API's teaching verbs (``af.teach``, ``af.define`` and their list/delete),
    mixed into ``AgentFlow`` so that ``api.py`` stays about answering questions; the CLI,
    HTTP routes and MCP tool all call these. Needs ``self.catalog`` (a DatabaseCatalog) and
    ``self.config`` (an AgentFlowConfig): nothing else of the API."""

    catalog: Any
    config: Any
    _teaching_store: TeachingStore | None = None
    _teaching_lock = threading.Lock()

    @property
    def teaching(self) -> TeachingStore:
        with self._teaching_lock:
            if self._teaching_store is None:
                self._teaching_store = self._open_teaching(
                    getattr(self.config, "teaching_store", None))
            return self._teaching_store

    def _open_teaching(self, path: str | None) -> TeachingStore:
        """A teaching file; ``AgentFlow`` also opens state-store URLs (agentflow.state)."""
        return open_store(path)

    def _db_id(self, db: str) -> str:
        return self.catalog.entry(db).db_id  # raises DatabaseNotFoundError for unknown ids

    # ----------------------------------------------------------------------- examples
    def teach(self, question: str, sql: str, *, db: str,
              tenant: Any = None) -> TaughtExample:
        """Teach a question/SQL pair for ``db``. The SQL must pass the read-only guard and
        run on the database, or ``TeachingError`` (an ``InvalidRequest``) says why and
        nothing is stored. Teaching the same question again replaces its SQL."""
        if not isinstance(question, str) or not question.strip():
            raise TeachingError("the question is empty")
        db_id = self._db_id(db)
        validate_sql(self.catalog.open(db), sql, timeout_s=self.config.sql_timeout_s)
        return self.teaching.add_example(db_id, question, sql, tenant=_owner(tenant))

    async def teach_async(self, question: str, sql: str, *, db: str,
                          tenant: Any = None) -> TaughtExample:
        """``teach`` as the servers call it: in ``tenant``'s share of the database threads
        (``agentflow.shares``, when this object has them), so a flood of slow taught SQL
        waits for that tenant's own threads instead of taking everyone's."""
        shares = getattr(self, "shares", None)
        if shares is None:
            import asyncio

            return await asyncio.to_thread(self.teach, question, sql, db=db, tenant=tenant)
        share = self.share_of(tenant)  # type: ignore[attr-defined]
        result: TaughtExample = await shares.run(share, self.teach, question, sql, db=db,
                                                 tenant=tenant)
        return result

    def examples(self, db: str, *, tenant: Any = None) -> list[TaughtExample]:
        """The taught pairs for ``db`` that ``tenant`` sees (shared ones and its own)."""
        return self.teaching.examples(self._db_id(db), tenant=_owner(tenant))

    def forget_example(self, db: str, example_id: int, *, tenant: Any = None) -> bool:
        """Delete a taught pair by id; False when ``tenant`` has none with that id."""
        return self.teaching.delete_example(self._db_id(db), example_id, tenant=_owner(tenant))

    # ----------------------------------------------------------------------- glossary
    def define(self, term: str, meaning: str, *, db: str,
               tenant: Any = None) -> GlossaryEntry:
        """Teach what a word means in ``db`` in SQL terms ("active customer" -> "placed an
        order in the last 90 days"); questions that use the term get it with the schema."""
        return self.teaching.add_term(self._db_id(db), term, meaning, tenant=_owner(tenant))

    def glossary(self, db: str, *, tenant: Any = None) -> list[GlossaryEntry]:
        return self.teaching.glossary(self._db_id(db), tenant=_owner(tenant))

    def forget_term(self, db: str, term: str | int, *, tenant: Any = None) -> bool:
        return self.teaching.delete_term(self._db_id(db), term, tenant=_owner(tenant))

    # ------------------------------------------------------------------ for pipelines
    def _taught_context(self, db_id: str, handle: Any,
                        tenant: Any = None) -> tuple[TaughtFewShots, str]:
        """For one query (a ``QueryHandle``): the few-shot source (taught pairs ahead of the
        dataset pool) and the glossary text for the terms its question, read with the
        conversation's earlier turns, uses. Blocking: call it off the event loop."""
        store = self.teaching
        asked = " ".join([t.question for t in handle.history] + [handle.question])
        terms = store.terms_in(db_id, asked, tenant=_owner(tenant))
        base = self.fewshot_pool()  # type: ignore[attr-defined]
        return (TaughtFewShots(store, db_id, tenant=_owner(tenant), base=base),
                glossary_block(terms))


__all__ = ["GlossaryEntry", "TaughtExample", "TaughtFewShots", "TeachingError",
           "TeachingMixin", "TeachingStore", "default_path", "glossary_block", "open_store",
           "row_id_of", "validate_sql"]
