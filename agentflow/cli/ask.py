"""``agentflow ask``: one question, answered by a real pipeline, printed for a person or as JSON."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import TimeoutError as FuturesTimeout
from contextlib import nullcontext
from typing import Any

from rich import box
from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table

from agentflow.cli import apply_database_options, table_console


def positive_seconds(text: str) -> float:
    """argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def fraction(text: str) -> float:
    """argparse type: a number between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def add_verbose(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", "-v", action="store_true",
                   help="show llama.cpp's own log lines (hidden by default)")


def register(sub: argparse._SubParsersAction) -> None:
    from pipelines import pipeline_names

    p = sub.add_parser("ask", help="answer one question about a database",
                       description="Run a Text-to-SQL pipeline on one question. Without "
                                   "--config it uses the embedded default (local CPU model).")
    p.add_argument("question", help="the question, in plain language (quote it)")
    p.add_argument("--db", default=None, help="database id (e.g. bookshop, concert_singer), "
                                              "a path to a .sqlite/.duckdb file, or a "
                                              "postgresql://user@host/db URL (password from "
                                              "PGPASSWORD or ~/.pgpass); optional when only "
                                              "one database is known or with --conversation")
    p.add_argument("--conversation", default=None, metavar="ID",
                   help="follow up on an earlier answer: its conversation_id (printed after "
                        "each answer and in --json)")
    p.add_argument("--data", action="append", default=[],
                   help="a Spider/BIRD folder whose databases to use (repeatable)")
    p.add_argument("--pipeline", default=None, choices=pipeline_names(),
                   help="the pipeline (default: the config's, chess)")
    p.add_argument("--config", default=None, help="YAML/JSON config (instances, pipeline, ...)")
    p.add_argument("--slo", "--slo-seconds", dest="slo", type=positive_seconds, default=None,
                   help="end-to-end target in seconds")
    p.add_argument("--evidence", default="", help="BIRD-style hint for the question")
    p.add_argument("--engine", choices=["sqlite", "duckdb"], default=None,
                   help="open databases with SQLite (default) or their DuckDB copies")
    p.add_argument("--record", default=None, help="append this query's trace to a JSONL file")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.add_argument("--min-confidence", type=fraction, default=None, metavar="SCORE",
                   help="below this confidence (0-1) the answer is 'unsure' (best guess "
                        "attached, exit status 1) instead of done")
    add_verbose(p)
    p.set_defaults(func=cmd_ask)


def validate(args: argparse.Namespace, config: Any) -> None:
    """Everything that can be checked without a model, checked before one loads (seconds):
    the question, and that the database exists."""
    from agentflow.api import MAX_QUESTION_CHARS, InvalidRequest
    from agentflow.catalog import DatabaseCatalog

    if not args.question.strip():
        raise InvalidRequest("the question is empty; type a question about the database")
    if len(args.question) > MAX_QUESTION_CHARS:
        raise InvalidRequest(f"the question is too long ({len(args.question)} characters; at "
                             f"most {MAX_QUESTION_CHARS})")
    catalog = DatabaseCatalog.from_config(config)
    try:
        args.db = resolve_db(args, catalog)
        catalog.entry(args.db)
    finally:
        catalog.close()


def resolve_db(args: argparse.Namespace, catalog: Any) -> str:
    """``--db``, else the database of ``--conversation``, else the only database known."""
    from agentflow.api import InvalidRequest

    if args.conversation:
        from agentflow.cli.conversations import load

        db, _ = load(args.conversation)
        if args.db and catalog.entry(args.db).db_id != db:
            raise InvalidRequest(f"conversation {args.conversation} is about database "
                                 f"{db!r}, not {args.db!r}")
        return args.db or db
    if args.db:
        return args.db
    if len(catalog.ids) == 1:
        return catalog.ids[0]
    shown = ", ".join(catalog.ids[:5]) + (f" and {len(catalog.ids) - 5} more"
                                          if len(catalog.ids) > 5 else "")
    raise InvalidRequest(f"--db is required: {len(catalog.ids)} databases are known ({shown})")


def cmd_ask(args: argparse.Namespace) -> int:
    from agentflow.api import AgentflowError, connect
    from agentflow.config import AgentFlowConfig
    from agentflow.llm.llama_logging import quiet_llama

    quiet_llama(not args.verbose)
    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    apply_database_options(config, args)
    console = Console(stderr=True)
    try:
        validate(args, config)
        with console.status("loading model and database...", spinner="dots") if not args.json \
                else nullcontext():
            af = connect(config)
    except (FileNotFoundError, ValueError, LookupError, AgentflowError) as err:
        message = err.args[0] if isinstance(err, LookupError) and err.args else err
        print(f"agentflow: error: {message}", file=sys.stderr)
        return 2
    handle = None
    try:
        conversation = None
        if args.conversation:  # a follow-up on an earlier run's answer
            from agentflow.cli.conversations import load

            db, turns = load(args.conversation)
            af.conversations.restore(args.conversation, db, turns)
            conversation = args.conversation
        handle = af.submit(args.question, db=args.db, slo=args.slo, pipeline=args.pipeline,
                           evidence=args.evidence, record=args.record,
                           conversation=conversation,
                           min_confidence=args.min_confidence)
        if args.json:
            answer = handle.result()
        else:
            answer = wait_with_progress(console, handle)
    except (AgentflowError, LookupError) as err:
        message = err.args[0] if err.args else str(err)
        print(f"agentflow: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if handle is not None:
            af.cancel(handle.query_id)
        raise
    finally:
        if handle is not None and handle.done() and not handle.future.cancelled():
            _keep_conversation(af, handle.conversation_id)
        af.close()
    if args.json:
        d = answer.to_dict()
        print(json.dumps({"sql": d["sql"], "columns": d["columns"], "rows": d["rows"],
                          "status": d["status"], "error": d["error"], "stages": d["stages"],
                          "usage": d["usage"], "latency_s": d["latency_s"],
                          "query_id": d["query_id"], "db": d["db"], "pipeline": d["pipeline"],
                          "conversation_id": d["conversation_id"], "retries": d["retries"],
                          "confidence": d["confidence"]},
                         default=str, indent=2))
    else:
        print_answer(table_console(), answer)
    return 0 if answer.status == "done" else 1


def _keep_conversation(af: Any, conversation_id: str | None) -> None:
    """Save the conversation for a later ``--conversation`` (never fails the answer)."""
    if not conversation_id:
        return
    known = af.conversations.turns(conversation_id)
    if known is None:
        return
    from agentflow.cli.conversations import save

    try:
        save(conversation_id, known[0], known[1])
    except OSError as err:
        print(f"agentflow: warning: could not keep the conversation for follow-ups: {err}",
              file=sys.stderr)


def progress_text(pipeline: str, running: list[str], done: int, elapsed: float,
                  slo: float | None) -> str:
    """One status line: the stages running now, how many finished, time so far."""
    now = ", ".join(running[:3]) + (f" +{len(running) - 3}" if len(running) > 3 else "")
    slo_text = f" / SLO {slo:g}s" if slo else ""
    return (f"{pipeline}: {now or 'starting'} · {done} stage{'s' if done != 1 else ''} done · "
            f"{elapsed:.1f}s{slo_text}")


def wait_with_progress(console: Console, handle: Any) -> Any:
    """Wait for the answer while the spinner names the stage(s) running and the time."""
    running: dict[str, None] = {}
    finished = [0]

    def on_event(event: dict) -> None:
        node = str(event.get("node_id"))
        if event.get("type") == "stage_started":
            running[node] = None
        elif event.get("type") in ("stage_finished", "stage_failed"):
            running.pop(node, None)
            finished[0] += 1

    for event in handle.subscribe(on_event):
        on_event(event)
    start = time.monotonic()
    try:
        with console.status(progress_text(handle.pipeline, [], 0, 0.0, handle.slo_s)) as status:
            while True:
                try:
                    return handle.result(timeout=0.2)
                except FuturesTimeout:
                    status.update(progress_text(handle.pipeline, list(running), finished[0],
                                                time.monotonic() - start, handle.slo_s))
    finally:
        handle.unsubscribe(on_event)


def print_answer(console: Console, answer: Any) -> None:
    console.print(f"[bold]{answer.question}[/]  ({answer.db}, pipeline {answer.pipeline})")
    if answer.sql:
        console.print(Syntax(answer.sql, "sql", word_wrap=True))
    if answer.error:
        color = "yellow" if answer.status == "unsure" else "red"
        console.print(status_line(answer.status, answer.error), style=color, markup=False,
                      highlight=False)
    if answer.status != "unsure":  # an unsure line already gives the score and the reasons
        print_confidence(console, answer.confidence)
    if answer.columns:
        table = Table(*answer.columns, title=f"{len(answer.rows)} rows"
                      + (" (truncated)" if answer.truncated else ""))
        for row in answer.rows[:20]:
            table.add_row(*["NULL" if v is None else str(v) for v in row])
        console.print(table)
        if len(answer.rows) > 20:
            console.print(f"... {len(answer.rows) - 20} more rows")
    console.print(timeline_table(answer, console.width))
    from agentflow.timeline import retry_lines

    for line in retry_lines(answer.stages):  # the time a failed attempt took is in "queue"
        console.print(f"[yellow]retried[/] {line}", highlight=False)
    slo = f" / SLO {answer.slo_s:g}s" if answer.slo_s else ""
    console.print(f"latency {answer.latency_s:.2f}s{slo}; {answer.usage.get('calls', 0)} LLM "
                  f"calls, {answer.usage.get('prompt_tokens', 0)} prompt + "
                  f"{answer.usage.get('completion_tokens', 0)} output tokens")
    if answer.conversation_id and answer.status == "done":
        console.print(f"follow up: agentflow ask \"...\" --conversation {answer.conversation_id}",
                      highlight=False, style="dim")


# Error texts that already say their status ("not sure: confidence 0.27 ...", "cancelled by
# request"): printed alone, so a line never reads "unsure: not sure: ...".
_SAYS_STATUS = {"unsure": "not sure", "cancelled": "cancel"}


def status_line(status: str, error: str) -> str:
    """One line for an answer that is not plainly done: its status, then why, once."""
    said = _SAYS_STATUS.get(status)
    return error if said and error.lower().startswith(said) else f"{status}: {error}"


_LEVEL_STYLE = {"high": "green", "medium": "yellow", "low": "bold red"}


def print_confidence(console: Console, confidence: dict[str, Any] | None) -> None:
    """The level first (a low one as a warning), then each reason behind it."""
    if not confidence:
        return
    level = confidence["level"]
    warning = "  - check this answer before you use it" if level == "low" else ""
    console.print(f"[{_LEVEL_STYLE[level]}]confidence {level} ({confidence['score']:.2f})"
                  f"{warning}[/]")
    for reason in confidence.get("reasons", []):
        console.print(f"  · {reason}", markup=False, highlight=False)


def timeline_table(answer: Any, width: int = 160) -> Table:
    """Stage names and numbers never wrap (a folded "execute.1.1" reads as two stages); the
    free-text result column gets the width that is left and ends with an ellipsis."""
    rows = []
    for s in answer.stages:
        calls = s["llm_calls"]
        # instance@node for instances placed on a Ray cluster (agentflow.distributed)
        instance = ", ".join(sorted({c["instance"] + (f"@{c['node']}" if c.get("node") else "")
                                     for c in calls}))
        queue = sum(c["queue_s"] for c in calls)
        run = sum(c["run_s"] for c in calls)
        tokens = (f"{sum(c['prompt_tokens'] for c in calls)}/"
                  f"{sum(c['completion_tokens'] for c in calls)}") if calls else ""
        rows.append((s["node_id"], s["kind"], _t(s["start"]), _t(s["end"]), instance,
                     f"{queue:.2f}" if calls else "", f"{run:.2f}" if calls else "", tokens,
                     (s["error"] or s["summary"] or "")[:80]))
    table = Table(title="stage timeline (seconds since arrival)", box=box.SIMPLE_HEAD,
                  padding=(0, 1), collapse_padding=True)
    headers = ("stage", "kind", "start", "end", "instance", "queue", "run", "tokens")
    used = 2
    for i, col in enumerate(headers):
        col_width = max([len(col)] + [len(r[i]) for r in rows])
        table.add_column(col, no_wrap=True, min_width=col_width)
        used += col_width + 2
    room = min(80, width - used - 2)
    if room >= 8:  # else there is no room for it: one line per stage matters more
        table.add_column("result", no_wrap=True, overflow="ellipsis", max_width=room)
    for row in rows:
        table.add_row(*(row if room >= 8 else row[:-1]))
    return table


def _t(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"
