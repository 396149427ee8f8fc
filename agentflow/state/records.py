"""What the state store keeps, as typed records (the store's boundary with the server).

Why records rather than the live objects: a query's handle (``agentflow.api.QueryHandle``)
holds a future, listeners and a lock that only mean something inside the process running
it; what another replica — or this one after a restart — needs is the plain data: who asked
what, where it stands, its events so far and its answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

FINAL = ("done", "unsure", "failed", "cancelled", "rejected")


@dataclass(frozen=True)
class QueryRequest:
    """Everything needed to run the query again under its id (failover re-runs it)."""

    question: str
    db: str
    pipeline: str
    slo_s: float | None = None
    evidence: str = ""
    conversation_id: str | None = None
    min_confidence: float | None = None
    slo_class: str | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> QueryRequest:
        return cls(**json.loads(text))


@dataclass
class QueryRecord:
    query_id: str
    tenant: str | None
    request: QueryRequest
    status: str = "pending"  # pending | running | one of FINAL
    owner: str | None = None  # the replica running it
    attempt: int = 1  # 2+: it moved to another replica after its owner died
    created: float = 0.0
    finished: float | None = None
    answer: dict[str, Any] | None = None  # Answer.to_dict() with rows capped
    moves: list[dict[str, Any]] = field(default_factory=list)  # [{from, to, at}]

    @property
    def done(self) -> bool:
        return self.finished is not None


@dataclass(frozen=True)
class Slot:
    """A concurrency slot held by one query of a tenant, on one replica."""

    token: str
    tenant: str
    replica: str


def cap_rows(answer: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """``answer`` with as many leading rows as fit in ``max_bytes`` of JSON; ``truncated``
    says when rows were dropped (the same flag a row limit sets)."""
    rows = answer.get("rows") or []
    encoded = [len(json.dumps(r, default=str, separators=(",", ":"))) + 1 for r in rows]
    if sum(encoded) <= max_bytes:
        return answer
    kept, used = 0, 0
    for size in encoded:
        if used + size > max_bytes:
            break
        used += size
        kept += 1
    return {**answer, "rows": rows[:kept], "truncated": True}
