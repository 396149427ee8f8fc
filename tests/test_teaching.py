"""Teaching: the store, the guard on taught SQL, retrieval into every pipeline's prompts, the
glossary, tenants, the demo's shipped entries (scripted backend, not a model; the real demo
database and real SQLite files)."""

from __future__ import annotations

import json

import pytest

import agentflow
from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.datasets.demo import demo_questions, demo_teaching
from agentflow.llm.scripted import ScriptedBackend
from agentflow.teaching import TeachingError, TeachingStore

TAUGHT_Q = "How many distinct cities have a store?"
TAUGHT_SQL = "SELECT count(DISTINCT city) FROM stores"


@pytest.fixture
def af_prompts(tmp_path):
    prompts: list[tuple[str, str]] = []

    def script(request):
        prompts.append((request.stage, request.prompt))
        if request.stage == "extract_keywords":
            return "stores"
        if request.stage == "select_tables":
            return "stores"
        return "SELECT count(*) FROM stores"
    config = AgentFlowConfig(fewshot=None, teaching_store=str(tmp_path / "t.sqlite"))
    with AgentFlow(config, backends={"s": ScriptedBackend(script, default="yes")}) as af:
        yield af, prompts


def test_a_taught_pair_is_stored_and_listed_and_deleted(af_prompts, tmp_path) -> None:
    af, _ = af_prompts
    shipped = len(af.examples("bookshop"))
    taught = af.teach(TAUGHT_Q, TAUGHT_SQL + ";", db="bookshop")
    assert taught.sql == TAUGHT_SQL and taught.db == "bookshop"
    assert [e.question for e in af.examples("bookshop")][-1] == TAUGHT_Q
    # persistent: a new store on the same file sees it
    again = TeachingStore(tmp_path / "t.sqlite")
    assert TAUGHT_Q in [e.question for e in again.examples("bookshop")]
    # teaching the same question again replaces its SQL, it does not add a second pair
    af.teach(TAUGHT_Q, "SELECT count(*) FROM (SELECT DISTINCT city FROM stores)", db="bookshop")
    assert len(af.examples("bookshop")) == shipped + 1
    assert af.forget_example("bookshop", taught.id)
    assert not af.forget_example("bookshop", taught.id)
    assert len(af.examples("bookshop")) == shipped


@pytest.mark.parametrize("sql, why", [
    ("DELETE FROM stores", "read-only"),
    ("SELECT nope FROM stores", "unknown column"),
    ("SELECT 1; SELECT 2", "one"),
    ("", "empty"),
])
def test_taught_sql_must_pass_the_guard_and_run_or_nothing_is_stored(af_prompts, sql,
                                                                     why) -> None:
    af, _ = af_prompts
    before = af.examples("bookshop")
    with pytest.raises(TeachingError) as err:
        af.teach("How many stores?", sql, db="bookshop")
    assert isinstance(err.value, agentflow.InvalidRequest)
    assert why in str(err.value).lower()
    assert af.examples("bookshop") == before


def test_unknown_database_and_empty_question_are_clear_errors(af_prompts) -> None:
    af, _ = af_prompts
    with pytest.raises(agentflow.DatabaseNotFoundError):
        af.teach("How many?", "SELECT 1", db="no_such_db")
    with pytest.raises(TeachingError, match="question is empty"):
        af.teach("  ", TAUGHT_SQL, db="bookshop")


@pytest.mark.parametrize("pipeline", ["single", "chess", "macsql"])
def test_taught_pairs_reach_every_pipelines_sql_prompts_ahead_of_dataset_examples(
        af_prompts, pipeline) -> None:
    af, prompts = af_prompts
    af.teach(TAUGHT_Q, TAUGHT_SQL, db="bookshop")
    answer = af.ask("How many distinct cities have stores?", db="bookshop", pipeline=pipeline)
    assert answer.status == "done", answer.error
    sql_prompts = [p for stage, p in prompts if "-- SQL:" in p or "Sub-question" in p]
    assert sql_prompts, [s for s, _ in prompts]
    for prompt in sql_prompts:
        examples = prompt.split("-- Example questions and their SQL:")[1]
        # the most similar taught pair comes first
        assert examples.lstrip().startswith(f"-- Question: {TAUGHT_Q}\n{TAUGHT_SQL};")


def test_taught_examples_come_before_the_dataset_pool(tmp_path) -> None:
    from agentflow.datasets.types import Example
    from agentflow.retrieval import FewShotPool
    from agentflow.teaching import TaughtFewShots

    store = TeachingStore(tmp_path / "t.sqlite")
    store.add_example("shop", "How many stores are there?", "SELECT count(*) FROM stores")
    pool = FewShotPool([Example("t0", "other", "How many stores are there?",
                                "SELECT count(*) FROM shop"),
                        Example("t1", "other", "List every singer.", "SELECT * FROM singer")])
    hits = TaughtFewShots(store, "shop", base=pool).query("How many stores are there?", k=3)
    assert [h.example.gold_sql for h in hits] == ["SELECT count(*) FROM stores",
                                                  "SELECT * FROM singer"]  # same question: once


def test_a_taught_pair_is_in_the_recorded_trace_prompt(af_prompts, tmp_path) -> None:
    af, _ = af_prompts
    af.teach(TAUGHT_Q, TAUGHT_SQL, db="bookshop")
    trace = tmp_path / "trace.jsonl"
    af.ask("How many cities have a store?", db="bookshop", pipeline="single", record=trace)
    record = json.loads(trace.read_text().splitlines()[-1])
    prompts = [c.get("prompt") or "" for n in record["nodes"] for c in n.get("calls", ())]
    assert any(f"-- Question: {TAUGHT_Q}\n{TAUGHT_SQL};" in p for p in prompts), prompts


def test_glossary_terms_the_question_uses_go_next_to_the_schema(af_prompts) -> None:
    af, prompts = af_prompts
    entry = af.define("flagship store", "the store with the largest floor_area_m2",
                      db="bookshop")
    assert entry.term in [g.term for g in af.glossary("bookshop")]
    af.ask("In which city is the flagship store?", db="bookshop", pipeline="single")
    prompt = [p for s, p in prompts if s == "generate_sql"][-1]
    schema, examples = prompt.split("-- Example questions and their SQL:")
    assert "-- flagship store: the store with the largest floor_area_m2" in schema
    prompts.clear()
    af.ask("How many stores are there?", db="bookshop", pipeline="single")
    assert "flagship" not in [p for s, p in prompts if s == "generate_sql"][-1]
    assert not af.forget_term("bookshop", "flagship")
    assert af.forget_term("bookshop", "Flagship  Store")  # case and spacing do not matter
    assert "flagship store" not in [g.term for g in af.glossary("bookshop")]


def test_glossary_matching_is_by_words_and_plurals(tmp_path) -> None:
    store = TeachingStore(tmp_path / "t.sqlite")
    store.add_term("shop", "active customer", "ordered in the last 90 days")
    assert store.terms_in("shop", "How many Active Customers are there?")
    assert not store.terms_in("shop", "How many customers are active?")
    assert not store.terms_in("shop", "inactive customer count")
    with pytest.raises(TeachingError):
        store.add_term("shop", "  ", "x")
    with pytest.raises(TeachingError):
        store.add_term("shop", "x", "")


def test_tenants_see_shared_entries_and_only_their_own(tmp_path) -> None:
    store = TeachingStore(tmp_path / "t.sqlite")
    shared = store.add_example("shop", "How many stores?", "SELECT count(*) FROM stores")
    a = store.add_example("shop", "How many books?", "SELECT count(*) FROM books", tenant="a")
    store.add_example("shop", "How many authors?", "SELECT count(*) FROM authors", tenant="b")
    assert [e.question for e in store.examples("shop", tenant="a")] == [
        "How many stores?", "How many books?"]
    assert [e.question for e in store.examples("shop")] == ["How many stores?"]
    assert not store.delete_example("shop", shared.id, tenant="a")  # not a's to delete
    assert not store.delete_example("shop", a.id, tenant="b")
    assert store.delete_example("shop", a.id, tenant="a")
    hits = store.similar("shop", "How many authors are there?", 3, tenant="b")
    assert [h.example.question for h in hits][0] == "How many authors?"
    assert "How many authors?" not in [h.example.question
                                       for h in store.similar("shop", "authors?", 3)]
    store.add_term("shop", "author", "a row of authors", tenant="b")
    assert store.terms_in("shop", "each author", tenant="b")
    assert not store.terms_in("shop", "each author")
    with pytest.raises(TeachingError):
        store.examples("shop", tenant="  ")


def test_the_demo_ships_taught_pairs_and_terms_that_are_not_its_evaluation_questions(
        af_prompts) -> None:
    af, _ = af_prompts
    examples, terms = demo_teaching()
    assert len(examples) >= 5 and len(terms) >= 3
    evaluated = {q["question"].casefold() for q in demo_questions()}
    db = af.catalog.open("bookshop")
    for question, sql in examples:
        assert question.casefold() not in evaluated
        assert db.execute(sql).columns  # every shipped SQL runs
    assert {e.question for e in af.examples("bookshop")} >= {q for q, _ in examples}
    assert {t for t, _ in terms} <= {g.term for g in af.glossary("bookshop")}


def test_a_deleted_shipped_entry_stays_deleted(tmp_path) -> None:
    from agentflow.teaching import open_store

    store = open_store(str(tmp_path / "t.sqlite"))
    first = store.examples("bookshop")[0]
    assert store.delete_example("bookshop", first.id)
    again = open_store(str(tmp_path / "t.sqlite"))
    assert first.question not in [e.question for e in again.examples("bookshop")]
