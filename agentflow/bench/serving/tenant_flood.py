"""One key floods, another keeps its latency: per-tenant limits, measured on loopback.

    agentflow bench tenant_flood [--rounds 4] [--queries 10] [--flood-rps 100]

Starts ``serve.py`` in a subprocess (a free loopback port) with two *scripted* instances
(NOT a model: canned SQL, ``--latency`` seconds per call), so what is measured is the serving
path — HTTP, per-tenant admission, the scheduler's shared admission bound, the pipeline's
tool steps on the demo database. Two tenants: ``victim`` (no limits) and ``flooder``.
The victim asks questions one after another (wait=true) in ``--rounds`` rounds of two
blocks of ``--queries``: one alone, one while the flooder offers ``--flood-rps`` requests per
second from ``--flood-clients`` clients that ignore Retry-After (alternating blocks, so a
change in the machine's background load falls on both). It runs twice, in one process:
with the flooder limited (``--rate`` per minute, ``--concurrent`` in flight) and with the
flooder unlimited (the scheduler's shared bound, ``--max-active``, is then all that is left).
Prints the victim's median/P95 latency alone vs under the flood, the ratios, and what the
flooder got (answered, 429 by kind). Bounded: each flood lasts only while the victim's block
runs, at most ``--max-s`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import subprocess
import sys
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

ROOT = Path(__file__).resolve().parents[3]
SQL = "SELECT count(*) FROM stores"
VICTIM_KEY, FLOOD_KEY = "bench-victim-key", "bench-flooder-key"


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    victim_status: Counter = field(default_factory=Counter)
    flood_status: Counter = field(default_factory=Counter)
    flood_s: float = 0.0


def start_server(args: argparse.Namespace, limited: bool) -> tuple[subprocess.Popen, str]:
    instances = [{"name": f"scripted-{i}", "max_inflight": args.inflight,
                  "backend": {"type": "scripted", "name": f"scripted-{i}",
                              "answers": {"extract_keywords": "stores"}, "default": SQL,
                              "latency_s": args.latency}} for i in range(2)]
    flooder: dict = {"name": "flooder", "keys": [FLOOD_KEY]}
    if limited:
        flooder.update(rate_per_min=args.rate, max_concurrent=args.concurrent)
    config = {"fewshot": None, "pipeline": "single", "instances": instances,
              "scheduler": {"max_active_queries": args.max_active},
              "server": {"drain_s": 2, "tenants": [{"name": "victim", "keys": [VICTIM_KEY]},
                                                   flooder]}}
    proc, url, _ = serve(config, prefix="agentflow-flood-", start_timeout_s=60)
    return proc, url


def body(i: int, wait: bool = True) -> dict:
    return {"question": f"How many stores are there? ({i})", "db": "bookshop", "wait": wait}


async def victim(http: httpx.AsyncClient, url: str, n: int, phase: Phase) -> None:
    headers = {"X-API-Key": VICTIM_KEY}
    for i in range(n):
        start = time.perf_counter()
        r = await http.post(f"{url}/v1/queries", json=body(i), headers=headers)
        elapsed = time.perf_counter() - start
        code = r.json().get("error", {}).get("code") if r.status_code != 200 else \
            r.json()["status"]
        phase.victim_status[f"{r.status_code} {code}"] += 1
        if r.status_code == 200 and code == "done":
            phase.latencies.append(elapsed)


async def flooder(http: httpx.AsyncClient, url: str, interval_s: float, stop: Any,
                  status: Counter) -> None:
    """A hostile client: ignores Retry-After, sends at its pace until told to stop."""
    headers = {"X-API-Key": FLOOD_KEY}
    i = 0
    next_at = time.perf_counter()
    while not stop.is_set():
        i += 1
        try:
            r = await http.post(f"{url}/v1/queries", json=body(i, wait=True), headers=headers)
            count_status(status, r)
        except httpx.HTTPError as err:
            status[type(err).__name__] += 1
        next_at += interval_s
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))


def flood_process(url: str, clients: int, rps: float, stop: Any, ready: Any, out: Any
                  ) -> None:
    """The flood in a process of its own, so its clients never delay the victim's client
    (which would be counted as server latency)."""
    out.put(run_flood(clients, lambda http, status, _: flooder(http, url, clients / rps,
                                                               stop, status), ready))


async def block(http: httpx.AsyncClient, url: str, args: argparse.Namespace, flood: bool,
                phase: Phase) -> None:
    ctx = multiprocessing.get_context("spawn")
    stop, ready, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = None
    if flood:
        proc = ctx.Process(target=flood_process, daemon=True,
                           args=(url, args.flood_clients, args.flood_rps, stop, ready, out))
        proc.start()
        if not await asyncio.to_thread(ready.wait, 120):
            raise SystemExit("the flood process did not start within 120 s")
        await asyncio.sleep(1.0)  # the flood is under way before the victim starts
    start = time.perf_counter()
    try:
        await asyncio.wait_for(victim(http, url, args.queries, phase), args.max_s)
    except asyncio.TimeoutError:
        phase.victim_status["unfinished (max-s)"] += 1
    phase.flood_s += time.perf_counter() - start
    if proc is not None:
        stop.set()
        phase.flood_status.update(await asyncio.to_thread(out.get, True, 180))
        proc.join(30)
    await asyncio.sleep(1.0)  # the flood's queries in flight end before the next block


async def measure(url: str, args: argparse.Namespace) -> tuple[Phase, Phase]:
    alone, flooded = Phase(), Phase()
    limits = httpx.Limits(max_connections=args.flood_clients + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await victim(http, url, 3, Phase())  # warm-up: first-use costs out of the figures
        for _ in range(args.rounds):
            await block(http, url, args, False, alone)
            await block(http, url, args, True, flooded)
    return alone, flooded


def run_server(args: argparse.Namespace, limited: bool) -> tuple[Phase, Phase]:
    proc, url = start_server(args, limited)
    try:
        return asyncio.run(measure(url, args))
    finally:
        stop_server(proc, 20)


def report(label: str, alone: Phase, flooded: Phase) -> list[str]:
    med0, p950 = percentile(alone.latencies, 0.5), percentile(alone.latencies, 0.95)
    med1, p951 = percentile(flooded.latencies, 0.5), percentile(flooded.latencies, 0.95)
    sent = sum(flooded.flood_status.values())
    lines = [f"## {label}",
             f"victim alone:       median {med0 * 1000:7.1f} ms  P95 {p950 * 1000:7.1f} ms  "
             f"({len(alone.latencies)} answered; {dict(alone.victim_status)})",
             f"victim under flood: median {med1 * 1000:7.1f} ms  P95 {p951 * 1000:7.1f} ms  "
             f"({len(flooded.latencies)} answered; {dict(flooded.victim_status)})",
             f"ratio flood/alone:  median {med1 / med0:5.2f}x  P95 {p951 / p950:5.2f}x",
             f"flooder: {sent} requests in about {flooded.flood_s:.1f} s "
             f"({sent / max(flooded.flood_s, 1e-9):.0f}/s): {dict(flooded.flood_status)}"]
    return lines


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--rounds", "2", "--queries", "4")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="alone + flood blocks")
    p.add_argument("--queries", type=int, default=10, help="victim questions per block")
    p.add_argument("--flood-rps", type=float, default=100.0, help="flooder's offered rate")
    p.add_argument("--flood-clients", type=int, default=16)
    p.add_argument("--rate", type=float, default=6.0, help="flooder's limit, per minute")
    p.add_argument("--concurrent", type=int, default=1, help="flooder's limit in flight")
    p.add_argument("--max-active", type=int, default=8,
                   help="the scheduler's shared bound on queries in flight")
    p.add_argument("--latency", type=float, default=0.02, help="seconds per scripted call")
    p.add_argument("--inflight", type=int, default=4, help="calls in flight per instance")
    p.add_argument("--max-s", type=float, default=30.0, help="bound on each block")
    args = p.parse_args(argv)
    if not (1 <= args.rounds <= 20 and 2 <= args.queries <= 500) or args.flood_rps <= 0 or \
            not 1 <= args.flood_clients <= 256:
        p.error("--rounds in 1..20, --queries in 2..500, --flood-rps > 0, --flood-clients "
                "in 1..256")
    lines = [f"# tenant flood: {args.rounds} rounds x {args.queries} victim queries alone and "
             f"under flood; the flooder offers "
             f"{args.flood_rps:g}/s from {args.flood_clients} clients; shared bound "
             f"{args.max_active} queries in flight"]
    limited = run_server(args, limited=True)
    lines += report(f"flooder limited ({args.rate:g}/min, {args.concurrent} in flight)",
                    *limited)
    unlimited = run_server(args, limited=False)
    lines += report("flooder unlimited (shared bound only)", *unlimited)
    p95 = [percentile(f.latencies, 0.95) / percentile(a.latencies, 0.95)
           for a, f in (limited, unlimited)]
    lines.append(f"victim P95 under flood / alone: limited {p95[0]:.2f}x vs unlimited "
                 f"{p95[1]:.2f}x")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
