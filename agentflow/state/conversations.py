"""Conversations kept in the state store, so a follow-up works on any replica and after a
restart. Same methods as ``agentflow.conversation.Conversations`` (the engine calls
``start``/``follow``/``add``; the CLI ``restore``/``turns``), same errors."""

from __future__ import annotations

import uuid

from agentflow.conversation import Turn
from agentflow.errors import ConversationNotFoundError, InvalidRequest
from agentflow.state.store import StateStore
from agentflow.tenants import Tenant, sees


class StoreConversations:
    def __init__(self, store: StateStore, max_turns: int = 4):
        self.store = store
        self.max_turns = max_turns
        self.keep = store.keep_conversations  # per tenant

    def start(self, db: str, owner: str | None = None) -> str:
        conversation_id = f"c-{uuid.uuid4().hex[:12]}"
        self.store.conversation_start(conversation_id, owner, db)
        return conversation_id

    def follow(self, conversation_id: str, db: str, viewer: Tenant | None = None
               ) -> tuple[Turn, ...]:
        """The turns so far; another tenant's conversation is unknown, as one never
        started."""
        found = self.store.conversation(conversation_id)
        if found is None or not sees(viewer, found[0]):
            raise ConversationNotFoundError(
                f"unknown conversation {conversation_id!r} (it may have been forgotten: "
                f"the last {self.keep} per tenant are kept); ask without conversation_id to "
                "start one")
        owner, known_db, turns = found
        if known_db != db:
            raise InvalidRequest(f"conversation {conversation_id} is about database "
                                 f"{known_db!r}, not {db!r}")
        return tuple(Turn(q, s) for q, s in turns)

    def restore(self, conversation_id: str, db: str, turns: list[Turn]) -> None:
        self.store.conversation_put(conversation_id, None, db,
                                    [(t.question, t.sql) for t in turns][-self.max_turns:])

    def turns(self, conversation_id: str) -> tuple[str, tuple[Turn, ...]] | None:
        found = self.store.conversation(conversation_id)
        return None if found is None else (found[1], tuple(Turn(q, s) for q, s in found[2]))

    def add(self, conversation_id: str, question: str, sql: str | None) -> None:
        if sql:
            # not waited on: the engine's loop calls this, and the next follow-up comes
            # after the client has the answer, a round trip later than the write's commit
            self.store.conversation_add(conversation_id, question, sql, self.max_turns,
                                        wait=False)
