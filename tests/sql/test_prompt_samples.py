"""A schema prompt's sample-value SQL runs once per database, off the event loop.

The pipelines build their prompts inside async stages, on the engine's one event loop. Before,
the first prompt of each database — and every prompt of a new table subset, as a schema
selection asks for — ran one query per column right there, holding up every query in flight
(1.3 s per prompt on 2 busy cores while another tenant's SQL ran). Now ``prepare_prompts``
reads every column's values in a worker thread before the pipeline starts, and prompts are
text from that cache. Real SQLite files; statements are counted with SQLAlchemy's own
``before_cursor_execute`` event; the instance is scripted (not a model).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend
from agentflow.sql import Database

pytestmark = pytest.mark.timeout(120)


def _count_statements(db: Database) -> list[str]:
    """The thread name of every statement the database's engine runs, from now on."""
    seen: list[str] = []

    def record(*_args) -> None:
        seen.append(threading.current_thread().name)
    sa.event.listen(db.engine, "before_cursor_execute", record)
    return seen


def test_after_prepare_no_prompt_runs_sql_whatever_the_table_subset(library_db: Path) -> None:
    with Database.open(library_db) as fresh, Database.open(library_db) as prepared:
        prepared.prepare_prompts(3)
        assert prepared.prompts_prepared == 3
        seen = _count_statements(prepared)
        shapes = [{}, {"tables": {"book": ["title"]}}, {"tables": {"author": None}},
                  {"tables": {"book": None, "loan": None}, "samples": 2}]
        for kwargs in shapes:
            assert prepared.schema_prompt(**kwargs) == fresh.schema_prompt(**kwargs)
        assert seen == []  # before: one query per column of each new subset
        prepared.prepare_prompts(2)  # fewer values than cached: nothing to read
        assert seen == []
        prepared.schema_prompt(samples=5)  # more than prepared: read now, then cached
        n = len(seen)
        assert n > 0
        prepared.schema_prompt(tables={"book": None}, samples=4)
        assert len(seen) == n


def test_a_role_view_has_its_own_values(library_db: Path) -> None:
    # (roles are PostgreSQL's; the catalog view shares the rows and so the cache)
    with Database.open(library_db) as db:
        db.prepare_prompts(3)
        view = db.with_catalog()
        seen = _count_statements(view)
        view.schema_prompt(tables={"book": None})
        assert seen == []


def test_a_querys_prompts_run_no_sql_on_the_engine_loop() -> None:
    backend = ScriptedBackend({"extract_keywords": "stores"},
                              default="SELECT count(*) FROM stores", latency_s=0.01)
    with AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"cpu-0": backend}) as af:
        db = af.catalog.open("bookshop")
        assert db.prompts_prepared == 0  # nothing read yet: the first query's prompt is new
        seen = _count_statements(db)
        answer = af.ask("How many stores are there?", "bookshop")
        assert answer.status in ("done", "unsure"), answer.error
        assert seen, "the query ran no SQL at all"
        # before: the sample-value queries (one per column) ran on "agentflow-loop"
        assert "agentflow-loop" not in seen, seen
        assert db.prompts_prepared == 3
