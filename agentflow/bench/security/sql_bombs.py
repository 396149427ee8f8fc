"""Resource bombs: time to stop and peak RSS, each statement in a fresh process.

    agentflow bench sql_bombs [--limit 2] [--engines sqlite,duckdb,postgres]
                                    [--tree /path/to/other/checkout] [--cap-s 120]

One row per statement: the engine, the outcome (rejected by the guard, timeout, engine error,
or ok = it ran to the end), seconds from the call to the answer, peak RSS of that process
(VmHWM, MB: see ``CHILD``), and the ratios the issue asks for: seconds / limit (must be
under 2) and peak RSS / the engine's memory bound (must be under 1). ``--tree`` runs the
children against another checkout (e.g. the main branch before the change) with the same
databases; a child still running after ``--cap-s`` is killed and shown as such. PostgreSQL
runs on a throwaway local server (``agentflow.sql.pg_local``), skipped where none is
installed; its row's RSS is the agentflow process's (the server's backend is another process,
bounded by ``statement_timeout``). Exit status 1 when a row misses either bound.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# The memory each engine may use, plus the margin of 100 MB for the interpreter,
# SQLAlchemy and the driver (an idle child measures 90-140 MB, inside the engine's share):
# DuckDB's memory_limit (512 MB), SQLite's hard heap limit (1 GiB, agentflow.sql.database)
# and, for PostgreSQL, the client's share (no engine-side limit applies to this process: rows
# are capped, values are at most 1 GB on the server).
MARGIN_MB = 100
MEMORY_BOUND_MB = {"duckdb": 512 + MARGIN_MB, "sqlite": 1024 + MARGIN_MB,
                   "postgresql": 512 + MARGIN_MB}


@dataclass(frozen=True)
class Bomb:
    """A statement, its engine, and what must stop it: the guard, or the engine's own limits
    and the watchdog (a builder that stays under every cap of the guard)."""

    engine: str
    stopper: str  # "guard" | "engine"
    sql: str


# Doubling a string 40 times: no single call is large, so no cap of the guard applies.
_DOUBLING = ("WITH RECURSIVE r(n, s) AS (SELECT 1, 'x' UNION ALL SELECT n + 1, s || s FROM r "
             "WHERE n < 40) SELECT max(length(s)) FROM r")
_COUNTER = "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c)"
# Issue 35 §2: growth no size argument shows. Nested (not recursive) CTEs doubling a string:
# 8 bytes x 2^30 = 8 GiB at the end of the chain.
_CHAIN = ("WITH a0 AS (SELECT 'xxxxxxxx' AS s), "
          + ", ".join(f"a{i} AS (SELECT s || s AS s FROM a{i - 1})" for i in range(1, 31))
          + " SELECT length(s) FROM a30")
# The same growth kept just under the guard's expansion bound (agentflow.sql.complexity), so
# the engine's own limits must stop it: 13 doublings of 8 KB (64 MB, twice SQLite's value cap)
# and 6 quadruplings of 32 KB (128 MB).
_NEAR_CHAIN = ("WITH a0 AS (SELECT '" + "x" * 8192 + "' AS s), "
               + ", ".join(f"a{i} AS (SELECT s || s AS s FROM a{i - 1})" for i in range(1, 14))
               + " SELECT length(s) FROM a13")
_NEAR_CHAIN4 = ("WITH a0 AS (SELECT '" + "y" * 32768 + "' AS s), "
                + ", ".join(f"a{i} AS (SELECT s || s || s || s AS s FROM a{i - 1})"
                            for i in range(1, 7))
                + " SELECT length(s) FROM a6")
# A fold that doubles its accumulator (issue: 212 -> 1,740 MB through MCP).
_FOLD = {"duckdb": "SELECT length(list_reduce(list_transform(range(40), lambda i: 'xx'), "
                   "lambda a, b: a || a || b))"}
# Replacing each character of a small value with a large one.
_REPLACE = {
    "duckdb": "SELECT sum(length(replace(repeat('x', 8000), 'x', repeat('y', 8000)))) "
              "FROM range(1000)",
    "sqlite": f"SELECT sum(length(replace(printf('%.8000c', 'x'), 'x', printf('%.8000c', 'y'))))"
              f" FROM (SELECT x FROM {_COUNTER} LIMIT 1000)",
    "postgresql": "SELECT sum(length(replace(repeat('x', 8000), 'x', repeat('y', 8000)))) "
                  "FROM generate_series(1, 1000)",
}

# The four first; then each idea on the other engines, written differently (width from
# an argument, a computed format, nesting), and builders that stay under every cap of the
# guard, so only the engine's own limits and the watchdog can stop them.
BOMBS: list[Bomb] = [
    Bomb("duckdb", "guard",
         "SELECT * FROM query('SELECT length(repeat(''x'', 2000000000)) AS n')"),
    Bomb("duckdb", "guard", "SELECT length(printf('%0999999999d', 1))"),
    Bomb("duckdb", "guard", "SELECT length(format('{:>999999999}', 1))"),
    Bomb("sqlite", "guard", "SELECT length(printf('%.*c', 1000000000, 'x'))"),
    Bomb("duckdb", "guard", "SELECT length(printf('%*d', 999999999, 1))"),
    Bomb("duckdb", "guard", "SELECT length(format('{:>{}}', 1, 999999999))"),
    Bomb("duckdb", "guard", "SELECT length(printf('%0' || '999999999' || 'd', 1))"),
    Bomb("duckdb", "guard",
         "SELECT * FROM (SELECT length(format('{:0>999999999}', n)) FROM range(3) t(n))"),
    Bomb("sqlite", "guard", "SELECT length(printf('%0999999999d', 1))"),
    Bomb("sqlite", "guard", "SELECT length(format('%.*c', 1000000000, 'x'))"),
    Bomb("sqlite", "guard", "SELECT length(printf('%.*c', (SELECT 1000000000), 'x'))"),
    Bomb("sqlite", "guard",
         "WITH w(n) AS (SELECT 1000000000) SELECT length(printf('%.*c', n, 'x')) FROM w"),
    Bomb("postgresql", "guard", "SELECT length(format('%999999999s', 1))"),
    Bomb("postgresql", "guard", "SELECT length(format('%*s', 999999999, 'x'))"),
    Bomb("postgresql", "guard",
         "SELECT * FROM query_to_xml('SELECT repeat(''x'', 1000000000)', true, true, '')"),
    Bomb("postgresql", "guard", f"SELECT repeat('{'x' * 100}', 1000000)"),
    Bomb("postgresql", "guard", "SELECT lpad('x', 500000000)"),
    Bomb("postgresql", "guard", "SELECT length(repeat('x', 1000000000))"),
    Bomb("sqlite", "engine", _DOUBLING),
    Bomb("sqlite", "engine", f"SELECT sum(length(printf('%.1000c', 'x'))) FROM {_COUNTER}"),
    Bomb("duckdb", "engine", _DOUBLING),
    Bomb("duckdb", "engine",
         "SELECT sum(length(replace(repeat('x', 8000), 'x', repeat('y', 8000)))) "
         "FROM range(100000)"),
    Bomb("duckdb", "engine",
         "SELECT length(string_agg(repeat('x', 8000), '')) FROM range(1000000)"),
    Bomb("postgresql", "engine", _DOUBLING),

    Bomb("postgresql", "engine", f"SELECT repeat('{'x' * 100}', (SELECT 1000000))"),
    Bomb("postgresql", "engine", "SELECT lpad('x', (SELECT 100000000))"),
    Bomb("postgresql", "engine",
         "SELECT sum(length(repeat('x', 30000000 + g % 2))) FROM generate_series(1, 1000) g"),
    # issue 35 §2 (the guard's bounds only cover calls with a size argument)
    *(Bomb(engine, "engine", _CHAIN) for engine in ("sqlite", "duckdb", "postgresql")),
    *(Bomb(engine, "engine", sql) for engine in ("sqlite", "duckdb", "postgresql")
      for sql in (_NEAR_CHAIN, _NEAR_CHAIN4)),
    *(Bomb(engine, "engine", sql) for engine, sql in _FOLD.items()),
    *(Bomb(engine, "engine", sql) for engine, sql in _REPLACE.items()),
    # one 240 MB value: no per-value limit in PostgreSQL; the server refuses the row
    Bomb("postgresql", "engine",
         "SELECT string_agg(repeat('x', 8000), '') FROM generate_series(1, 30000)"),
]

# Peak RSS is the kernel's high-water mark of this process's own memory (VmHWM). On Linux
# ``getrusage(RUSAGE_SELF).ru_maxrss`` also carries the parent's high-water mark across
# fork + exec (a child of a 900 MB pytest process reports 900 MB before doing anything), so
# it is reported only where /proc is missing.
CHILD = """
import json, resource, sys, time
from agentflow.sql import Database

def peak_mb():
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

target, sql, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
db = Database.open(target)
db.execute("SELECT 1", timeout_s=30)  # warm the pool and the guard: set-up is not the query
start = time.monotonic()
result = db.try_execute(sql, timeout_s=limit)
elapsed = time.monotonic() - start
print(json.dumps({"elapsed": elapsed, "kind": getattr(result, "kind", "ok"),
                  "error": str(result)[:200] if hasattr(result, "kind") else None,
                  "peak_mb": peak_mb(),
                  "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


@dataclass
class Outcome:
    engine: str
    sql: str
    kind: str  # rejected | timeout | execution_error | ok | killed | crashed
    elapsed_s: float
    peak_mb: float | None
    error: str | None
    limit_s: float

    @property
    def time_ratio(self) -> float:
        return self.elapsed_s / self.limit_s

    @property
    def memory_ratio(self) -> float | None:
        return None if self.peak_mb is None else self.peak_mb / MEMORY_BOUND_MB[self.engine]

    @property
    def in_time(self) -> bool:
        """Answered (refused, stopped, or finished) within 2x the limit."""
        return self.kind not in ("killed", "crashed") and self.time_ratio < 2

    @property
    def within_memory(self) -> bool:
        return self.memory_ratio is not None and self.memory_ratio < 1


def make_sqlite(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.executescript("CREATE TABLE t (n INTEGER, s TEXT);"
                      "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c');")
    con.commit()
    con.close()
    return path


def run_one(target: str, engine: str, sql: str, limit_s: float, *, tree: Path = ROOT,
            cap_s: float = 120.0) -> Outcome:
    """Run ``sql`` against ``target`` in a fresh Python process using the code in ``tree``."""
    start = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, target, sql, str(limit_s)],
                             capture_output=True, text=True, timeout=cap_s, cwd=tree,
                             env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    except subprocess.TimeoutExpired:
        return Outcome(engine, sql, "killed", time.monotonic() - start, None,
                       f"still running after {cap_s:g} s", limit_s)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return Outcome(engine, sql, "crashed", time.monotonic() - start, None,
                       (out.stderr.strip().splitlines() or ["no output"])[-1][:200], limit_s)
    r = json.loads(lines[-1])
    return Outcome(engine, sql, r["kind"], r["elapsed"], r["peak_mb"], r["error"], limit_s)


class Targets:
    """The databases the children open: a SQLite and a DuckDB file, and a PostgreSQL URL."""

    def __init__(self, folder: Path, engines: set[str]) -> None:
        self.paths: dict[str, str] = {}
        self._pg = None
        sqlite_path = make_sqlite(folder / "bombs.sqlite")
        self.paths["sqlite"] = str(sqlite_path)
        if "duckdb" in engines:
            from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb

            self.paths["duckdb"] = str(convert_sqlite_to_duckdb(
                sqlite_path, folder / "bombs.duckdb").dst)
        if "postgresql" in engines:
            from agentflow.sql.pg_local import LocalPostgres, PostgresUnavailable

            try:
                self._pg = LocalPostgres().init().start()
            except PostgresUnavailable as err:
                print(f"PostgreSQL skipped: {err}", file=sys.stderr)
            else:
                self._pg.create_database("bombs")
                self._pg.create_reader("bomber", "b0mb-pass", "bombs")
                self.paths["postgresql"] = self._pg.url("bomber", "bombs", "b0mb-pass")

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()


def print_table(rows: list[Outcome], title: str) -> None:
    print(f"\n{title}")
    print(f"| {'engine':10} | {'outcome':15} | {'seconds':>8} | {'/ limit':>7} | {'peak MB':>8} "
          f"| {'/ bound':>7} | statement |")
    print(f"|{'-' * 12}|{'-' * 17}|{'-' * 10}|{'-' * 9}|{'-' * 10}|{'-' * 9}|-----------|")
    for r in rows:
        mem = f"{r.peak_mb:8.0f}" if r.peak_mb is not None else f"{'?':>8}"
        ratio = f"{r.memory_ratio:7.2f}" if r.memory_ratio is not None else f"{'?':>7}"
        sql = r.sql if len(r.sql) <= 90 else r.sql[:87] + "..."
        print(f"| {r.engine:10} | {r.kind:15} | {r.elapsed_s:8.2f} | {r.time_ratio:7.2f} | {mem} "
              f"| {ratio} | `{sql}` |")


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--engines", "sqlite,duckdb")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=2.0, help="time limit per statement, s")
    parser.add_argument("--engines", default="sqlite,duckdb,postgres")
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="checkout whose agentflow the children run (default: this one)")
    parser.add_argument("--cap-s", type=float, default=120.0,
                        help="kill a child still running after this many seconds")
    parser.add_argument("--only", default="", help="run only statements containing this text")
    args = parser.parse_args(argv)
    engines = {"postgresql" if e.strip() == "postgres" else e.strip()
               for e in args.engines.split(",") if e.strip()}
    rows: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        targets = Targets(Path(tmp), engines)
        try:
            for bomb in BOMBS:
                engine, sql = bomb.engine, bomb.sql
                if engine not in engines or engine not in targets.paths or args.only not in sql:
                    continue
                rows.append(run_one(targets.paths[engine], engine, sql, args.limit,
                                    tree=args.tree.resolve(), cap_s=args.cap_s))
                r = rows[-1]
                print(f"{engine:10} {r.kind:15} {r.elapsed_s:7.2f}s {r.peak_mb or 0:7.0f} MB  "
                      f"{sql[:60]}  {r.error or ''}", file=sys.stderr, flush=True)
        finally:
            targets.close()
    print_table(rows, f"{args.limit:g} s limit, code from {args.tree.resolve()}; memory bound = "
                      f"engine limit + {MARGIN_MB} MB ({MEMORY_BOUND_MB})")
    bad = [r for r in rows if not (r.in_time and r.within_memory)]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} answered within 2x the limit and the memory bound")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
