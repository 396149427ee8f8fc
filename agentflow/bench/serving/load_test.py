"""A bounded loopback load run against the real HTTP server: nothing is lost.

    agentflow bench load_test [--queries 200] [--clients 20] [--max-active 12]
    agentflow bench load_test --url http://127.0.0.1:8000 --key KEY   # a running server

Without ``--url`` it starts ``serve.py`` in a subprocess on a free loopback port with two
*scripted* instances (NOT a model: canned SQL, ``--latency`` seconds per call), so what is
measured is the serving path — HTTP, admission, the scheduler, the real pipeline's tool steps
on the demo database — not LLM speed. Clients ask the demo database's questions with
``wait=true``; a 429 is a rejection with a reason and Retry-After (``--retries`` makes
clients honour it). At the end every query must be accounted for: answered (done / failed /
cancelled) or rejected with a reason, and the server's own counters must agree. Exit status 1
if any query is lost or the counts disagree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentflow.bench.serving.served import percentile, serve, stop_server

ROOT = Path(__file__).resolve().parents[3]
SQL = "SELECT count(*) FROM stores"


@dataclass
class Outcome:
    index: int
    kind: str  # done | failed | cancelled | rejected | error | lost
    wall_s: float
    server_latency_s: float | None = None
    met_slo: bool | None = None
    reason: str = ""
    attempts: int = 1
    retries_on_instances: int = 0  # failed attempts then re-run on another instance
    failed_attempts: int = 0  # every failed attempt, re-run or not


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0


def questions() -> list[str]:
    from agentflow.datasets import load_dataset

    return [e.question for e in load_dataset("demo").examples]


def start_server(args: argparse.Namespace, faults: dict[int, list[dict]] | None = None,
                 scheduler: dict | None = None) -> tuple[subprocess.Popen, str, Path]:
    """``faults``: scripted faults by instance index (see ``agentflow.llm.scripted.Fault``);
    ``scheduler``: extra scheduler settings (e.g. health)."""
    faults = faults or {}
    instances = [{"name": f"scripted-{i}", "max_inflight": args.inflight,
                  "backend": {"type": "scripted", "name": f"scripted-{i}",
                              "answers": {"extract_keywords": "stores"}, "default": SQL,
                              "latency_s": args.latency, "faults": faults.get(i, [])}}
                 for i in range(args.instances)]
    config = {"fewshot": None, "pipeline": args.pipeline, "slo_s": args.slo,
              "instances": instances,
              "scheduler": {"policy": args.policy, "max_active_queries": args.max_active,
                            **(scheduler or {})},
              "server": {"drain_s": 5}}
    return serve(config, prefix="agentflow-load-", start_timeout_s=60)


async def client(http: Any, url: str, todo: asyncio.Queue, qs: list[str],
                 run: Run, args: argparse.Namespace) -> None:
    while True:
        try:
            index = todo.get_nowait()
        except asyncio.QueueEmpty:
            return
        body = {"question": qs[index % len(qs)], "db": "bookshop", "wait": True}
        start = time.perf_counter()
        attempts = 0
        while True:
            attempts += 1
            try:
                r = await http.post(f"{url}/v1/queries", json=body)
            except httpx.TimeoutException as err:  # no answer within the client's timeout
                run.outcomes.append(Outcome(index, "hung", time.perf_counter() - start,
                                            reason=f"{type(err).__name__}: {err}",
                                            attempts=attempts))
                break
            except httpx.HTTPError as err:
                run.outcomes.append(Outcome(index, "lost", time.perf_counter() - start,
                                            reason=f"{type(err).__name__}: {err}",
                                            attempts=attempts))
                break
            wall = time.perf_counter() - start
            if r.status_code == 429 and attempts <= args.retries:
                await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                continue
            if r.status_code == 200:
                a = r.json()
                retries = a.get("retries", [])
                run.outcomes.append(Outcome(index, a["status"], wall, a["latency_s"],
                                            a["met_slo"], a.get("error") or "", attempts,
                                            sum(1 for x in retries if x.get("rerun_on")),
                                            len(retries)))
            elif r.status_code in (429, 503):
                err = r.json()["error"]
                reason = f"{r.status_code}: {err['message']} " \
                         f"(Retry-After {r.headers.get('retry-after')})"
                run.outcomes.append(Outcome(index, "rejected", wall, reason=reason,
                                            attempts=attempts))
            else:
                run.outcomes.append(Outcome(index, "error", wall, reason=f"{r.status_code} "
                                            f"{r.text[:200]}", attempts=attempts))
            break


async def drive(url: str, args: argparse.Namespace) -> Run:
    qs = questions()
    todo: asyncio.Queue = asyncio.Queue()
    for i in range(args.queries):
        todo.put_nowait(i)
    run = Run()
    headers = {"Authorization": f"Bearer {args.key}"} if args.key else {}
    # An idle pooled connection is dropped by the client before the server's keep-alive
    # timeout (uvicorn's 5 s) can close it: reusing one at the instant the server closes it
    # ends a POST in a ReadError the server never saw, which read as a lost query when
    # clients slept on a Retry-After near 5 s (httpx's default expiry is 5 s too).
    # ``fresh_connections``: no keep-alive, each query on a connection of its own (the
    # kernel spreads a SO_REUSEPORT group's connections, not requests: a few kept-alive
    # connections pin the clients to whichever replica each first landed on)
    fresh = getattr(args, "fresh_connections", False)
    keep = 0 if fresh else args.clients
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=keep,
                          keepalive_expiry=2.0)
    http: Any
    if getattr(args, "lean_client", False):  # a fraction of httpx's CPU per request
        from agentflow.bench.serving.lean_client import LeanClient

        http = LeanClient(url, timeout=args.timeout, keepalive=not fresh, headers=headers)
    else:
        http = httpx.AsyncClient(timeout=args.timeout, limits=limits, headers=headers)
    async with http:
        run.started = time.perf_counter()
        await asyncio.gather(*(client(http, url, todo, qs, run, args)
                               for _ in range(args.clients)))
        run.finished = time.perf_counter()
    return run


def server_counts(url: str, key: str | None) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=10).text
    counts = {}
    for m in re.finditer(r'^agentflow_queries_total\{status="(\w+)"\} ([0-9.e+]+)$', text, re.M):
        counts[m.group(1)] = float(m.group(2))
    for name in ("agentflow_slo_attainment_ratio",):
        m = re.search(rf"^{name} ([0-9.naNe+-]+)$", text, re.M)
        if m:
            counts[name] = float(m.group(1))
    decisions = re.findall(r'^agentflow_scheduler_decision_seconds_(sum|count)\{event="(\w+)"\} '
                           r"([0-9.e+-]+)$", text, re.M)
    total = {"sum": 0.0, "count": 0.0}
    for kind, _, value in decisions:
        total[kind] += float(value)
    if total["count"]:
        counts["decision_mean_us"] = 1e6 * total["sum"] / total["count"]
        counts["decisions"] = total["count"]
    return counts


def report(run: Run, server: dict[str, float], args: argparse.Namespace) -> int:
    outcomes = sorted(run.outcomes, key=lambda o: o.index)
    by_kind = Counter(o.kind for o in outcomes)
    elapsed = run.finished - run.started
    answered = [o for o in outcomes if o.kind in ("done", "unsure", "failed", "cancelled")]
    print(f"\n{args.queries} queries from {args.clients} concurrent clients in {elapsed:.1f} s "
          f"(scripted instances, NOT a model: {args.instances} x {args.latency * 1000:g} ms "
          f"per call; admission bound max_active_queries={args.max_active})")
    print("\nby status (client side):")
    for kind in ("done", "unsure", "failed", "cancelled", "rejected", "error", "hung", "lost"):
        print(f"  {kind:<10} {by_kind.get(kind, 0):>5}")
    print(f"  {'total':<10} {len(outcomes):>5}")
    # group rejections by reason, with the numbers in the message (counts, seconds) as N
    reasons = Counter(o.reason[:4] + re.sub(r"\d+(\.\d+)?", "N", o.reason[4:])
                      for o in outcomes if o.kind == "rejected")
    for reason, n in reasons.most_common(3):
        print(f"  rejected x{n}: {reason}")
    fails = Counter(o.reason for o in outcomes if o.kind in ("failed", "error", "hung", "lost"))
    for reason, n in fails.most_common(3):
        print(f"  failed/error x{n}: {reason}")

    def line(name: str, values: list[float]) -> None:
        print(f"  {name:<32} n={len(values):>4}  p50 {percentile(values, .5) * 1000:8.1f} ms"
              f"  p95 {percentile(values, .95) * 1000:8.1f} ms  p99 "
              f"{percentile(values, .99) * 1000:8.1f} ms  max "
              f"{(max(values) if values else float('nan')) * 1000:8.1f} ms")
    print("\nlatency:")
    line("answered, client wall clock", [o.wall_s for o in answered])
    line("answered, server end-to-end", [o.server_latency_s for o in answered
                                         if o.server_latency_s is not None])
    if by_kind.get("rejected"):
        line("rejections, client wall clock",
             [o.wall_s for o in outcomes if o.kind == "rejected"])
    if any(o.attempts > 1 for o in outcomes):
        print(f"  {sum(o.attempts - 1 for o in outcomes)} re-sends after 429 + Retry-After")
    slo = [o.met_slo for o in answered if o.met_slo is not None]
    print(f"\nthroughput {len(answered) / elapsed:.1f} answered queries/s; SLO {args.slo:g} s "
          f"met by {sum(slo)}/{len(slo)} answered"
          + (f"; {sum(o.retries_on_instances for o in answered)} calls re-run on another "
             f"instance" if any(o.retries_on_instances for o in answered) else "")
          + (f"; {sum(o.failed_attempts - o.retries_on_instances for o in answered)} failed "
             f"attempts not re-run" if any(o.failed_attempts > o.retries_on_instances
                                           for o in answered) else ""))
    if server.get("decisions"):
        print(f"scheduler: {server['decisions']:.0f} coordinator events, mean "
              f"{server['decision_mean_us']:.0f} us each (timed around the coordinator)")

    server_total = sum(v for k, v in server.items() if k in
                       ("done", "unsure", "failed", "cancelled", "rejected"))
    # every attempt the server saw (a client honouring Retry-After re-sends after a 429)
    client_total = sum(o.attempts for o in outcomes if o.kind not in ("lost", "error", "hung"))
    shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(server.items())
                      if k in ("done", "unsure", "failed", "cancelled", "rejected"))
    print(f"\nserver counters: {shown} (total {server_total:.0f}; client requests "
          f"{client_total})")
    lost = by_kind.get("lost", 0) + by_kind.get("error", 0) + by_kind.get("hung", 0)
    agree = args.url is not None or server_total == client_total
    ok = lost == 0 and len(outcomes) == args.queries and agree
    print("OK: every query answered or rejected with a reason" if ok else
          "PROBLEM: queries lost, errored, or counts disagree")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "queries": args.queries, "clients": args.clients, "elapsed_s": elapsed,
            "by_status": dict(by_kind), "server_counts": server,
            "answered_wall_s": {q: percentile([o.wall_s for o in answered], p)
                                for q, p in (("p50", .5), ("p95", .95), ("p99", .99))},
        }, indent=2))
    return 0 if ok else 1


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "40", "--clients", "8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--key", default=None, help="API key for --url")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--inflight", type=int, default=4, help="calls at once per instance")
    p.add_argument("--latency", type=float, default=0.02, help="scripted seconds per call")
    p.add_argument("--max-active", type=int, default=12,
                   help="the scheduler's admission bound (queries in progress)")
    p.add_argument("--policy", default="flowsage")
    p.add_argument("--pipeline", default="chess")
    p.add_argument("--slo", type=float, default=5.0)
    p.add_argument("--retries", type=int, default=0,
                   help="times a client re-sends after a 429, honouring Retry-After")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", default=None, help="also write the numbers to this file")
    args = p.parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        proc, url, _ = start_server(args)
    try:
        run = asyncio.run(drive(url, args))
        server = server_counts(url, args.key)
    finally:
        if proc is not None:
            stop_server(proc, 30)
    return report(run, server, args)


if __name__ == "__main__":
    sys.exit(main())
