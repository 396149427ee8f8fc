"""Follow-up questions: the turns of a conversation, kept so the next turn has context.

A conversation is a short list of (question, SQL) turns on one database. A follow-up such as
"now only for 2023" is answered as its own scheduled query (own SLO, own timeline); the
pipelines see the earlier turns in their prompts (``PipelineEnv.history``) so the model can
rewrite the previous SQL instead of guessing what "now" refers to. Only turns that produced
SQL are kept, the last ``max_turns`` of them; the oldest conversations are forgotten first.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from agentflow.errors import ConversationNotFoundError, InvalidRequest
from agentflow.tenants import Tenant, sees


@dataclass(frozen=True)
class Turn:
    question: str
    sql: str


@dataclass
class Conversation:
    id: str
    db: str
    turns: list[Turn] = field(default_factory=list)
    owner: str | None = None  # the tenant that started it (agentflow.tenants)


class Conversations:
    def __init__(self, keep: int = 1000, max_turns: int = 4):
        self.keep = keep
        self.max_turns = max_turns
        self._items: OrderedDict[str, Conversation] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, db: str, owner: str | None = None) -> str:
        conversation = Conversation(f"c-{uuid.uuid4().hex[:12]}", db, owner=owner)
        with self._lock:
            self._items[conversation.id] = conversation
            while len(self._items) > self.keep:
                self._items.popitem(last=False)
        return conversation.id

    def follow(self, conversation_id: str, db: str, viewer: Tenant | None = None
               ) -> tuple[Turn, ...]:
        """The turns so far of ``conversation_id`` (raises if unknown or on another db).
        Another tenant's conversation is unknown to ``viewer``, exactly like one never
        started."""
        with self._lock:
            conversation = self._items.get(conversation_id)
            if conversation is None or not sees(viewer, conversation.owner):
                raise ConversationNotFoundError(
                    f"unknown conversation {conversation_id!r} (it may have been forgotten: "
                    f"the last {self.keep} are kept); ask without conversation_id to start one")
            if conversation.db != db:
                raise InvalidRequest(f"conversation {conversation_id} is about database "
                                     f"{conversation.db!r}, not {db!r}")
            self._items.move_to_end(conversation_id)
            return tuple(conversation.turns)

    def restore(self, conversation_id: str, db: str, turns: list[Turn]) -> None:
        """Bring back a conversation kept elsewhere (the CLI keeps its own between runs)."""
        with self._lock:
            self._items[conversation_id] = Conversation(conversation_id, db,
                                                        list(turns)[-self.max_turns:])
            while len(self._items) > self.keep:
                self._items.popitem(last=False)

    def turns(self, conversation_id: str) -> tuple[str, tuple[Turn, ...]] | None:
        """(db, turns) of a known conversation, or None."""
        with self._lock:
            c = self._items.get(conversation_id)
            return None if c is None else (c.db, tuple(c.turns))

    def add(self, conversation_id: str, question: str, sql: str | None) -> None:
        if not sql:
            return
        with self._lock:
            conversation = self._items.get(conversation_id)
            if conversation is not None:
                conversation.turns.append(Turn(question, sql))
                del conversation.turns[:-self.max_turns]
