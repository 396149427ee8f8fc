"""``agentflow ask``: one question, answered by a real pipeline, printed for a person or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import nullcontext
from typing import Any

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from agentflow.cli import table_console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer one question about a database",
                       description="Run a Text-to-SQL pipeline on one question. Without "
                                   "--config it uses the embedded default (local CPU model).")
    p.add_argument("question")
    p.add_argument("--db", required=True, help="database id (e.g. bookshop, concert_singer), "
                                               "a path to a .sqlite/.duckdb file, or a "
                                               "postgresql://user@host/db URL (password from "
                                               "PGPASSWORD or ~/.pgpass)")
    p.add_argument("--data", action="append", default=[],
                   help="a Spider/BIRD folder whose databases to use (repeatable)")
    p.add_argument("--pipeline", default=None, help="chess (default), macsql or single")
    p.add_argument("--config", default=None, help="YAML/JSON config (instances, pipeline, ...)")
    p.add_argument("--slo", type=float, default=None, help="end-to-end target in seconds")
    p.add_argument("--evidence", default="", help="BIRD-style hint for the question")
    p.add_argument("--engine", choices=["sqlite", "duckdb"], default=None)
    p.add_argument("--record", default=None, help="append this query's trace to a JSONL file")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(func=cmd_ask)


def cmd_ask(args: argparse.Namespace) -> int:
    from agentflow.api import InvalidRequest, connect
    from agentflow.config import AgentFlowConfig

    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    config.data = [*config.data, *args.data]
    if args.engine:
        config.engine = args.engine
    console = Console(stderr=True)
    try:
        with console.status("loading model and database...", spinner="dots") if not args.json \
                else nullcontext():
            af = connect(config)
    except (FileNotFoundError, ValueError, LookupError) as err:
        print(f"agentflow: error: {err}", file=sys.stderr)
        return 2
    try:
        with console.status(f"answering with {args.pipeline or config.pipeline}...") \
                if not args.json else nullcontext():
            answer = af.ask(args.question, db=args.db, slo=args.slo, pipeline=args.pipeline,
                            evidence=args.evidence, record=args.record)
    except (InvalidRequest, LookupError) as err:
        message = err.args[0] if err.args else str(err)
        print(f"agentflow: error: {message}", file=sys.stderr)
        return 2
    finally:
        af.close()
    if args.json:
        d = answer.to_dict()
        print(json.dumps({"sql": d["sql"], "columns": d["columns"], "rows": d["rows"],
                          "status": d["status"], "error": d["error"], "stages": d["stages"],
                          "usage": d["usage"], "latency_s": d["latency_s"],
                          "query_id": d["query_id"], "db": d["db"], "pipeline": d["pipeline"]},
                         default=str, indent=2))
    else:
        print_answer(table_console(), answer)
    return 0 if answer.status == "done" else 1


def print_answer(console: Console, answer: Any) -> None:
    console.print(f"[bold]{answer.question}[/]  ({answer.db}, pipeline {answer.pipeline})")
    if answer.sql:
        console.print(Syntax(answer.sql, "sql", word_wrap=True))
    if answer.error:
        console.print(f"[red]{answer.status}: {answer.error}[/]")
    if answer.columns:
        table = Table(*answer.columns, title=f"{len(answer.rows)} rows"
                      + (" (truncated)" if answer.truncated else ""))
        for row in answer.rows[:20]:
            table.add_row(*["NULL" if v is None else str(v) for v in row])
        console.print(table)
        if len(answer.rows) > 20:
            console.print(f"... {len(answer.rows) - 20} more rows")
    console.print(timeline_table(answer))
    slo = f" / SLO {answer.slo_s:g}s" if answer.slo_s else ""
    console.print(f"latency {answer.latency_s:.2f}s{slo}; {answer.usage.get('calls', 0)} LLM "
                  f"calls, {answer.usage.get('prompt_tokens', 0)} prompt + "
                  f"{answer.usage.get('completion_tokens', 0)} output tokens")


def timeline_table(answer: Any) -> Table:
    table = Table(title="stage timeline (seconds since arrival)")
    for col in ("stage", "kind", "start", "end", "instance", "queue", "run", "tokens in/out",
                "result"):
        table.add_column(col, overflow="fold")
    for s in answer.stages:
        calls = s["llm_calls"]
        instance = ", ".join(sorted({c["instance"] for c in calls}))
        queue = sum(c["queue_s"] for c in calls)
        run = sum(c["run_s"] for c in calls)
        tokens = (f"{sum(c['prompt_tokens'] for c in calls)}/"
                  f"{sum(c['completion_tokens'] for c in calls)}") if calls else ""
        table.add_row(s["node_id"], s["kind"], _t(s["start"]), _t(s["end"]), instance,
                      f"{queue:.2f}" if calls else "", f"{run:.2f}" if calls else "", tokens,
                      (s["error"] or s["summary"] or "")[:80])
    return table


def _t(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
