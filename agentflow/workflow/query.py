"""A user's question as it moves through the system, and its timeline."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

_query_ids = itertools.count(1)


class QueryStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"  # the pipeline produced an answer (which may still be wrong)
    FAILED = "failed"  # the pipeline could not produce an answer; ``error`` says why
    CANCELLED = "cancelled"
    REJECTED = "rejected"  # never admitted (overload, bad input); ``error`` says why


@dataclass
class LLMCallRecord:
    request_id: str
    instance: str
    priority: int
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    submitted: float  # clock time the call was handed to the router
    started: float  # clock time the instance started processing it
    finished: float
    finish_reason: str
    max_tokens: int | None = None  # the call's output cap (replays clip predictions to it)
    node: str = ""  # the machine that ran it, for instances placed elsewhere (Ray)
    failed_attempts: list[dict[str, str]] = field(default_factory=list)  # before this one

    @property
    def queue_s(self) -> float:
        return max(0.0, self.started - self.submitted)

    @property
    def run_s(self) -> float:
        return max(0.0, self.finished - self.started)


@dataclass
class StageRecord:
    """One node of the query's DAG as it ran: when, how, and with which LLM calls."""

    node_id: str
    stage: str
    kind: str  # "llm" | "tool"
    parents: list[str]
    start: float | None = None
    end: float | None = None
    status: str = "pending"  # pending | running | ok | error | cancelled
    error: str | None = None
    summary: str = ""  # a short human line: the SQL produced, rows found, ...
    llm_calls: list[LLMCallRecord] = field(default_factory=list)
    # What the stage produced that a trace replay needs (prompt/output text live in llm_calls'
    # trace records, see ``trace``); kept small.
    extra: dict[str, Any] = field(default_factory=dict)
    # The stage whose finish added this one to the graph (a revision round, the unit-test
    # phase); None for the pipeline's initial graph. Traces keep it, so a replay can grow the
    # graph when serving grew it, not show the scheduler the whole run at arrival.
    expanded_by: str | None = None

    @property
    def duration_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return self.end - self.start


@dataclass
class Query:
    question: str
    db_id: str
    arrival: float
    slo_s: float | None = None
    evidence: str = ""
    pipeline: str = ""
    slo_class: str | None = None  # agentflow.slo_classes name; None: the default class
    tenant: str | None = None  # who asked (fair share between tenants); None: anonymous
    id: str = field(default_factory=lambda: f"q{next(_query_ids)}")
    status: QueryStatus = QueryStatus.PENDING
    error: str | None = None
    finished: float | None = None
    timeline: list[StageRecord] = field(default_factory=list)

    @property
    def deadline(self) -> float | None:
        """Arrival + SLO: the end-to-end target every stage budget is carved from."""
        return None if self.slo_s is None else self.arrival + self.slo_s

    @property
    def latency_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival

    def stage(self, node_id: str) -> StageRecord:
        """The first record of ``node_id`` in the timeline. Looked up in an index of the
        records by node id (not a dataclass field: equality, repr and ``asdict`` do not see
        it), extended as the timeline grows — it only grows, by appends — and rebuilt if the
        list was replaced or shrank; the runtime asks at every stage start and finish."""
        timeline = self.timeline
        index: tuple[list[StageRecord], int, dict[str, StageRecord]] | None = \
            self.__dict__.get("_stage_index")
        if index is None or index[0] is not timeline or index[1] > len(timeline):
            index = self.__dict__["_stage_index"] = (timeline, 0, {})
        _, seen, by_id = index
        if seen < len(timeline):
            for added in timeline[seen:]:
                by_id.setdefault(added.node_id, added)
            self.__dict__["_stage_index"] = (timeline, len(timeline), by_id)
        found = by_id.get(node_id)
        if found is None:
            raise KeyError(node_id)
        return found

    def timeline_dicts(self) -> list[dict[str, Any]]:
        """The timeline in start order (stages that never started last), times relative to
        arrival."""
        out = []
        ordered = sorted(self.timeline, key=lambda r: (r.start is None, r.start or 0.0))
        for r in ordered:
            d = asdict(r)
            d["start"] = None if r.start is None else r.start - self.arrival
            d["end"] = None if r.end is None else r.end - self.arrival
            d["llm_calls"] = [
                {**asdict(c), "queue_s": c.queue_s, "run_s": c.run_s,
                 "submitted": c.submitted - self.arrival, "started": c.started - self.arrival,
                 "finished": c.finished - self.arrival}
                for c in r.llm_calls]
            out.append(d)
        return out
