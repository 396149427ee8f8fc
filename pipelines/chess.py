"""``chess``: a CHESS-style agentic pipeline (Talaei et al., 2024), written for agentflow.

    extract_keywords (LLM) -> retrieve_values (tool) -> select_schema (tool)
      -> generate_candidate.i (LLM, N in parallel, varied prompts/temperatures)
      -> execute.i.0 (tool) [-> revise.i.r (LLM) -> execute.i.r (tool)]*  (<= k rounds)
      -> select (tool: cluster candidates by execution result)
      [-> generate_unit_tests (LLM) -> evaluate.c (LLM, one per cluster) -> choose (tool)]

The bracketed parts exist only when needed: revision rounds when a candidate fails or returns
nothing, unit tests only when the surviving candidates disagree. The graph grows at run time,
which is what the scheduler sees.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from agentflow.llm.base import SamplingParams
from agentflow.workflow import Query, StageContext
from agentflow.workflow.pipeline import Pipeline, PipelineEnv, PipelineOutput
from pipelines import prompts
from pipelines.common import (
    SQL_PARAMS,
    Execution,
    add_revision_round,
    confidence_of,
    execute_sql,
    llm_node,
    rank_clusters,
    record_attempt,
    result_preview,
    set_schema_grammar,
    sql_context,
    sql_params,
    taught_match,
    taught_node,
    tool_node,
    written_sql,
)
from pipelines.sqltext import result_key

# Candidate i uses variant i % len(_VARIANTS): (instruction style, temperature).
_VARIANTS = (("plain", 0.0), ("joins", 0.3), ("stepwise", 0.5))
_KEYWORD_PARAMS = SamplingParams(max_tokens=40, temperature=0.0, stop=("\n",))
_VERDICT_PARAMS = SamplingParams(max_tokens=3, temperature=0.0, stop=("\n",))


class ChessPipeline(Pipeline):
    name = "chess"

    def __init__(self, *, n_candidates: int = 3, max_revisions: int = 2, n_tests: int = 2,
                 n_shots: int = 3, samples: int = 3, max_values: int = 6):
        if n_candidates < 1:
            raise ValueError("n_candidates must be at least 1")
        self.n_candidates = n_candidates
        self.max_revisions = max_revisions
        self.n_tests = n_tests
        self.n_shots = n_shots
        self.samples = samples
        self.max_values = max_values

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "n_candidates": self.n_candidates,
                "max_revisions": self.max_revisions, "n_tests": self.n_tests,
                "n_shots": self.n_shots}

    # ------------------------------------------------------------------------------ graph
    def build(self, query: Query, env: PipelineEnv) -> nx.DiGraph:
        g = nx.DiGraph()

        def add(node, *parents):
            g.add_node(node.id, node=node)
            g.add_edges_from((p, node.id) for p in parents)

        add(llm_node("extract_keywords", "extract_keywords", self._extract_keywords,
                     prompt_tokens=180, output_tokens=20, max_tokens=_KEYWORD_PARAMS.max_tokens))
        add(tool_node("retrieve_values", "retrieve_values", self._retrieve_values),
            "extract_keywords")
        add(tool_node("select_schema", "select_schema", self._select_schema), "retrieve_values")
        add(tool_node("select", "select", self._select))
        for i in range(self.n_candidates):
            add(llm_node(f"generate_candidate.{i}", "generate_candidate", self._generator(i),
                         prompt_tokens=700, output_tokens=40,
                         max_tokens=SQL_PARAMS.max_tokens), "select_schema")
            add(tool_node(f"execute.{i}.0", "execute", self._executor(i)),
                f"generate_candidate.{i}")
            g.add_edge(f"execute.{i}.0", "select")
        match = taught_match(env, query.question)
        if match is not None:  # a taught SQL answers this question: one more candidate
            add(taught_node(match, self.n_candidates))
            g.add_edge("taught_candidate", "select")
        return g

    # ------------------------------------------------------------------------------ stages
    async def _extract_keywords(self, ctx: StageContext) -> list[str]:
        from agentflow.retrieval import heuristic_keywords

        q = ctx.query
        result = await ctx.llm(prompts.extract_keywords(q.question, q.evidence),
                               _KEYWORD_PARAMS)
        from_llm = [k.strip(" .'\"") for k in result.text.split(",")]
        grounded = [k for k in from_llm if 1 < len(k) <= 60
                    and _grounded(k, q.question + " " + q.evidence)]
        keywords = _unique(grounded + heuristic_keywords(q.question, q.evidence))
        ctx.state["keywords"] = keywords
        ctx.summary = ", ".join(keywords)
        return keywords

    async def _retrieve_values(self, ctx: StageContext) -> list[Any]:
        import asyncio

        from agentflow.retrieval import ValueIndex

        index = await asyncio.to_thread(ValueIndex.for_database, ctx.env.db)
        matches = await asyncio.to_thread(index.lookup, ctx.input("extract_keywords"),
                                          self.max_values)
        ctx.state["values"] = matches
        ctx.summary = "; ".join(f"{m.table}.{m.column}={m.value!r}" for m in matches)
        return matches

    async def _select_schema(self, ctx: StageContext) -> dict[str, list[str]]:
        import asyncio

        from agentflow.retrieval import link_schema

        q = ctx.query
        asked = prompts.with_history(q.question, ctx.env.history)
        selection = await asyncio.to_thread(link_schema, ctx.env.db, asked, q.evidence,
                                            value_matches=ctx.state.get("values", []))
        tables = selection.tables
        schema = ctx.env.db.schema_prompt(tables=tables, samples=self.samples)
        prefix = sql_context(ctx.env, schema, q.question, self.n_shots)
        ctx.state["sql_context"] = prefix
        ctx.state["_context_tokens"] = len(prefix) // 4
        set_schema_grammar(ctx.env, ctx.state, tables)
        ctx.summary = ", ".join(f"{t}({len(c) if c else 'all'})" for t, c in tables.items())
        return tables

    def _generator(self, i: int):
        style, temperature = _VARIANTS[i % len(_VARIANTS)]

        async def generate(ctx: StageContext) -> str:
            q = ctx.query
            values = [f"{m.table}.{m.column} = {m.value!r}" for m in ctx.state.get("values", [])]
            prompt = prompts.generate_sql(ctx.state["sql_context"], q.question, q.evidence,
                                          values=values, style=style)
            params = sql_params(ctx.env, ctx.state, temperature=temperature, seed=i)
            result = await ctx.llm(prompt, params, answer_prefix="SELECT")
            sql = written_sql(ctx, result)
            ctx.summary = sql
            return sql
        return generate

    def _executor(self, i: int):
        async def execute(ctx: StageContext) -> Execution:
            run = await execute_sql(ctx.env, ctx.input(f"generate_candidate.{i}"))
            record_attempt(ctx, i, run)
            add_revision_round(ctx, candidate=i, round_=0, max_rounds=self.max_revisions,
                               execution=run, sql_context_key="sql_context", downstream="select")
            return run
        return execute

    async def _select(self, ctx: StageContext) -> Any:
        """Cluster executable candidates by result; unit tests only when clusters disagree."""
        candidates: dict[int, Execution] = ctx.state.get("candidates", {})
        clusters: dict[tuple, list[int]] = {}
        for i in sorted(candidates):
            run = candidates[i]
            if run.ok:
                clusters.setdefault(result_key(run.rows), []).append(i)
        ranked = rank_clusters(ctx.state, list(clusters.values()))
        ctx.state["clusters"] = ranked
        if not ranked:
            ctx.state["final"] = _last_attempt(candidates)
            ctx.summary = "no candidate executes"
            return None
        taught = ctx.state.get("taught") or {}
        taught_first = bool(taught.get("ok")) and taught.get("candidate") in ranked[0]
        if len(ranked) == 1 or self.n_tests <= 0 or taught_first:
            # A taught SQL that ran is the user's own answer to this question: the model's
            # unit tests (a weaker judge) do not overrule it.
            ctx.state["final"] = candidates[ranked[0][0]]
            ctx.state["chosen_cluster"] = 0
            how = "; the taught SQL's result" if taught_first else ""
            ctx.summary = f"{len(ranked)} result clusters; chose candidate {ranked[0][0]}{how}"
            return ranked[0][0]
        self._add_unit_tests(ctx, ranked)
        ctx.summary = f"{len(ranked)} result clusters disagree; writing unit tests"
        return None

    def _add_unit_tests(self, ctx: StageContext, ranked: list[list[int]]) -> None:
        """Tests first; one evaluation per cluster only once real tests exist. When the model
        writes none, the tests are reported missing and the largest cluster is chosen
        unchecked (never a made-up test that every candidate "passes")."""
        def evaluator(rank: int, members: list[int]):
            async def evaluate(c: StageContext) -> bool:
                run = c.state["candidates"][members[0]]
                q = c.query
                prompt = prompts.evaluate_candidate(c.state["sql_context"], q.question,
                                                    q.evidence, c.input("generate_unit_tests"),
                                                    run.sql, result_preview(run))
                result = await c.llm(prompt, _VERDICT_PARAMS)
                passed = result.text.strip().lower().startswith("yes")
                c.state.setdefault("verdicts", {})[rank] = passed
                c.summary = f"candidates {members}: {'pass' if passed else 'fail'}"
                return passed
            return evaluate

        async def write_tests(c: StageContext) -> list[str]:
            q = c.query
            result = await c.llm(prompts.generate_unit_tests(c.state["sql_context"], q.question,
                                                             q.evidence, self.n_tests),
                                 self._tests_params())
            checks = _parse_checks(result.text, self.n_tests)
            c.state["unit_tests"] = checks
            if not checks:
                c.summary = "no usable unit test written: the clusters go unchecked"
                return checks
            c.summary = " | ".join(checks)
            nodes, edges = [], []
            for rank, members in enumerate(ranked):
                nodes.append(llm_node(f"evaluate.{rank}", "evaluate", evaluator(rank, members),
                                      prompt_tokens=800, output_tokens=2,
                                      max_tokens=_VERDICT_PARAMS.max_tokens))
                edges += [("generate_unit_tests", f"evaluate.{rank}"),
                          (f"evaluate.{rank}", "choose")]
            c.expand(nodes, edges)
            return checks

        async def choose(c: StageContext) -> int:
            verdicts: dict[int, bool] = c.state.get("verdicts", {})
            # Passing clusters first; among them (or if none pass, or untested) the larger,
            # then earlier.
            best = min(range(len(ranked)), key=lambda r: (not verdicts.get(r, False), r))
            c.state["final"] = c.state["candidates"][ranked[best][0]]
            c.state["chosen_cluster"] = best
            how = "by unit tests" if verdicts else "untested: largest cluster"
            c.summary = f"chose candidate {ranked[best][0]} (cluster {best}, {how})"
            return ranked[best][0]

        ctx.expand([llm_node("generate_unit_tests", "generate_unit_test", write_tests,
                             prompt_tokens=700, output_tokens=30 * self.n_tests,
                             max_tokens=self._tests_params().max_tokens),
                    tool_node("choose", "choose", choose)],
                   [("select", "generate_unit_tests"), ("generate_unit_tests", "choose")])

    def _tests_params(self) -> SamplingParams:
        return SamplingParams(max_tokens=30 * self.n_tests, temperature=0.0,
                              stop=("\n\n", "SELECT"))

    # ------------------------------------------------------------------------------ answer
    def output(self, state: dict[str, Any]) -> PipelineOutput:
        final: Execution | None = state.get("final")
        details = {"attempts": state.get("attempts", []),
                   "clusters": state.get("clusters", []),
                   "keywords": state.get("keywords", []),
                   "unit_tests": state.get("unit_tests", []),
                   "taught": state.get("taught")}
        confidence = confidence_of(state, n_candidates=len(state.get("candidates", {}))
                                   or self.n_candidates)
        if final is None or not final.sql:
            return PipelineOutput(sql=None, error="no candidate produced SQL", details=details,
                                  confidence=confidence)
        if not final.ok:
            return PipelineOutput(
                sql=final.sql, details=details, confidence=confidence,
                error=f"no candidate SQL executes after {self.max_revisions} revision rounds "
                      f"(last error: {final.error})")
        return PipelineOutput(sql=final.sql, details=details, confidence=confidence)


def _last_attempt(candidates: dict[int, Execution]) -> Execution | None:
    with_sql = [candidates[i] for i in sorted(candidates) if candidates[i].sql]
    return with_sql[0] if with_sql else (candidates[min(candidates)] if candidates else None)


def _parse_checks(text: str, n: int) -> list[str]:
    lines = [line.strip().lstrip("-").strip() for line in ("Check 1:" + text).splitlines()]
    checks = []
    for line in lines:
        if ":" in line and line.lower().startswith("check"):
            line = line.split(":", 1)[1].strip()
        if line:
            checks.append(line)
    return checks[:n]


def _grounded(keyword: str, text: str) -> bool:
    """Keep a model keyword only if its words occur in the question or hint: small models
    copy words from the few-shot examples, and a hallucinated value misleads retrieval."""
    haystack = text.lower()
    return all(word[:5] in haystack for word in keyword.lower().split())


def _unique(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for item in items:
        key = item.lower()
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out
