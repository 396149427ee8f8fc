"""``macsql``: MAC-SQL's three agents (Wang et al., 2024) as a DAG.

    selector (LLM; only for large schemas) -> decomposer (LLM) -> execute (tool)
      [-> refine.r (LLM) -> execute.r (tool)]*  (<= k rounds, when the SQL fails or is empty)
      -> finalize (tool)

Why this one next to ``chess``: its refiner is driven by execution feedback (like CHESS's
revision loop) while the selector appears only when the schema is large, so the DAG's shape
depends on the database and on run-time errors — a different workload for the scheduler
than CHESS's wide fan-out, at a fraction of its calls.
"""

from __future__ import annotations

import re
from typing import Any

import networkx as nx

from agentflow.llm.base import SamplingParams
from agentflow.workflow import Query, StageContext, chain
from agentflow.workflow.pipeline import Pipeline, PipelineEnv, PipelineOutput
from pipelines import prompts
from pipelines.common import (
    Execution,
    add_revision_round,
    confidence_of,
    execute_sql,
    llm_node,
    record_attempt,
    set_schema_grammar,
    sql_context,
    tool_node,
    written_sql,
)

_SELECTOR_PARAMS = SamplingParams(max_tokens=40, temperature=0.0, stop=("\n",))
_DECOMPOSER_PARAMS = SamplingParams(max_tokens=200, temperature=0.0, stop=(";", "\n\n\n"))


class MacSqlPipeline(Pipeline):
    name = "macsql"

    def __init__(self, *, max_refinements: int = 2, selector_min_columns: int = 40,
                 n_shots: int = 3, samples: int = 3):
        self.max_refinements = max_refinements
        self.selector_min_columns = selector_min_columns
        self.n_shots = n_shots
        self.samples = samples

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "max_refinements": self.max_refinements,
                "selector_min_columns": self.selector_min_columns, "n_shots": self.n_shots}

    def build(self, query: Query, env: PipelineEnv) -> nx.DiGraph:
        n_columns = sum(len(t.columns) for t in env.db.schema().tables)
        if n_columns >= self.selector_min_columns:
            first = llm_node("selector", "selector", self._selector, prompt_tokens=900,
                             output_tokens=20, max_tokens=_SELECTOR_PARAMS.max_tokens)
        else:
            first = tool_node("selector", "keep_schema", self._keep_schema)
        graph = chain(first,
                      llm_node("decomposer", "decomposer", self._decomposer, prompt_tokens=800,
                               output_tokens=120, max_tokens=_DECOMPOSER_PARAMS.max_tokens),
                      tool_node("execute.0.0", "execute", self._execute),
                      tool_node("finalize", "finalize", self._finalize))
        return graph

    async def _keep_schema(self, ctx: StageContext) -> None:
        self._set_context(ctx, None)
        ctx.summary = "small schema: selector skipped"

    async def _selector(self, ctx: StageContext) -> dict[str, None] | None:
        q = ctx.query
        full = ctx.env.db.schema_prompt(samples=0)
        result = await ctx.llm(prompts.select_tables(full, q.question, q.evidence),
                               _SELECTOR_PARAMS)
        known = {t.lower(): t for t in ctx.env.db.schema().table_names}
        named = [known[w.lower()] for w in re.findall(r"[A-Za-z_][\w]*", result.text)
                 if w.lower() in known]
        tables = {t: None for t in dict.fromkeys(named)} or None
        self._set_context(ctx, tables)
        ctx.summary = ", ".join(tables) if tables else "selector named no table: full schema"
        return tables

    def _set_context(self, ctx: StageContext, tables: dict[str, None] | None) -> None:
        schema = ctx.env.db.schema_prompt(tables=tables, samples=self.samples)
        prefix = sql_context(ctx.env, schema, ctx.query.question, self.n_shots)
        ctx.state["sql_context"] = prefix
        ctx.state["_context_tokens"] = len(prefix) // 4
        set_schema_grammar(ctx.env, ctx.state, tables)

    async def _decomposer(self, ctx: StageContext) -> str:
        q = ctx.query
        result = await ctx.llm(prompts.decompose(ctx.state["sql_context"], q.question,
                                                 q.evidence),
                               _DECOMPOSER_PARAMS)
        sql = written_sql(ctx, result)
        ctx.summary = sql or "(no SQL in the decomposition)"
        return sql

    async def _execute(self, ctx: StageContext) -> Execution:
        run = await execute_sql(ctx.env, ctx.input("decomposer"))
        record_attempt(ctx, 0, run)
        add_revision_round(ctx, candidate=0, round_=0, max_rounds=self.max_refinements,
                           execution=run, sql_context_key="sql_context", downstream="finalize",
                           revise_stage="refine")
        return run

    async def _finalize(self, ctx: StageContext) -> Execution:
        final = ctx.state["candidates"][0]
        ctx.state["final"] = final
        ctx.summary = final.sql
        return final

    def output(self, state: dict[str, Any]) -> PipelineOutput:
        final: Execution | None = state.get("final")
        details = {"attempts": state.get("attempts", [])}
        confidence = confidence_of(state)
        if final is None or not final.sql:
            return PipelineOutput(sql=None, error="the decomposer wrote no SQL", details=details,
                                  confidence=confidence)
        if not final.ok:
            return PipelineOutput(sql=final.sql, details=details, confidence=confidence,
                                  error=f"the SQL still fails after {self.max_refinements} "
                                        f"refinements: {final.error}")
        return PipelineOutput(sql=final.sql, details=details, confidence=confidence)


