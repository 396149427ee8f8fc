"""Differential fuzz of the guard against each engine's own parser.

    agentflow bench guard_fuzz [--texts 100000] [--engines sqlite,duckdb,postgres] [--seed 1]

Texts are small read-only queries with quoting, comment and payload fragments spliced in at
random (backticks around ``--``, dollar quotes, ``[...]``, ``#``, newlines, ``version()``,
``pragma_database_list``, ``pg_roles``...). For each text the guard (sqlglot) approves, the
engine's own reading is compared with what the guard approved: every function it resolves
must be allowed and every table one the guard saw (catalog tables refused). DuckDB is read
with ``json_serialize_sql`` (its parser), PostgreSQL with pglast (PostgreSQL's parser, no
server needed), SQLite with a recording authorizer while it prepares ``EXPLAIN <text>``
(prepared, never run). Nothing is executed, so payloads cannot do harm.

Three counts per engine, side by side:

* ``as written``: the engine reading the *original* text (what ran before issue 35) names
  something the guard did not approve: the bypass class;
* ``regenerated``: the same for the text that runs now, before the engine check: the guard's
  tree written out again (DuckDB, PostgreSQL), the text as written (SQLite, where the
  authorizer is the engine check);
* ``run``: texts that would run now (the engine check passes) yet name something unapproved.
  Must be 0; exit status 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

BASES = (
    "SELECT a FROM t WHERE a > 1",
    "SELECT s, count(*) FROM t GROUP BY s",
    "SELECT upper(s) AS u FROM t ORDER BY a LIMIT 3",
    "WITH c AS (SELECT a FROM t) SELECT a FROM c",
    "SELECT a FROM t UNION SELECT a + 1 FROM t",
    "SELECT coalesce(s, 'x') FROM t WHERE s LIKE 'a%'",
)

# Quoting and comment syntax that engines read differently.
TRICKS = (
    "`--`", "`/*`", "`*/`", '"--"', "'--'", "[--]", "$$--$$", "$a$ -- $a$", "E'\\'--'",
    "'\\'", "#", "--", "/*", "*/", "/* /* */", "\n", "`", '"', "'", "$$", "[", "]", "\\",
    ";", ",", "(", ")", "AS", "x", "`a``b`", "U&'\\0041'", "N'x'", "X'41'", "0x41", "1e",
    ".5", "::text", "->", "->>", "||", "@", "?", ":name", "$1", "\r", "\t", "--\n", "//",
    "{", "}", "{fn", "%", "x'", "e'", "b'", "r'", "@@", "$x",
)

# What a bypass would reach: functions and tables the guard refuses.
PAYLOADS = (
    "version()", "current_setting('work_mem')", "sqlite_version()", "pg_sleep(0)",
    "duckdb_settings()", "(SELECT 1 FROM pragma_database_list)", "(SELECT 1 FROM pg_roles)",
    "(SELECT 1 FROM duckdb_databases())", "(SELECT 1 FROM information_schema.tables)",
    "load_extension('x')", "randomblob(10)", "getvariable('x')", "pg_backend_pid()",
    "current_user", "'x'::regclass", "(SELECT 1 FROM u)", "txid_current()",
    "current_database()", "pragma_table_info('t')", "(SELECT 1 FROM pragma_table_info('t'))",
)

DIALECTS = {"sqlite": "sqlite", "duckdb": "duckdb", "postgres": "postgres"}


def make_text(rng: random.Random) -> str:
    words = rng.choice(BASES).split(" ")
    for _ in range(rng.choice((1, 1, 2, 3))):
        fragment = rng.choice(TRICKS) if rng.random() < 0.6 else rng.choice(PAYLOADS)
        if rng.random() < 0.5:  # a quoting trick hiding a payload, to the end of the line
            fragment = rng.choice(TRICKS) + rng.choice(("", " ", ", ")) + \
                rng.choice(PAYLOADS) + rng.choice(("", "\n", " "))
        glue = rng.choice((" ", "", "\n", ", "))
        words.insert(rng.randint(1, len(words)), glue + fragment + glue)
    return " ".join(words)


@dataclass
class Tally:
    texts: int = 0
    approved: int = 0  # the guard approved the text
    as_written: int = 0  # the engine's reading of the original text names unapproved things
    regenerated: int = 0  # ... of the regenerated text, before the engine check
    run: int = 0  # ... and the engine check let it run: must be 0
    refused_by_engine_check: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, what: str, text: str) -> None:
        items = self.examples.setdefault(what, [])
        if len(items) < 3:
            items.append(text)

    def add(self, other: Tally) -> None:
        for name in ("texts", "approved", "as_written", "regenerated", "run",
                     "refused_by_engine_check"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for what, items in other.examples.items():
            for text in items:
                self.note(what, text)


def _sqlite_reader() -> Callable[[str], tuple[set[str], set[str]] | None]:
    con = sqlite3.connect(":memory:")
    con.execute("CREATE TABLE t (a INTEGER, s TEXT)")
    con.execute("CREATE TABLE u (a INTEGER)")
    seen_f: set[str] = set()
    seen_t: set[str] = set()

    def record(action: int, a1: Any, a2: Any, db: Any, source: Any) -> int:
        if action == sqlite3.SQLITE_FUNCTION:
            seen_f.add(str(a2).lower())
        elif action == sqlite3.SQLITE_READ and source is None:
            seen_t.add(str(a1).lower())
        elif action == sqlite3.SQLITE_PRAGMA:
            seen_t.add(f"pragma_{a1}".lower())
        return sqlite3.SQLITE_OK

    con.set_authorizer(record)

    def read(text: str) -> tuple[set[str], set[str]] | None:
        seen_f.clear()
        seen_t.clear()
        try:
            con.execute("EXPLAIN " + text).fetchall()
        except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError):
            return None  # SQLite does not prepare it: it would not run either
        return set(seen_f), set(seen_t)

    return read


def _unapproved(dialect: str, functions: set[str], tables: set[str],
                approved: set[str]) -> bool:
    from agentflow.sql.engine_check import _OPERATOR, catalog_problem, engine_names

    names = engine_names(dialect)
    if any(not (_OPERATOR.match(f) or f in names) for f in functions):
        return True
    return any(t not in approved and t not in ("sqlite_master", "sqlite_schema")
               or catalog_problem(dialect, "", t) for t in tables)


def _view_names(dialect: str, text: str) -> tuple[set[str], set[str]] | None:
    from agentflow.sql.engine_check import duckdb_view, postgres_view

    view = duckdb_view(text) if dialect == "duckdb" else postgres_view(text)
    if view.problems:
        return None
    functions = {n.lower() for schema, n in view.functions if not schema or schema in
                 ("main", "pg_catalog", "system")}
    functions |= {f"{schema}.{n}".lower() for schema, n in view.functions
                  if schema and schema not in ("main", "pg_catalog", "system")}
    tables = {(".".join(p for p in (c, s) if p) + "." if (c or s) else "") + n.lower()
              for c, s, n in view.tables}
    return functions, tables


def fuzz(engine: str, n: int, seed: int) -> Tally:
    """Run ``n`` texts against ``engine``'s parser (in this process)."""
    import logging

    from agentflow.sql.engine_check import approved_tables, regenerate, verify
    from agentflow.sql.errors import SqlError
    from agentflow.sql.guard import parse_single_query, strip_trailing

    logging.getLogger("sqlglot").setLevel(logging.ERROR)
    dialect = DIALECTS[engine]
    rng = random.Random(f"{engine}-{seed}")
    sqlite_read = _sqlite_reader() if engine == "sqlite" else None

    def reading(text: str) -> tuple[set[str], set[str]] | None:
        if sqlite_read is not None:
            return sqlite_read(text)
        return _view_names(dialect, text)

    tally = Tally()
    for _ in range(n):
        text = make_text(rng)
        tally.texts += 1
        try:
            tree = parse_single_query(text, dialect)
        except (SqlError, RecursionError):
            continue
        except Exception:  # noqa: BLE001 - a guard crash is a finding, not a bypass
            tally.note("guard crashed", text)
            continue
        tally.approved += 1
        tables = approved_tables(tree)
        approved = {t[2] for t in tables} | {".".join(p for p in t if p) for t in tables}
        before = reading(strip_trailing(text, dialect))
        if before is not None and _unapproved(dialect, *before, approved):
            tally.as_written += 1
            tally.note("as written", text)
        try:  # what Database.execute runs: SQLite the text as written, else the tree's
            run_sql = (strip_trailing(text, dialect) if engine == "sqlite"
                       else regenerate(tree, dialect))
        except Exception:  # noqa: BLE001 - a generator failure means it does not run
            continue
        after = reading(run_sql)
        bad = after is not None and _unapproved(dialect, *after, approved)
        if bad:
            tally.regenerated += 1
            tally.note("regenerated", text)
        try:
            if engine == "sqlite":
                _sqlite_check(run_sql, tables)
            else:
                verify(run_sql, dialect=dialect, tables=tables)
        except SqlError:
            tally.refused_by_engine_check += 1
            tally.note("refused by the engine check", text)
            continue
        if bad:
            tally.run += 1
            tally.note("run", text)
    return tally


def _sqlite_check(text: str, tables: set[tuple[str, str, str]]) -> None:
    """Prepare ``text`` under the authorizer ``Database`` installs; raise if it refuses."""
    from agentflow.sql.engine_check import SqliteAuthorizer

    con = _SQLITE_CHECK.get("con")
    if con is None:
        con = _SQLITE_CHECK["con"] = sqlite3.connect(":memory:")
        con.execute("CREATE TABLE t (a INTEGER, s TEXT)")
        con.execute("CREATE TABLE u (a INTEGER)")
    auth = SqliteAuthorizer(tables)
    con.set_authorizer(auth)
    try:
        con.execute("EXPLAIN " + text).fetchall()
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as err:
        refused = auth.error(text)
        if refused is not None:
            raise refused from err
    finally:
        con.set_authorizer(None)


_SQLITE_CHECK: dict[str, sqlite3.Connection] = {}


def _chunk(args: tuple[str, int, int]) -> Tally:
    return fuzz(*args)


QUICK_ARGS: tuple[str, ...] = ("--texts", "3000")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=100_000, help="texts per engine")
    parser.add_argument("--engines", default="sqlite,duckdb,postgres")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=1, help="processes")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    print("| engine | texts | guard approved | as written | regenerated | refused by "
          "engine check | ran unapproved | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    failed = False
    for engine in engines:
        start = time.monotonic()
        per = max(1, args.texts // max(1, args.jobs))
        chunks = [(engine, per, args.seed * 1000 + i) for i in range(max(1, args.jobs))]
        total = Tally()
        if args.jobs > 1:
            with ProcessPoolExecutor(args.jobs) as pool:
                for tally in pool.map(_chunk, chunks):
                    total.add(tally)
        else:
            total.add(_chunk(chunks[0]))
        failed |= total.run > 0
        print(f"| {engine} | {total.texts:,} | {total.approved:,} | {total.as_written:,} | "
              f"{total.regenerated:,} | {total.refused_by_engine_check:,} | {total.run:,} | "
              f"{time.monotonic() - start:.0f} |", flush=True)
        for what, items in sorted(total.examples.items()):
            for text in items:
                print(f"    {engine} {what}: {text!r}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
