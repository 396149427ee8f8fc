"""What a Text-to-SQL pipeline is to the runtime: a DAG builder plus a way to read its answer.

Concrete pipelines (single, chess, macsql) live in the top-level ``pipelines`` package; this
module holds the contract and the environment they run in.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from agentflow.sql import Database
from agentflow.workflow.query import Query


@dataclass
class PipelineEnv:
    """Everything a pipeline's stages may use besides the LLM: the database and tools.

    ``fewshot`` is a retrieval pool built from a *different* split than the one evaluated
    (e.g. Spider train); ``descriptions`` are BIRD's column descriptions when present.
    """

    db: Database
    fewshot: Any = None  # agentflow.retrieval.FewShotPool | None
    descriptions: dict[str, Any] = field(default_factory=dict)
    sql_timeout_s: float = 10.0
    max_rows: int = 1000
    # Constrain SQL-writing calls with a grammar of the shown schema (llama.cpp, or servers
    # that accept a GBNF ``grammar`` field); off for endpoints that reject unknown fields.
    constrain_sql: bool = True
    # Earlier turns of the conversation (agentflow.conversation.Turn: question, sql), oldest
    # first; empty for a first question.
    history: tuple[Any, ...] = ()
    # What the question's taught glossary terms mean (agentflow.teaching.glossary_block);
    # the SQL-writing calls get it right after the schema.
    glossary: str = ""
    # Runs a blocking database call within the query's tenant's share of the database
    # threads (agentflow.shares); None: a thread of asyncio's default executor.
    run_db: Any = None


@dataclass
class PipelineOutput:
    """A pipeline's final word: the SQL it stands behind and, if it failed, why."""

    sql: str | None
    error: str | None = None  # set when no usable SQL came out (e.g. nothing executes)
    details: dict[str, Any] = field(default_factory=dict)
    confidence: Any = None  # agentflow.confidence.Confidence: how sure the pipeline is


class Pipeline(abc.ABC):
    name: str = "pipeline"

    @abc.abstractmethod
    def build(self, query: Query, env: PipelineEnv) -> nx.DiGraph:
        """The initial DAG for ``query`` (stages may grow it while running)."""

    @abc.abstractmethod
    def output(self, state: dict[str, Any]) -> PipelineOutput:
        """Read the answer from the per-query state once the DAG has finished."""

    def describe(self) -> dict[str, Any]:
        """Parameters worth recording in traces and reports."""
        return {"name": self.name}
