"""The HTTP API's request and response bodies.

Typed at the boundary on purpose: FastAPI validates requests against these models (and
documents them at ``/docs``), and responses are built from them, so what a client sees never
depends on the internals' dict shapes (which carry things such as trace extras that do not
belong on the wire).
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, NamedTuple

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from agentflow.api import MAX_QUESTION_CHARS

MAX_SLO_S = 24 * 3600
MAX_EVIDENCE_CHARS = 4000

_SURROGATES = re.compile("[\ud800-\udfff]")


def first_lone_surrogate(text: str) -> int | None:
    """Index of the first code point that UTF-8 cannot encode (a lone surrogate), if any."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as err:
        return err.start


def valid_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD, so it always serialises."""
    if first_lone_surrogate(text) is None:
        return text
    return _SURROGATES.sub("\ufffd", text)


# "unsure": the pipeline answered, but below the request's min_confidence (best guess attached)
QueryStatusName = Literal["pending", "running", "done", "unsure", "failed", "cancelled",
                          "rejected"]


class _TwoSlos(NamedTuple):
    slo: Any
    slo_seconds: Any


class QueryRequest(BaseModel):
    """A question to answer. ``wait=false`` answers 202 with the id at once."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"question": "How many stores are there?", "db": "bookshop", "slo_seconds": 30}]})

    question: str = Field(description="the question, in plain language",
                          json_schema_extra={"maxLength": MAX_QUESTION_CHARS, "minLength": 1})
    db: str = Field(min_length=1, max_length=200, description="database id (GET /v1/databases)")
    slo_seconds: float | None = Field(
        None, validation_alias=AliasChoices("slo_seconds", "slo"),
        description="end-to-end latency target in seconds (`slo`, the Python/CLI name, "
                    "works too)")
    pipeline: str | None = Field(None, max_length=64,
                                 description="chess, macsql or single (default: the server's)")
    evidence: str = Field("", max_length=MAX_EVIDENCE_CHARS,
                          description="BIRD-style hint for the question")
    wait: bool = Field(True, description="wait for the answer (true) or answer 202 at once")
    conversation_id: str | None = Field(
        None, max_length=64, description="a follow-up: the conversation_id of an earlier "
                                         "answer, whose question and SQL become context")
    min_confidence: float | None = Field(
        None, ge=0.0, le=1.0, description="below this confidence score the answer comes back "
                                          "'unsure' (SQL and rows attached), not 'done'")
    slo_class: str | None = Field(
        None, min_length=1, max_length=64,
        description="SLO class (interactive, standard, batch or a configured one): what the "
                    "scheduler ranks and sheds by; default: the API key's tenant's, else "
                    "standard. Without slo_seconds the class's own deadline applies")

    @field_validator("question", "db", "pipeline", "evidence", "slo_class")
    @classmethod
    def _valid_unicode(cls, value: str | None) -> str | None:
        """JSON may carry lone surrogates (``\\ud800``) that are not text: refuse them here,
        or they would break every response (and listing) that echoes the value."""
        if value is not None:
            bad = first_lone_surrogate(value)
            if bad is not None:
                raise ValueError(f"contains invalid Unicode (a lone surrogate "
                                 f"U+{ord(value[bad]):04X} at character {bad}); send UTF-8 "
                                 f"text")
        return value

    @field_validator("question")
    @classmethod
    def _question(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("the question is empty; type a question about the database")
        if len(value) > MAX_QUESTION_CHARS:
            raise ValueError(f"the question is too long ({len(value)} characters; at most "
                             f"{MAX_QUESTION_CHARS})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _one_slo(cls, data: Any) -> Any:
        """``slo`` and ``slo_seconds`` are one setting; both with different values is refused
        on the field (so the error names it) by ``_slo_type``."""
        if isinstance(data, dict) and "slo" in data and "slo_seconds" in data:
            both = (data["slo"], data["slo_seconds"])
            data = {k: v for k, v in data.items() if k != "slo"}
            if both[0] != both[1]:
                data["slo_seconds"] = _TwoSlos(*both)
        return data

    @field_validator("slo_seconds", mode="before")
    @classmethod
    def _slo_type(cls, value: Any) -> Any:
        if isinstance(value, _TwoSlos):
            raise ValueError(f"the SLO is given twice (slo={value.slo!r}, slo_seconds="
                             f"{value.slo_seconds!r}); they are the same setting: give one")
        if isinstance(value, bool):  # JSON true would otherwise pass as 1.0 seconds
            raise ValueError(f"must be a number of seconds, got {str(value).lower()}")
        return value

    @field_validator("slo_seconds")
    @classmethod
    def _slo(cls, value: float | None) -> float | None:
        if value is not None and (not math.isfinite(value) or not 0 < value <= MAX_SLO_S):
            raise ValueError(f"must be a positive number of seconds (at most {MAX_SLO_S}), "
                             f"got {value:g}")
        return value


class FailedAttempt(BaseModel):
    """A try of an LLM call that its instance failed (the call may have been re-run)."""

    instance: str
    error: str
    retryable: bool


class LLMCallView(BaseModel):
    model_config = ConfigDict(extra="ignore")

    request_id: str
    instance: str = Field(description="the instance that ran the call")
    priority: int
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    submitted: float = Field(description="seconds since the query arrived")
    started: float
    finished: float
    queue_s: float = Field(description="waiting in the scheduler's queues")
    run_s: float = Field(description="running on the instance")
    finish_reason: str
    node: str = Field("", description="the Ray node that ran it (empty in-process)")
    failed_attempts: list[FailedAttempt] = Field(default_factory=list)


class StageView(BaseModel):
    """One stage of the query's workflow; times are seconds since the query arrived."""

    model_config = ConfigDict(extra="ignore")

    node_id: str
    stage: str
    kind: str = Field(description="llm or tool")
    parents: list[str] = Field(default_factory=list)
    start: float | None = None
    end: float | None = None
    status: str = "pending"
    error: str | None = None
    summary: str = ""
    instances: list[str] = Field(default_factory=list)
    queue_s: float = 0.0
    run_s: float = 0.0
    llm_calls: list[LLMCallView] = Field(default_factory=list)


class Retry(BaseModel):
    """A call that failed on one instance; ``rerun_on`` is where it then succeeded."""

    node_id: str
    stage: str
    request_id: str
    failed_on: str
    error: str
    rerun_on: str | None


class ConfidenceView(BaseModel):
    score: float = Field(ge=0.0, le=1.0)
    level: Literal["high", "medium", "low"]
    reasons: list[str] = Field(description="each signal that moved the score, in words")


class QuerySummary(BaseModel):
    query_id: str
    status: QueryStatusName
    question: str
    db: str
    pipeline: str
    slo_s: float | None = None
    latency_s: float | None = None
    met_slo: bool | None = None
    error: str | None = None
    conversation_id: str | None = None
    tenant: str | None = Field(None, description="who asked (the API key's tenant)")
    slo_class: str | None = Field(None, description="the query's SLO class (the request's, "
                                                    "else the tenant's, else standard)")


class QueryView(QuerySummary):
    """A query as it stands: in progress (stages so far) or finished (the full answer)."""

    sql: str | None = None
    columns: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)
    truncated: bool = False
    truncated_by: str | None = Field(None, description="which cap cut the rows short: 'rows' "
                                     "(max_rows) or 'bytes' (the answer's byte cap)")
    stages: list[StageView] = Field(default_factory=list)
    usage: dict[str, Any] = Field(default_factory=dict)
    details: dict[str, Any] = Field(default_factory=dict)
    retries: list[Retry] = Field(default_factory=list,
                                 description="LLM calls that failed on an instance and were "
                                             "re-run elsewhere (or not, if the query failed)")
    links: dict[str, str] = Field(default_factory=dict)
    confidence: ConfidenceView | None = Field(
        None, description="how sure the pipeline is (agentflow.confidence); none when it "
                          "never answered")


class QueryList(BaseModel):
    queries: list[QuerySummary]


class DatabaseInfo(BaseModel):
    id: str
    engine: str
    tables: list[str]
    examples: list[str] = Field(default_factory=list, description="a few sample questions")


class DatabaseList(BaseModel):
    databases: list[DatabaseInfo]


class InstanceInfo(BaseModel):
    name: str
    gpu: str | None = None
    model: str | None = None
    up: bool
    waiting: int
    running: int
    max_inflight: int
    health: Literal["healthy", "suspect", "down", "probing"] = Field(
        "healthy", description="suspect: a call timed out; down: failed or circuit open; "
                               "both get no work until a probe call answers")
    reason: str | None = Field(None, description="why it is not healthy")
    # Instances placed on a Ray cluster (agentflow.distributed); None in-process.
    node: str | None = Field(None, description="the Ray node hosting the instance's actor")
    gpu_ids: list[str] | None = None
    restarts: int | None = Field(None, description="times Ray restarted the actor")


class InstanceList(BaseModel):
    instances: list[InstanceInfo]


class PipelineList(BaseModel):
    pipelines: list[str]
    default: str
    default_slo_s: float | None = None


class Health(BaseModel):
    """ok: every instance up; degraded: some down (still serving); unavailable: none up;
    draining: shutting down. The last two answer 503."""

    status: Literal["ok", "degraded", "unavailable", "draining"]
    instances: int
    instances_up: int
    instances_down: list[str] = Field(default_factory=list)
