"""Does a second replica double what one host serves? load_test against 1 and 2 replicas.

    agentflow bench replicas_load [--queries 200] [--clients 16] [--replicas 1,2]
    agentflow bench replicas_load --quick          # 60 queries, 8 clients

Each run starts ``serve.py --replicas N`` on a free loopback port with its own state store
file and *scripted* instances (NOT a model: canned SQL, ``--latency`` seconds per call, as
load_test), then drives it with load_test's clients (``wait=true``, new connections spread by
the kernel over the replicas). Printed per N, side by side in one run: answered queries/s,
errors, the server's CPU per answered query (every process of the server, read from
``/proc``), and the ratios to N=1. Each replica has its own scheduler and its own scripted
instances, so the fleet behind it grows with N: the scripted latency is kept low enough that
one replica is CPU-bound, which is what this measures. The clients run on the same machine
and take CPU too; on a shared machine the ratio is a floor. ``--baseline`` adds one replica
with ``--state off`` (everything in the process, as before the store): the store's own cost.
``--rounds K`` runs every configuration K times, in turn (1, 2, no store, 1, 2, ...), so a
change in the machine's background load falls on all of them; printed are the medians over
the rounds, and every round's queries/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from agentflow.bench.serving.served import serve, stop_server

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and every process below it, now."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    total = 0.0
    for pid, cpu in times.items():
        p = pid
        while p > 1 and p != root:
            p = parents.get(p, 0)
        if p == root:
            total += cpu
    return total


def wait_replicas(state: Path, n: int, timeout_s: float = 180.0) -> None:
    from agentflow.state import open_store

    store = open_store(state)
    try:
        deadline = time.monotonic() + timeout_s
        while len(store.live_replicas(5.0)) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"{n} replicas did not come up within {timeout_s:.0f} s")
            time.sleep(0.2)
    finally:
        store.close()


def one(n: int, args: argparse.Namespace, *, state: bool = True) -> dict[str, Any]:
    from agentflow.bench.serving.load_test import SQL, drive

    instances = [{"name": f"scripted-{i}", "max_inflight": args.inflight,
                  "backend": {"type": "scripted", "name": f"scripted-{i}",
                              "answers": {"extract_keywords": "stores"}, "default": SQL,
                              "latency_s": args.latency}} for i in range(args.instances)]
    config = {"fewshot": None, "pipeline": args.pipeline, "slo_s": args.slo,
              "instances": instances, "scheduler": {"max_active_queries": 200},
              "server": {"drain_s": 5}}
    proc, url, path = serve(config, prefix="agentflow-replicas-", start_timeout_s=180,
                            extra_args=["--replicas", str(n),
                                        *(() if state else ("--state", "off"))])
    try:
        if state:
            wait_replicas(path.parent / "state.sqlite", n)
        drive_args = argparse.Namespace(queries=args.queries, clients=args.clients,
                                        timeout=args.timeout, key=None, retries=3)
        asyncio.run(drive(url, argparse.Namespace(**{**vars(drive_args), "queries":
                                                     min(10, args.queries)})))  # warm-up
        before = tree_cpu_s(proc.pid)
        run = asyncio.run(drive(url, drive_args))
        cpu = tree_cpu_s(proc.pid) - before
    finally:
        stop_server(proc, 60)
    answered = [o for o in run.outcomes if o.kind == "done"]
    elapsed = run.finished - run.started
    return {"replicas": n if state else f"{n}, no store", "answered": len(answered),
            "queries": len(run.outcomes),
            "errors": sum(o.kind != "done" for o in run.outcomes),
            "qps": len(answered) / elapsed if elapsed > 0 else float("nan"),
            "cpu_ms_per_query": 1000 * cpu / max(1, len(answered)), "elapsed_s": elapsed}


def median_run(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's rounds as one row: medians of the rates, sums of the counts."""
    row = dict(rounds[0])
    for key in ("qps", "cpu_ms_per_query", "elapsed_s"):
        row[key] = statistics.median(r[key] for r in rounds)
    for key in ("answered", "queries", "errors"):
        row[key] = sum(r[key] for r in rounds)
    return row


QUICK_ARGS: tuple[str, ...] = ("--queries", "60", "--clients", "8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--inflight", type=int, default=16, help="calls at once per instance")
    p.add_argument("--latency", type=float, default=0.005, help="scripted seconds per call")
    p.add_argument("--pipeline", default="chess")
    p.add_argument("--slo", type=float, default=60.0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--baseline", action="store_true",
                   help="also one replica with --state off (no store), for the store's cost")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every configuration this many times, in turn; medians")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    plan = [(n, True) for n in counts]
    if args.baseline:  # one process, state kept in it: the server before the store
        plan.append((1, False))
    runs: list[list[dict[str, Any]]] = [[] for _ in plan]
    for _ in range(max(1, args.rounds)):
        for i, (n, state) in enumerate(plan):
            runs[i].append(one(n, args, state=state))
    results = [median_run(r) for r in runs]
    base = results[0]
    print(f"\n{args.queries} {args.pipeline} queries, {args.clients} clients, scripted "
          f"instances (NOT a model: {args.instances} x {args.latency * 1000:g} ms per call, "
          f"per replica); machine: {os.cpu_count()} CPUs")
    print(f"{'replicas':>14} {'answered':>9} {'errors':>7} {'queries/s':>10} {'ratio':>6} "
          f"{'server CPU ms/query':>20} {'ratio':>6}")
    for r in results:
        print(f"{r['replicas']!s:>14} {r['answered']:>9} {r['errors']:>7} {r['qps']:>10.1f} "
              f"{r['qps'] / base['qps']:>6.2f} {r['cpu_ms_per_query']:>20.1f} "
              f"{r['cpu_ms_per_query'] / base['cpu_ms_per_query']:>6.2f}")
    if args.rounds > 1:
        for (n, state), rs in zip(plan, runs):
            label = n if state else f"{n}, no store"
            print(f"  queries/s per round, {label}: "
                  + ", ".join(f"{r['qps']:.1f}" for r in rs))
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
