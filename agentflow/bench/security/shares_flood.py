"""A's slow SQL and A's teach calls leave B its latency: database threads as shares, measured.

    agentflow bench shares_flood [--rounds 3] [--queries 8] [--sql-s 2]

Starts ``serve.py`` in a subprocess (a free loopback port) with two *scripted* instances (NOT
a model: canned SQL), the demo SQLite database and two tenants: ``victim`` (B) and ``flooder``
(A, ``--concurrent`` in flight: the flood stays within A's own limits). A's questions get SQL
that runs until the SQL time limit (``--sql-s``) stops it; B's get a count of six rows.
B asks one question after another (wait=true) in ``--rounds`` rounds of three blocks of
``--queries``: alone, while A keeps ``--concurrent`` slow questions in flight, and while A
keeps ``--concurrent`` teach calls with the slow SQL in flight (alternating blocks, so a
change in the machine's background load falls on all three). The floods run in a process of
their own. Prints B's median/P95 in each block, the ratios to B alone (the issue's target:
P95 within 1.5x), and what A got.

The slow SQL burns CPU for its whole time limit: on a machine with few cores what is left of
B's ratio is mostly CPU contention, not waiting for a thread (which is what the shares fix;
``tests/server/test_db_shares.py`` shows B waiting for A before them).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentflow.bench.serving.served import (
    count_status,
    percentile,
    run_flood,
    serve,
    stop_server,
)

GOOD_SQL = "SELECT count(*) FROM stores"
SLOW_SQL = ("SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
            "FROM c) SELECT x FROM c)")
VICTIM_KEY, FLOOD_KEY = "bench-shares-victim", "bench-shares-flooder"
KINDS = ("alone", "slow_sql", "teach")


@dataclass
class Block:
    latencies: list[float] = field(default_factory=list)
    victim_status: Counter = field(default_factory=Counter)
    flood_status: Counter = field(default_factory=Counter)


def start_server(args: argparse.Namespace, workdir: Path) -> tuple[subprocess.Popen, str]:
    instances = [{"name": f"scripted-{i}", "max_inflight": 16,
                  "backend": {"type": "scripted", "name": f"scripted-{i}",
                              "answers": {"extract_keywords": "stores"}, "default": GOOD_SQL,
                              "by_prompt": {"count slowly": SLOW_SQL},
                              "latency_s": args.latency}} for i in range(2)]
    config = {"fewshot": None, "pipeline": "single", "instances": instances,
              "sql_timeout_s": args.sql_s, "teaching_store": str(workdir / "teaching.sqlite"),
              "server": {"drain_s": 2, "tenants": [
                  {"name": "victim", "keys": [VICTIM_KEY]},
                  {"name": "flooder", "keys": [FLOOD_KEY], "max_concurrent": args.concurrent}]}}
    proc, url, _ = serve(config, prefix="agentflow-shares-", start_timeout_s=90)
    return proc, url


async def victim(http: httpx.AsyncClient, url: str, n: int, block: Block) -> None:
    headers = {"X-API-Key": VICTIM_KEY}
    for i in range(n):
        body = {"question": f"How many stores are there? ({i})", "db": "bookshop", "wait": True}
        start = time.perf_counter()
        r = await http.post(f"{url}/v1/queries", json=body, headers=headers)
        elapsed = time.perf_counter() - start
        status = r.json().get("status") if r.status_code == 200 else \
            r.json().get("error", {}).get("code")
        block.victim_status[f"{r.status_code} {status}"] += 1
        if r.status_code == 200 and status == "done":
            block.latencies.append(elapsed)


async def flood_client(http: httpx.AsyncClient, url: str, kind: str, stop: Any,
                       status: Counter, me: int) -> None:
    headers = {"X-API-Key": FLOOD_KEY}
    i = 0
    while not stop.is_set():
        i += 1
        try:
            if kind == "slow_sql":
                r = await http.post(f"{url}/v1/queries", headers=headers, json={
                    "question": f"count slowly ({me}.{i})", "db": "bookshop", "wait": True})
            else:
                r = await http.post(f"{url}/v1/databases/bookshop/examples", headers=headers,
                                    json={"question": f"Forever {me}.{i}?", "sql": SLOW_SQL})
            count_status(status, r)
            if r.status_code == 429:
                await asyncio.sleep(0.2)
        except httpx.HTTPError as err:
            status[type(err).__name__] += 1


def flood_process(url: str, kind: str, clients: int, stop: Any, out: Any,
                  ready: Any) -> None:
    out.put(run_flood(clients, lambda http, status, c: flood_client(http, url, kind, stop,
                                                                     status, c), ready))


async def run_block(http: httpx.AsyncClient, url: str, args: argparse.Namespace, kind: str,
                    block: Block) -> None:
    ctx = multiprocessing.get_context("spawn")
    stop, out, ready = ctx.Event(), ctx.Queue(), ctx.Event()
    proc = None
    if kind != "alone":
        proc = ctx.Process(target=flood_process, daemon=True,
                           args=(url, kind, args.concurrent, stop, out, ready))
        proc.start()
        # A's SQL is running before B starts. The head start counts from the flood's first
        # request: a spawned process takes seconds to start on a loaded machine, and B once
        # ran its whole block before A sent anything (A got nothing: B alone, measured twice).
        if not await asyncio.to_thread(ready.wait, 120):
            raise SystemExit("the flood process did not start within 120 s")
        await asyncio.sleep(args.warmup_s)
    try:
        await asyncio.wait_for(victim(http, url, args.queries, block), args.max_s)
    except asyncio.TimeoutError:
        block.victim_status["unfinished (max-s)"] += 1
    if proc is not None:
        stop.set()
        block.flood_status.update(await asyncio.to_thread(out.get, True, 300))
        proc.join(30)
        await asyncio.sleep(args.sql_s + 0.5)  # A's SQL in flight ends before the next block


async def measure(url: str, args: argparse.Namespace) -> dict[str, Block]:
    blocks = {k: Block() for k in KINDS}
    async with httpx.AsyncClient(timeout=120) as http:
        await victim(http, url, 3, Block())  # warm-up
        for _ in range(args.rounds):
            for kind in KINDS:
                await run_block(http, url, args, kind, blocks[kind])
    return blocks


def report(args: argparse.Namespace, blocks: dict[str, Block]) -> list[str]:
    alone = blocks["alone"].latencies
    med0, p950 = percentile(alone, 0.5), percentile(alone, 0.95)
    lines = [f"# shares flood: {args.rounds} rounds x {args.queries} B questions per block; "
             f"A keeps {args.concurrent} in flight (its own limit), SQL limit {args.sql_s:g} s"]
    for kind in KINDS:
        b = blocks[kind]
        med, p95 = percentile(b.latencies, 0.5), percentile(b.latencies, 0.95)
        line = (f"B {kind:9s}: median {med * 1000:7.1f} ms  P95 {p95 * 1000:7.1f} ms  "
                f"({len(b.latencies)} answered; {dict(b.victim_status)})")
        if kind != "alone" and not b.flood_status:
            line += "\n  NOT A FLOOD: no request of A's came back"
        if kind != "alone":
            line += f"\n  ratio to alone: median {med / med0:5.2f}x  P95 {p95 / p950:5.2f}x" \
                    f"  (target P95 <= 1.5x)\n  A got: {dict(b.flood_status)}"
        lines.append(line)
    return lines


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--rounds", "2", "--queries", "5")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--queries", type=int, default=8, help="B's questions per block")
    p.add_argument("--concurrent", type=int, default=8, help="A's limit in flight")
    p.add_argument("--sql-s", type=float, default=2.0, help="the SQL time limit")
    p.add_argument("--latency", type=float, default=0.02, help="seconds per scripted call")
    p.add_argument("--warmup-s", type=float, default=1.5, help="flood head start")
    p.add_argument("--max-s", type=float, default=60.0, help="bound on each block")
    args = p.parse_args(argv)
    if not (1 <= args.rounds <= 20 and 2 <= args.queries <= 200 and 1 <= args.concurrent
            <= 64 and 0.2 <= args.sql_s <= 30):
        p.error("--rounds 1..20, --queries 2..200, --concurrent 1..64, --sql-s 0.2..30")
    with tempfile.TemporaryDirectory(prefix="agentflow-shares-") as tmp:
        proc, url = start_server(args, Path(tmp))
        try:
            blocks = asyncio.run(measure(url, args))
        finally:
            stop_server(proc, 20)
    print("\n".join(report(args, blocks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
