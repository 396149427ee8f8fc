"""Follow-ups across ``agentflow ask`` runs: each run is a new process, so the conversations
it starts are kept in a small file (``<cache>/cli-conversations.json``, ``AGENTFLOW_CACHE``
moves it) and ``--conversation ID`` brings one back. Only the last ``KEEP`` are kept."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from agentflow.conversation import Turn
from agentflow.errors import ConversationNotFoundError

KEEP = 200


def store_path() -> Path:
    from agentflow.datasets.types import cache_dir

    return cache_dir() / "cli-conversations.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def load(conversation_id: str, path: Path | None = None) -> tuple[str, list[Turn]]:
    """(db, turns) of a conversation an earlier run saved; a clear error when unknown."""
    path = path or store_path()
    item = _read(path).get(conversation_id)
    if not isinstance(item, dict):
        raise ConversationNotFoundError(
            f"unknown conversation {conversation_id!r}: not one an earlier `agentflow ask` "
            f"kept in {path} (the last {KEEP} are kept; a server's conversations live in "
            "that server: ask it over HTTP). Ask without --conversation to start one")
    return str(item["db"]), [Turn(t["question"], t["sql"]) for t in item.get("turns", [])]


def save(conversation_id: str, db: str, turns: list[Turn] | tuple[Turn, ...],
         path: Path | None = None) -> None:
    """Write the conversation (atomically: two runs at once never leave half a file)."""
    path = path or store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read(path)
    data.pop(conversation_id, None)
    data[conversation_id] = {"db": db, "updated": time.time(),
                             "turns": [{"question": t.question, "sql": t.sql} for t in turns]}
    for old in list(data)[:-KEEP]:
        del data[old]
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".conv-")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
