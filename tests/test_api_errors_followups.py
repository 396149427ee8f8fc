"""The Python API's exception family, the unknown-database message, and follow-up questions
(scripted backend, not a model; the real demo database)."""

from __future__ import annotations

import pytest

import agentflow
from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend

GOOD = "SELECT count(*) FROM stores"


@pytest.fixture
def recorded():
    prompts: list[tuple[str, str]] = []

    def script(request):
        prompts.append((request.stage, request.prompt))
        return "stores" if request.stage == "extract_keywords" else GOOD
    backend = ScriptedBackend(script)
    with AgentFlow(AgentFlowConfig(fewshot=None), backends={"s": backend}) as af:
        yield af, prompts


def test_every_input_error_is_an_agentflow_error_and_keeps_its_builtin_base(recorded) -> None:
    af, _ = recorded
    for name in ("InvalidRequest", "DatabaseNotFoundError", "ConversationNotFoundError",
                 "ShuttingDownError", "SqlError"):
        assert issubclass(getattr(agentflow, name), agentflow.AgentflowError), name
    with pytest.raises(agentflow.DatabaseNotFoundError) as err:
        af.ask("How many stores?", db="concert_singer")
    assert isinstance(err.value, LookupError)
    with pytest.raises(agentflow.InvalidRequest) as bad:
        af.ask("   ", db="bookshop")
    assert isinstance(bad.value, ValueError)
    with pytest.raises(agentflow.AgentflowError):
        af.ask("How many stores?", db="bookshop", pipeline="chesss")


def test_unknown_database_names_the_known_ones_and_how_to_add_more(recorded) -> None:
    af, _ = recorded
    with pytest.raises(agentflow.DatabaseNotFoundError) as err:
        af.ask("How many singers?", db="concert_singer")
    message = str(err.value)
    assert "bookshop" in message and "--data" in message and "Spider/BIRD" in message
    with pytest.raises(agentflow.DatabaseNotFoundError) as missing:
        af.ask("How many singers?", db="/nonexistent/music.sqlite")
    assert "file not found" in str(missing.value)


def test_a_follow_up_is_its_own_query_with_the_previous_turn_in_its_prompts(recorded) -> None:
    af, prompts = recorded
    first = af.ask("How many stores are there?", db="bookshop", pipeline="chess", slo=60)
    assert first.status == "done" and first.conversation_id
    before = len(prompts)
    second = af.ask("now only those in Lisbon", db="bookshop", pipeline="chess", slo=30,
                    conversation=first.conversation_id)
    assert second.status == "done"
    assert second.query_id != first.query_id and second.conversation_id == first.conversation_id
    assert second.slo_s == 30 and second.stages  # its own SLO and timeline
    sql_prompts = [p for stage, p in prompts[before:] if stage == "generate_candidate"]
    assert sql_prompts and all("Earlier in this conversation" in p
                               and "How many stores are there?" in p and GOOD in p
                               for p in sql_prompts)
    # the first question's prompts had no such context
    assert not any("Earlier in this conversation" in p for _, p in prompts[:before])
    # a new question without the id starts a new conversation
    third = af.ask("How many stores are there?", db="bookshop", pipeline="single")
    assert third.conversation_id != first.conversation_id


def test_follow_up_errors_are_clear(recorded) -> None:
    af, _ = recorded
    with pytest.raises(agentflow.ConversationNotFoundError, match="unknown conversation"):
        af.ask("and now?", db="bookshop", conversation="c-nope")
