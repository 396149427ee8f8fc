"""``agentflow datasets``: build the demo database, convert to DuckDB, self-check a benchmark."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from agentflow.accuracy import MatchRule
from agentflow.cli import table_console
from agentflow.datasets import load_dataset
from agentflow.datasets.check import CheckRecord, check_dataset

_MAX_FAILURES_SHOWN = 50


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("datasets", help="benchmarks: check, convert to DuckDB, build demo")
    dsub = parser.add_subparsers(dest="datasets_command", metavar="ACTION")
    dsub.required = True

    check = dsub.add_parser(
        "check", help="run every gold query against itself through the evaluator",
        description="Load a Spider- or BIRD-layout folder (or 'demo') and judge each gold query "
                    "against itself. Prints a per-database table and 'N passed, M failed'.")
    check.add_argument("dir", help="dataset folder (Spider or BIRD layout) or 'demo'")
    check.add_argument("--split", default="dev", help="split to load (default: dev)")
    check.add_argument("--engine", choices=["sqlite", "duckdb", "postgres"], default="sqlite",
                       help="run the gold queries on SQLite (default), the DuckDB copies or "
                            "the PostgreSQL copy made by to-postgres")
    check.add_argument("--pg-url", default=None,
                       help="postgres engine: the database to-postgres loaded the benchmark "
                            "into (default: $AGENTFLOW_PG_URL); a password is better given by "
                            "PGPASSWORD or ~/.pgpass than in the URL")
    check.add_argument("--rule", choices=[r.value for r in MatchRule], default="spider",
                       help="execution-accuracy rule (default: spider test-suite)")
    check.add_argument("--duckdb-dir", type=Path, default=None,
                       help="where the DuckDB copies are (made on demand when missing)")
    check.add_argument("--timeout", type=float, default=30.0, help="seconds per query")
    check.add_argument("--limit", type=int, default=None, help="check only the first N questions")
    check.add_argument("--jsonl", type=Path, default=None, help="write per-question records here")
    check.add_argument("--keep-distinct", action="store_true",
                       help="keep DISTINCT (the official Spider evaluator's --keep_distinct); "
                            "by default it is stripped, as that evaluator does")
    check.set_defaults(func=cmd_check)

    conv = dsub.add_parser(
        "to-duckdb", help="copy SQLite benchmark databases into DuckDB files",
        description="Convert one .sqlite file, or every database of a dataset folder.")
    conv.add_argument("src", help="a .sqlite file or a dataset folder")
    conv.add_argument("--out", type=Path, default=None,
                      help="output file (for one database) or folder (for a dataset); default: "
                           "beside the file, or agentflow's cache for a dataset")
    conv.add_argument("--split", default="dev",
                      help="for a dataset folder: the split whose databases to convert "
                           "(default: dev)")
    conv.set_defaults(func=cmd_to_duckdb)

    topg = dsub.add_parser(
        "to-postgres", help="load a benchmark's databases into PostgreSQL (one schema each)",
        description="Copy every database of a Spider/BIRD folder (or 'demo') into one "
                    "PostgreSQL database, one schema per database id, so datasets check "
                    "--engine postgres and evaluation can run there.")
    topg.add_argument("src", help="dataset folder (Spider or BIRD layout) or 'demo'")
    topg.add_argument("--url", default=None,
                      help="PostgreSQL database to load into, as a role that may create schemas "
                           "(default: $AGENTFLOW_PG_URL)")
    topg.add_argument("--split", default="dev",
                      help="the split whose databases to load (default: dev)")
    topg.add_argument("--all", action="store_true",
                      help="every database of the folder, not only those the split uses")
    topg.add_argument("--grant", default=None, metavar="ROLE",
                      help="grant USAGE/SELECT on the loaded schemas to this read-only role")
    topg.set_defaults(func=cmd_to_postgres)

    demo = dsub.add_parser("build-demo", help="build the demo database (SQLite and DuckDB)")
    demo.add_argument("--out", type=Path, default=None,
                      help="folder to build it in (default: agentflow's cache)")
    demo.add_argument("--seed", type=int, default=7,
                      help="seed of the generated rows (default 7: the documented database)")
    demo.add_argument("--force", action="store_true", help="rebuild even if present")
    demo.set_defaults(func=cmd_build_demo)


def cmd_check(args: argparse.Namespace) -> int:
    console = table_console()
    dataset = load_dataset(args.dir, args.split)
    total = min(len(dataset), args.limit) if args.limit else len(dataset)
    console.print(f"[bold]{dataset.kind}[/] {dataset.root} split={args.split}: {total} questions, "
                  f"{len({e.db_id for e in dataset.examples[:total]})} databases, "
                  f"engine={args.engine}, rule={args.rule}")
    sink = args.jsonl.open("w") if args.jsonl else None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        overall = progress.add_task("all questions", total=total)
        current: dict[str, TaskID] = {}

        def on_database(db_id: str, n: int) -> None:
            if current:
                progress.remove_task(current.pop("task"))
            current["task"] = progress.add_task(f"  {db_id}", total=n)

        def on_example(record: CheckRecord) -> None:
            progress.advance(current["task"])
            progress.advance(overall)
            if sink:
                sink.write(json.dumps(record.to_dict(), default=str) + "\n")

        try:
            report = check_dataset(dataset, engine=args.engine, rule=MatchRule(args.rule),
                                   timeout_s=args.timeout, limit=args.limit,
                                   duckdb_dir=args.duckdb_dir, pg_url=args.pg_url,
                                   on_database=on_database,
                                   on_example=on_example, keep_distinct=args.keep_distinct)
        finally:
            if sink:
                sink.close()

    against = "itself" if args.engine == "sqlite" else "its SQLite result"
    distinct = "DISTINCT kept" if args.keep_distinct else "DISTINCT stripped (official default)"
    table = Table(title=f"gold on {args.engine} vs {against}; {distinct}")
    table.add_column("database")
    table.add_column("questions", justify="right")
    table.add_column("passed", justify="right")
    table.add_column("failed", justify="right")
    for db_id, counts in report.by_database().items():
        failed = counts["failed"]
        table.add_row(db_id, str(counts["passed"] + failed), str(counts["passed"]),
                      f"[red]{failed}[/]" if failed else "0")
    console.print(table)
    failures = report.failures()
    if failures:
        console.print(f"[bold red]{len(failures)} failures[/] (reason: detail):")
        for record in failures[:_MAX_FAILURES_SHOWN]:
            v = record.verdict
            console.print(f"  {record.example.id} [{record.example.db_id}] {v.reason}: {v.detail}"
                          + (f"\n      dialect difference: {record.difference}"
                             if args.engine != "sqlite" else ""),
                          markup=False, highlight=False, soft_wrap=True)
        if len(failures) > _MAX_FAILURES_SHOWN:
            console.print(f"  ... and {len(failures) - _MAX_FAILURES_SHOWN} more"
                          + (f" (all in {args.jsonl})" if args.jsonl else " (use --jsonl)"))
    if failures and args.engine != "sqlite":
        console.print("failures by dialect difference:")
        for name, n in report.differences().most_common():
            console.print(f"  {n:4d}  {name}", markup=False, highlight=False)
    print(f"{report.passed} passed, {report.failed} failed")
    return 0 if report.failed == 0 else 1


def cmd_to_duckdb(args: argparse.Namespace) -> int:
    from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb

    console = Console()
    src = Path(args.src)
    if src.is_file():
        out = args.out or src.with_suffix(".duckdb")
        report = convert_sqlite_to_duckdb(src, out)
        console.print(f"{src} -> {out}: {len(report.tables)} tables, {report.rows} rows")
        for note in report.notes + [f"{t.name}: {n}" for t in report.tables for n in t.notes]:
            console.print(f"  note: {note}", markup=False)
        return 0
    dataset = load_dataset(src, args.split)
    notes = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("converting", total=len(dataset.databases))
        for db_id, entry in dataset.databases.items():
            progress.update(task, description=f"converting {db_id}")
            out = dataset.duckdb_path(db_id, args.out)
            report = convert_sqlite_to_duckdb(entry.sqlite_path, out)
            for note in report.notes + [f"{t.name}: {n}" for t in report.tables for n in t.notes]:
                notes += 1
                progress.console.print(f"  {db_id}: {note}", markup=False)
            progress.advance(task)
    target = args.out or dataset.duckdb_path(next(iter(dataset.databases)), None).parents[1]
    console.print(f"converted {len(dataset.databases)} databases into {target} "
                  f"({notes} notes on dropped keys or mixed-type columns)")
    return 0


def cmd_build_demo(args: argparse.Namespace) -> int:
    from agentflow.datasets.demo import build_demo

    paths = build_demo(args.out, seed=args.seed, force=args.force)
    print(f"demo database: {paths.sqlite}\n               {paths.duckdb}\n"
          f"questions:     {paths.questions}")
    return 0


def cmd_to_postgres(args: argparse.Namespace) -> int:
    import os

    import psycopg
    from sqlalchemy.engine import make_url

    from agentflow.datasets.to_postgres import load_sqlite_into_postgres
    from agentflow.datasets.types import PG_URL_ENV
    from agentflow.sql.database import redact

    console = Console()
    url_text = args.url or os.environ.get(PG_URL_ENV)
    if not url_text:
        console.print(f"agentflow: error: pass --url or set ${PG_URL_ENV}", markup=False)
        return 2
    url = make_url(url_text)
    secrets = [str(url.password)] if url.password else []
    dataset = load_dataset(args.src, args.split)
    wanted = set(dataset.databases) if args.all else {e.db_id for e in dataset.examples}
    try:
        conn = psycopg.connect(url.set(drivername="postgresql").render_as_string(
            hide_password=False))
    except psycopg.Error as err:
        console.print(f"agentflow: error: cannot connect: {redact(str(err), secrets)}",
                      markup=False)
        return 2
    total_rows = notes = 0
    with conn, Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task("loading", total=len(wanted))
        for db_id, entry in dataset.databases.items():
            if db_id not in wanted:
                continue
            progress.update(task, description=f"loading {db_id}")
            report = load_sqlite_into_postgres(entry.sqlite_path, conn, db_id,
                                               grant_to=args.grant)
            total_rows += report.rows
            for note in report.notes:
                notes += 1
                progress.console.print(f"  {db_id}: {note}", markup=False)
            progress.advance(task)
    console.print(f"loaded {len(wanted)} databases ({total_rows} rows) into PostgreSQL database "
                  f"{url.database!r}, one schema each ({notes} notes on dropped keys, views or "
                  "mixed-type columns)", markup=False)
    return 0
