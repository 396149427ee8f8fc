"""The Python API's teaching methods (``af.teach``, ``af.define`` and their list/delete).

A mixin of ``AgentFlow`` rather than code in ``api.py``: teaching needs only the catalog
(to resolve and open the database the SQL must run on) and the store, and keeping it here
keeps ``api.py`` about answering questions. The CLI, HTTP routes and MCP tool all call these.
"""

from __future__ import annotations

import threading
from typing import Any

from agentflow.teaching import (
    GlossaryEntry,
    TaughtExample,
    TaughtFewShots,
    TeachingError,
    TeachingStore,
    glossary_block,
    validate_sql,
)

DEMO_SEED_TAG = "demo-v1"


def _scope(tenant: Any) -> str | None:
    """The store's key for ``tenant``: its name (a ``Tenant`` or a name), None = shared."""
    from agentflow.tenants import as_tenant, owner_of

    return owner_of(as_tenant(tenant))


def open_store(path: str | None = None) -> TeachingStore:
    """The store at ``path`` (the cache default when None), with the demo's shipped pairs
    and terms seeded into it once."""
    from agentflow.datasets.demo import DEMO_DB_ID, demo_teaching

    store = TeachingStore(path)
    examples, terms = demo_teaching()
    store.seed(DEMO_DB_ID, DEMO_SEED_TAG, examples, terms)
    return store


class TeachingMixin:
    """Needs ``self.catalog`` (a DatabaseCatalog) and ``self.config`` (an AgentFlowConfig)."""

    catalog: Any
    config: Any
    _teaching_store: TeachingStore | None = None
    _teaching_lock = threading.Lock()

    @property
    def teaching(self) -> TeachingStore:
        with self._teaching_lock:
            if self._teaching_store is None:
                self._teaching_store = open_store(getattr(self.config, "teaching_store", None))
            return self._teaching_store

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
        return self.teaching.add_example(db_id, question, sql, tenant=_scope(tenant))

    def examples(self, db: str, *, tenant: Any = None) -> list[TaughtExample]:
        """The taught pairs for ``db`` that ``tenant`` sees (shared ones and its own)."""
        return self.teaching.examples(self._db_id(db), tenant=_scope(tenant))

    def forget_example(self, db: str, example_id: int, *, tenant: Any = None) -> bool:
        """Delete a taught pair by id; False when ``tenant`` has none with that id."""
        return self.teaching.delete_example(self._db_id(db), example_id, tenant=_scope(tenant))

    # ----------------------------------------------------------------------- glossary
    def define(self, term: str, meaning: str, *, db: str,
               tenant: Any = None) -> GlossaryEntry:
        """Teach what a word means in ``db`` in SQL terms ("active customer" -> "placed an
        order in the last 90 days"); questions that use the term get it with the schema."""
        return self.teaching.add_term(self._db_id(db), term, meaning, tenant=_scope(tenant))

    def glossary(self, db: str, *, tenant: Any = None) -> list[GlossaryEntry]:
        return self.teaching.glossary(self._db_id(db), tenant=_scope(tenant))

    def forget_term(self, db: str, term: str | int, *, tenant: Any = None) -> bool:
        return self.teaching.delete_term(self._db_id(db), term, tenant=_scope(tenant))

    # ------------------------------------------------------------------ for pipelines
    def _taught_context(self, db_id: str, handle: Any,
                        tenant: Any = None) -> tuple[TaughtFewShots, str]:
        """For one query (a ``QueryHandle``): the few-shot source (taught pairs ahead of the
        dataset pool) and the glossary text for the terms its question, read with the
        conversation's earlier turns, uses. Blocking: call it off the event loop."""
        store = self.teaching
        asked = " ".join([t.question for t in handle.history] + [handle.question])
        terms = store.terms_in(db_id, asked, tenant=_scope(tenant))
        base = self.fewshot_pool()  # type: ignore[attr-defined]
        return (TaughtFewShots(store, db_id, tenant=_scope(tenant), base=base),
                glossary_block(terms))


__all__ = ["TeachingMixin", "open_store"]
