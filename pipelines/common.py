"""Stage building blocks shared by the pipelines: executing candidates, revision rounds,
few-shot context, node construction with expected costs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentflow.confidence import Confidence, Signals, assess
from agentflow.llm.base import SamplingParams
from agentflow.sql import QueryResult, SqlError
from agentflow.workflow import Node, NodeKind, StageContext
from agentflow.workflow.pipeline import PipelineEnv
from pipelines import prompts
from pipelines.sqltext import extract_sql, preview

# Rough CPU costs of the embedded default, used only as the critical-path estimate until the
# scheduler's time model supplies per-instance estimates.
_PREFILL_S_PER_TOKEN = 0.002
_DECODE_S_PER_TOKEN = 0.03
TOOL_EXPECTED_S = 0.05


def expected_llm_s(prompt_tokens: int, output_tokens: int) -> float:
    return prompt_tokens * _PREFILL_S_PER_TOKEN + output_tokens * _DECODE_S_PER_TOKEN


def llm_node(node_id: str, stage: str, fn: Callable[[StageContext], Awaitable[Any]], *,
             prompt_tokens: int, output_tokens: int, max_tokens: int) -> Node:
    """An LLM stage with the pipeline's own size hints. ``max_tokens`` is the cap its call
    will use: the scheduler clips the stage's predicted output length to it before the call
    is ready (so its critical path and remaining cost never assume more)."""
    return Node(id=node_id, stage=stage, kind=NodeKind.LLM, run=fn,
                expected_s=expected_llm_s(prompt_tokens, output_tokens),
                hints={"prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                       "max_tokens": max_tokens})


def tool_node(node_id: str, stage: str, fn: Callable[[StageContext], Awaitable[Any]]) -> Node:
    return Node(id=node_id, stage=stage, kind=NodeKind.TOOL, run=fn, expected_s=TOOL_EXPECTED_S)


SQL_PARAMS = SamplingParams(max_tokens=160, temperature=0.0, stop=(";", "\n\n", "\n--"))


@dataclass
class Execution:
    """What running one SQL string gave: rows, or the reason it is unusable."""

    sql: str
    ok: bool
    columns: list[str] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None
    truncated_by: str | None = None  # a cap cut the rows short: "rows" or "bytes"

    @property
    def empty(self) -> bool:
        return self.ok and not self.rows

    def feedback(self) -> str:
        """What the revision prompt tells the model."""
        if not self.sql:
            return "no SQL query was written"
        if not self.ok:
            return self.error or "the query failed"
        if self.empty:
            return "the query ran but returned no rows"
        return "ok"

    def to_dict(self) -> dict[str, Any]:
        return {"sql": self.sql, "ok": self.ok, "rows": len(self.rows), "error": self.error}


async def execute_sql(env: PipelineEnv, sql: str) -> Execution:
    """Run candidate SQL off the event loop (a query may take seconds), in the tenant's share
    of the database threads (``env.run_db``), and never raise."""
    import asyncio

    if not sql:
        return Execution(sql=sql, ok=False, error="no SQL query was written",
                         error_kind="no_sql")
    run = env.run_db or asyncio.to_thread  # the tenant's share of the database threads
    result = await run(env.db.try_execute, sql, timeout_s=env.sql_timeout_s,
                       max_rows=env.max_rows)
    if isinstance(result, SqlError):
        return Execution(sql=sql, ok=False, error=result.message, error_kind=result.kind)
    assert isinstance(result, QueryResult)
    return Execution(sql=sql, ok=True, columns=result.columns, rows=result.rows,
                     truncated_by=result.truncated_by)


def needs_revision(execution: Execution, question: str = "", dialect: str = "sqlite") -> bool:
    """CHESS revises candidates that fail or return nothing; agentflow also asks again when a
    candidate answers a specific question with ``SELECT *`` (``agentflow.answer_shape``)."""
    return not execution.ok or execution.empty or star_retry(execution, question, dialect)


def star_retry(execution: Execution, question: str, dialect: str = "sqlite") -> bool:
    """Whether ``execution`` ran but is a degenerate ``SELECT *`` answer to ``question``."""
    from agentflow.answer_shape import degenerate

    return bool(execution.ok and question and degenerate(question, execution.sql, dialect))


# The retry of a SELECT * candidate samples differently (a greedy retry of the same prompt
# tends to repeat it) and, when constrained, with a grammar that has no ``*`` column.
STAR_RETRY_TEMPERATURE = 0.7
STAR_FEEDBACK = ("the query returns every column (SELECT *), but the question asks for "
                 "specific ones: select only the columns the question asks for")


def shots(env: PipelineEnv, question: str, k: int) -> list[prompts.Shot]:
    """Few-shot examples retrieved from the run-time pool (never the evaluated split)."""
    if env.fewshot is None or k <= 0:
        return []
    found = env.fewshot.query(question, k=k, db=env.db)
    return [prompts.Shot(f.example.question, f.example.gold_sql) for f in found]


def sql_context(env: PipelineEnv, schema_text: str, question: str, k: int) -> str:
    """The shared prefix of a query's SQL-writing calls: the schema, ``k`` examples retrieved
    for the question read with the conversation's earlier turns, and those turns."""
    asked = prompts.with_history(question, env.history)
    schema_text = schema_text.rstrip() + ("\n" + env.glossary if env.glossary else "")
    return prompts.context(schema_text, env.db.dialect, shots(env, asked, k), env.history)


def sql_params(env: PipelineEnv, state: dict, **overrides) -> SamplingParams:
    """Sampling parameters for an SQL-writing call: the shared defaults, plus the schema
    grammar the pipeline stored in ``state["sql_grammar"]`` when constraining is on."""
    from dataclasses import replace

    params = replace(SQL_PARAMS, **overrides)
    grammar = state.get("sql_grammar") if env.constrain_sql else None
    return replace(params, grammar=grammar) if grammar else params


def set_schema_grammar(env: PipelineEnv, state: dict,
                       tables: Mapping[str, list[str] | None] | None) -> None:
    """Store the grammar of the tables/columns a prompt shows (None: every table)."""
    if not env.constrain_sql:
        return
    from agentflow.llm.grammars import schema_sql_grammar

    schema = env.db.schema()
    chosen = tables or {t.name: None for t in schema.tables}
    resolved: dict[str, list[str]] = {}
    for name, cols in chosen.items():
        table = schema.table(name)
        if table is None:
            continue
        keep = {c.lower() for c in cols} if cols else None
        resolved[table.name] = [c.name for c in table.columns
                                if keep is None or c.name.lower() in keep or c.primary_key
                                or any(c.name in fk.columns for fk in table.foreign_keys)]
    if resolved:
        state["sql_grammar"] = schema_sql_grammar(resolved, "SELECT")


def add_revision_round(ctx: StageContext, *, candidate: int, round_: int, max_rounds: int,
                       execution: Execution, sql_context_key: str, downstream: str,
                       exec_stage: str = "execute", revise_stage: str = "revise") -> bool:
    """If ``execution`` needs fixing and rounds remain, insert revise -> execute before
    ``downstream``. Returns whether a round was added."""
    question, dialect = ctx.query.question, ctx.env.db.dialect
    if not needs_revision(execution, question, dialect) or round_ >= max_rounds:
        return False
    star = star_retry(execution, question, dialect)
    tried = [a["sql"] for a in ctx.state.get("attempts", [])[:-1] if a["candidate"] == candidate]
    if round_ > 0 and execution.sql in tried:
        # The revision repeated an SQL already tried: another round would only repeat it.
        return False
    nxt = round_ + 1
    rev_id, exec_id = f"{revise_stage}.{candidate}.{nxt}", f"{exec_stage}.{candidate}.{nxt}"

    async def revise(c: StageContext) -> str:
        prefix = c.state[sql_context_key]
        feedback = STAR_FEEDBACK if star else execution.feedback()
        prompt = prompts.revise_sql(prefix, c.query.question, c.query.evidence, execution.sql or
                                    "(none)", feedback)
        params = sql_params(c.env, c.state)
        if star:
            params = star_retry_params(params, seed=100 * (candidate + 1) + nxt)
        result = await c.llm(prompt, params, answer_prefix="SELECT")
        sql = written_sql(c, result)
        c.summary = sql
        return sql

    async def execute_revised(c: StageContext) -> Execution:
        sql = c.input(rev_id)
        run = await execute_sql(c.env, sql)
        record_attempt(c, candidate, run)
        add_revision_round(c, candidate=candidate, round_=nxt, max_rounds=max_rounds,
                           execution=run, sql_context_key=sql_context_key,
                           downstream=downstream, exec_stage=exec_stage,
                           revise_stage=revise_stage)
        return run

    prompt_tokens = ctx.state.get("_context_tokens", 600) + 80
    ctx.expand(
        [llm_node(rev_id, revise_stage, revise, prompt_tokens=prompt_tokens, output_tokens=60,
                  max_tokens=SQL_PARAMS.max_tokens),
         tool_node(exec_id, exec_stage, execute_revised)],
        [(ctx.node.id, rev_id), (rev_id, exec_id), (exec_id, downstream)])
    return True


def star_retry_params(params: SamplingParams, *, seed: int) -> SamplingParams:
    """The retry's sampling: warmer, its own seed, and no ``*`` column when constrained."""
    from dataclasses import replace

    from agentflow.llm.grammars import without_star

    grammar = params.grammar
    if grammar:
        try:
            grammar = without_star(grammar)
        except ValueError:  # a grammar this module did not build: keep it
            pass
    return replace(params, temperature=max(params.temperature, STAR_RETRY_TEMPERATURE),
                   seed=seed, grammar=grammar)


# ------------------------------------------------------------------------- taught SQL
def taught_match(env: PipelineEnv, question: str) -> Any:
    """The taught pair that answers ``question`` (``paraphrase.Match``), or None: the same
    question, or one whose similarity reaches ``PARAPHRASE_THRESHOLD``. Only taught pairs
    count (``env.fewshot.match``), never dataset examples."""
    match = getattr(env.fewshot, "match", None)
    if match is None or env.history:  # a follow-up means something else than its words
        return None
    return match(question)


def taught_node(match: Any, index: int) -> Node:
    """A tool stage that runs the taught SQL as candidate ``index``: recorded like any other
    attempt, so the selector clusters it with the model's candidates."""
    async def run_taught(ctx: StageContext) -> Execution:
        run = await execute_sql(ctx.env, match.sql)
        record_attempt(ctx, index, run)
        ctx.state["taught"] = {"candidate": index, "question": match.question,
                               "similarity": match.similarity, "exact": match.exact,
                               "ok": run.ok and not run.empty}
        ctx.summary = (f"taught SQL of {match.question!r} (similarity {match.similarity:.2f}): "
                       + ctx.summary)
        return run
    return tool_node("taught_candidate", "taught_candidate", run_taught)


def rank_clusters(state: dict[str, Any], clusters: list[list[int]]) -> list[list[int]]:
    """Result clusters, best first: the one holding a taught SQL that ran (and returned rows),
    then by votes — members that are not degenerate ``SELECT *`` answers (identical trivial
    candidates agreeing is not evidence) — then by size, then earlier."""
    from agentflow.answer_shape import degenerate

    candidates: dict[int, Execution] = state.get("candidates", {})
    taught = state.get("taught") or {}
    question, dialect = state.get("question", ""), state.get("dialect", "sqlite")

    def key(members: list[int]) -> tuple:
        has_taught = taught.get("ok") and taught.get("candidate") in members
        votes = sum(1 for i in members if not degenerate(question, candidates[i].sql, dialect))
        return (not has_taught, -votes, -len(members), members[0])
    return sorted(clusters, key=key)


def written_sql(ctx: StageContext, result: Any) -> str:
    """The SQL in an LLM answer. One the model was still writing when it hit its token limit
    is remembered, so that its failure says it was cut (``record_attempt``), not only what
    the parser found where the text stops."""
    sql = extract_sql(result.text)
    if result.finish_reason == "length" and sql:
        ctx.state.setdefault("_cut_sql", {})[sql] = result.completion_tokens
    return sql


def cut_note(tokens: int) -> str:
    return (f"cut at the token limit ({tokens} tokens) before the query ended; "
            "write a shorter query")


def record_attempt(ctx: StageContext, candidate: int, execution: Execution) -> None:
    """Keep every candidate's latest attempt in the query state; the selector reads it (and
    the confidence assessment, which also needs the question and the row cap). A failed
    attempt whose SQL was cut at the token limit says so first (its error is also the
    revision's feedback)."""
    cut = ctx.state.get("_cut_sql", {}).get(execution.sql)
    if cut is not None and not execution.ok and not (execution.error or "").startswith("cut "):
        execution.error = f"{cut_note(cut)}: {execution.error}"
    ctx.state.setdefault("question", ctx.query.question)
    ctx.state.setdefault("dialect", ctx.env.db.dialect)
    ctx.state.setdefault("max_rows", ctx.env.max_rows)
    ctx.state.setdefault("candidates", {})[candidate] = execution
    ctx.state.setdefault("attempts", []).append({"candidate": candidate,
                                                 "node": ctx.node.id, **execution.to_dict()})
    ctx.summary = (f"{len(execution.rows)} rows" if execution.ok
                   else f"error: {execution.error}")


def result_preview(execution: Execution) -> str:
    if not execution.ok:
        return f"error: {execution.error}"
    return preview(execution.rows, execution.columns)


def confidence_of(state: dict[str, Any], *, n_candidates: int = 1,
                  final_candidate: int | None = None) -> Confidence:
    """Assess the final answer from what this query's state recorded: attempts, result
    clusters (when candidates were compared), unit tests and their verdicts."""
    final: Execution | None = state.get("final")
    clusters: list[list[int]] = state.get("clusters") or []
    chosen_rank: int | None = state.get("chosen_cluster")
    chosen = clusters[chosen_rank] if chosen_rank is not None and clusters else None
    if final_candidate is None:
        final_candidate = chosen[0] if chosen else 0
    own = [a for a in state.get("attempts", []) if a["candidate"] == final_candidate]
    repairs = sum(1 for a in own[:-1] if not a["ok"] or not a["rows"])
    tests = state.get("unit_tests")
    verdicts: dict[int, bool] = state.get("verdicts", {})
    rows = final.rows if final is not None and final.ok else []
    from agentflow.answer_shape import degenerate

    candidates: dict[int, Execution] = state.get("candidates", {})
    question, dialect = state.get("question", ""), state.get("dialect", "sqlite")
    votes = (sum(1 for i in chosen if i in candidates
                 and not degenerate(question, candidates[i].sql, dialect)) if chosen else None)
    taught = state.get("taught") or {}
    from_taught = taught.get("ok") and (taught.get("candidate") in chosen if chosen
                                        else taught.get("candidate") == final_candidate)
    return assess(Signals(
        question=state.get("question", ""), sql=final.sql if final else None,
        executed=bool(final is not None and final.ok), rows=rows,
        columns=final.columns if final is not None else [],
        n_candidates=n_candidates, chosen_cluster=len(chosen) if chosen else None,
        n_clusters=len(clusters) or None, repairs=repairs,
        unit_tests=tests,
        tests_passed=verdicts.get(chosen_rank) if verdicts and chosen_rank is not None
        else None,
        other_clusters_passed=sum(1 for r, ok in verdicts.items() if ok and r != chosen_rank),
        truncated=len(rows) >= state.get("max_rows", 1 << 62),
        dialect=dialect, votes=votes,
        taught_similarity=float(taught["similarity"]) if from_taught else None))
