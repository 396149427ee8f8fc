"""``single``: one prompt, one LLM call — the baseline every other pipeline is measured against.

The prompt carries the whole schema (with sample values) and retrieved examples; the SQL is
executed once for the answer, with no revision.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from agentflow.workflow import Query, StageContext, chain
from agentflow.workflow.pipeline import Pipeline, PipelineEnv, PipelineOutput
from pipelines import prompts
from pipelines.common import (
    SQL_PARAMS,
    confidence_of,
    execute_sql,
    llm_node,
    record_attempt,
    set_schema_grammar,
    sql_context,
    sql_params,
    taught_match,
    taught_node,
    tool_node,
    written_sql,
)


class SinglePipeline(Pipeline):
    name = "single"

    def __init__(self, *, n_shots: int = 3, samples: int = 3):
        self.n_shots = n_shots
        self.samples = samples

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "n_shots": self.n_shots, "samples": self.samples}

    def build(self, query: Query, env: PipelineEnv) -> nx.DiGraph:
        async def generate(ctx: StageContext) -> str:
            schema = ctx.env.db.schema_prompt(samples=self.samples)
            prefix = sql_context(ctx.env, schema, ctx.query.question, self.n_shots)
            prompt = prompts.generate_sql(prefix, ctx.query.question, ctx.query.evidence)
            set_schema_grammar(ctx.env, ctx.state, None)
            result = await ctx.llm(prompt, sql_params(ctx.env, ctx.state), answer_prefix="SELECT")
            sql = written_sql(ctx, result)
            ctx.summary = sql
            return sql

        async def execute(ctx: StageContext):
            run = await execute_sql(ctx.env, ctx.input("generate_sql"))
            record_attempt(ctx, 0, run)
            ctx.state["final"] = run
            return run

        g = chain(llm_node("generate_sql", "generate_sql", generate, prompt_tokens=900,
                           output_tokens=40, max_tokens=SQL_PARAMS.max_tokens),
                  tool_node("execute", "execute", execute))
        match = taught_match(env, query.question)
        if match is None:
            return g

        async def choose(ctx: StageContext):
            # The taught SQL, when it ran and returned rows, is the user's own answer.
            taught = ctx.state.get("taught") or {}
            if taught.get("ok"):
                ctx.state["final"] = ctx.state["candidates"][1]
                ctx.summary = "the taught SQL's result"
            else:
                ctx.summary = "the model's SQL (the taught SQL did not return rows)"
            return ctx.state["final"]

        taught = taught_node(match, 1)
        g.add_node(taught.id, node=taught)
        pick = tool_node("choose", "choose", choose)
        g.add_node(pick.id, node=pick)
        g.add_edges_from([("execute", "choose"), (taught.id, "choose")])
        return g

    def output(self, state: dict[str, Any]) -> PipelineOutput:
        final = state.get("final")
        taught = state.get("taught") or {}
        confidence = confidence_of(state, final_candidate=1 if taught.get("ok") else 0)
        if final is None or not final.sql:
            return PipelineOutput(sql=None, error="the model wrote no SQL", confidence=confidence)
        if not final.ok:
            return PipelineOutput(sql=final.sql, error=f"the SQL does not execute: {final.error}",
                                  confidence=confidence)
        return PipelineOutput(sql=final.sql, confidence=confidence)
