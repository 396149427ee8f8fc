"""``agentflow teach`` and ``agentflow glossary``: teach question/SQL pairs and terms.

    agentflow teach --db bookshop "How many stores are there?" "SELECT count(*) FROM stores"
    agentflow teach --db bookshop --list
    agentflow teach --db bookshop --delete 7
    agentflow glossary --db bookshop "active customer" "placed an order in the last 90 days"
    agentflow glossary --db bookshop --list | --delete "active customer"

No model loads: teaching needs only the database (the SQL must run on it first) and the
store the running servers and CLIs share (``agentflow.teaching``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from agentflow.cli import apply_database_options


class _Teacher:
    """The Python API's teaching methods over a catalog alone (no backends, no model)."""

    def __init__(self, config: Any):
        from agentflow.catalog import DatabaseCatalog

        self.config = config
        self.catalog = DatabaseCatalog.from_config(config)


def _teacher_class():
    from agentflow.teaching import TeachingMixin

    return type("Teacher", (TeachingMixin, _Teacher), {})


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", required=True, help="database id, or a path to a .sqlite/.duckdb")
    p.add_argument("--data", action="append", default=[],
                   help="a Spider/BIRD folder whose databases to use (repeatable)")
    p.add_argument("--engine", choices=["sqlite", "duckdb"], default=None,
                   help="check the SQL on SQLite (default) or the DuckDB copies")
    p.add_argument("--config", default=None, help="YAML/JSON config (its teaching_store)")
    p.add_argument("--tenant", default=None,
                   help="teach for one tenant only (default: shared by everyone)")
    p.add_argument("--list", action="store_true", help="list what is taught for the database")
    p.add_argument("--json", action="store_true", help="print JSON")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("teach", help="teach a question/SQL pair for a database",
                       description="Store a question and the SQL that answers it; the "
                                   "pipelines get the most similar pairs as examples. The SQL "
                                   "must be one read-only query that runs on the database.")
    p.add_argument("question", nargs="?", help="the question (quote it)")
    p.add_argument("sql", nargs="?", help="the SQL that answers it (quote it)")
    _common(p)
    p.add_argument("--delete", type=int, default=None, metavar="ID",
                   help="delete the taught pair with this id")
    p.set_defaults(func=cmd_teach)

    g = sub.add_parser("glossary", help="teach what a term means in a database",
                       description="Store a term and its meaning in SQL terms; questions "
                                   "that use the term get it next to the schema.")
    g.add_argument("term", nargs="?", help="the term, e.g. 'active customer'")
    g.add_argument("meaning", nargs="?", help="what it means, in SQL terms")
    _common(g)
    g.add_argument("--delete", default=None, metavar="TERM", help="delete this term (or id)")
    g.set_defaults(func=cmd_glossary)


def _setup(args: argparse.Namespace):
    from agentflow.config import AgentFlowConfig

    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    apply_database_options(config, args)
    return _teacher_class()(config)


def _emit(args: argparse.Namespace, items: list[dict[str, Any]], lines: list[str]) -> None:
    if args.json:
        print(json.dumps(items, indent=2, default=str))
    else:
        print("\n".join(lines) if lines else "(nothing taught)")


def cmd_teach(args: argparse.Namespace) -> int:
    teacher = _setup(args)
    try:
        if args.list:
            found = teacher.examples(args.db, tenant=args.tenant)
            _emit(args, [e.to_dict() for e in found],
                  [f"{e.id:>4}  {e.question}\n      {e.sql}" for e in found])
            return 0
        if args.delete is not None:
            if not teacher.forget_example(args.db, args.delete, tenant=args.tenant):
                print(f"agentflow: error: no taught pair {args.delete} on {args.db}"
                      + (f" for tenant {args.tenant}" if args.tenant else ""), file=sys.stderr)
                return 2
            print(f"deleted taught pair {args.delete}")
            return 0
        if not args.question or not args.sql:
            print("agentflow: error: give a QUESTION and its SQL (or --list / --delete ID)",
                  file=sys.stderr)
            return 2
        taught = teacher.teach(args.question, args.sql, db=args.db, tenant=args.tenant)
        _emit(args, [taught.to_dict()], [f"taught pair {taught.id} on {taught.db}: "
                                         f"{taught.question}"])
        return 0
    finally:
        teacher.catalog.close()


def cmd_glossary(args: argparse.Namespace) -> int:
    teacher = _setup(args)
    try:
        if args.list:
            found = teacher.glossary(args.db, tenant=args.tenant)
            _emit(args, [e.to_dict() for e in found],
                  [f"{e.id:>4}  {e.term}: {e.meaning}" for e in found])
            return 0
        if args.delete is not None:
            if not teacher.forget_term(args.db, args.delete, tenant=args.tenant):
                print(f"agentflow: error: no term {args.delete!r} on {args.db}",
                      file=sys.stderr)
                return 2
            print(f"deleted term {args.delete!r}")
            return 0
        if not args.term or not args.meaning:
            print("agentflow: error: give a TERM and its MEANING (or --list / --delete TERM)",
                  file=sys.stderr)
            return 2
        entry = teacher.define(args.term, args.meaning, db=args.db, tenant=args.tenant)
        _emit(args, [entry.to_dict()], [f"taught term {entry.term!r} on {entry.db}"])
        return 0
    finally:
        teacher.catalog.close()
