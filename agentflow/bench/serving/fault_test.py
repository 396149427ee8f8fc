"""Fault benchmark: the real HTTP server on loopback with one misbehaving instance.

    agentflow bench fault_test [--queries 200] [--clients 20] [--scenarios healthy,hang]

Each scenario starts ``serve.py`` (as ``load_test.py`` does) with two *scripted* instances
(NOT models: canned SQL, ``--latency`` seconds per call) and scripts a fault on the second:

    healthy  no fault (the reference run)
    hang     every call takes 1,000 s (the issue's case: it never finished a call)
    hang-mid from its 40th call on, every call takes 1,000 s
    errors   from its 40th call on, every call fails with a non-retryable error
    dies     between 1 s and 3 s after its first call every call fails (retryable: the
             instance is gone), then it answers again
    slow     from its 100th call on, every call takes 10x longer

Clients send ``wait=true`` queries and honour 429 + Retry-After. Per scenario the table
shows queries by outcome (lost: no answer; hung: no answer within ``--timeout``), client
latency, what the server did (calls timed out, re-dispatched, instance outages and probes,
from ``/metrics``), and whether the client's and the server's query counts agree. Exit
status 1 if a query is lost or hung, a query failed although the healthy instance could
serve it, counts disagree, or the P99 under ``hang`` is over 3x the healthy run's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter

import httpx

from agentflow.bench.serving.load_test import drive, percentile, server_counts, start_server
from agentflow.bench.serving.served import stop_server
from agentflow.server.testing import metric_sum

SCENARIOS: dict[str, dict[int, list[dict]]] = {
    "healthy": {},
    "hang": {1: [{"latency_s": 1000}]},
    "hang-mid": {1: [{"after_calls": 40, "latency_s": 1000}]},
    "errors": {1: [{"after_calls": 40, "fail": True, "retryable": False}]},
    "dies": {1: [{"from_s": 1.0, "until_s": 3.0, "fail": True, "retryable": True}]},
    "slow": {1: [{"after_calls": 100, "slowdown": 10}]},
}
# The same for every scenario: probe an instance out of service after 0.5 s, at most 2 s
# apart (the defaults, 1 s and 30 s, suit real clusters, not a run of a few seconds).
SCHEDULER = {"revive_after_s": 2.0, "health": {"probe_after_s": 0.5}}


def run_scenario(name: str, args: argparse.Namespace) -> dict:
    proc, url, _ = start_server(args, SCENARIOS[name], SCHEDULER)
    try:
        run = asyncio.run(drive(url, args))
        server = server_counts(url, None)
        text = httpx.get(f"{url}/metrics", timeout=10).text
    finally:
        stop_server(proc, 30)
    by = Counter(o.kind for o in run.outcomes)
    answered = [o for o in run.outcomes if o.kind in ("done", "unsure", "failed", "cancelled")]
    walls = [o.wall_s for o in answered]
    server_total = sum(v for k, v in server.items()
                       if k in ("done", "unsure", "failed", "cancelled", "rejected"))
    client_total = sum(o.attempts for o in run.outcomes
                       if o.kind not in ("lost", "error", "hung"))
    agree = (server_total == client_total
             and all(server.get(k, 0) == by.get(k, 0) for k in ("done", "failed")))
    return {
        "name": name, "elapsed": run.finished - run.started, "by": by,
        "p50": percentile(walls, 0.5), "p99": percentile(walls, 0.99),
        "max": max(walls) if walls else float("nan"),
        "rerun": sum(o.retries_on_instances for o in answered),
        "timeouts": metric_sum(text, "agentflow_llm_call_timeouts_total"),
        "retried": metric_sum(text, "agentflow_llm_call_retries_total"),
        "outages": metric_sum(text, "agentflow_instance_outages_total"),
        "probes_ok": metric_sum(text, "agentflow_instance_probes_total", result="ok"),
        "probes_failed": metric_sum(text, "agentflow_instance_probes_total", result="failed"),
        "agree": agree, "server_total": server_total, "client_total": client_total,
        "reasons": Counter(o.reason[:120] for o in run.outcomes
                           if o.kind in ("failed", "error", "hung", "lost")),
    }


def report(results: list[dict], args: argparse.Namespace) -> int:
    print(f"\n{args.queries} queries x {args.clients} clients per scenario; 2 scripted "
          f"instances (NOT models), {args.latency * 1000:g} ms per call, max_inflight "
          f"{args.inflight}; the fault is on scripted-1")
    head = (f"{'scenario':<9}{'done':>6}{'failed':>7}{'lost':>5}{'hung':>5}{'p50 s':>8}"
            f"{'p99 s':>8}{'max s':>8}{'p99/ok':>7}{'re-run':>7}{'t/o':>5}{'moved':>6}"
            f"{'outage':>7}{'probes':>8}{'agree':>6}")
    print("\n" + head + "\n" + "-" * len(head))
    base = next((r["p99"] for r in results if r["name"] == "healthy"), None)
    ok = True
    for r in results:
        by = r["by"]
        ratio = r["p99"] / base if base else float("nan")
        print(f"{r['name']:<9}{by.get('done', 0):>6}{by.get('failed', 0):>7}"
              f"{by.get('lost', 0) + by.get('error', 0):>5}{by.get('hung', 0):>5}"
              f"{r['p50']:>8.2f}{r['p99']:>8.2f}{r['max']:>8.2f}{ratio:>7.2f}{r['rerun']:>7}"
              f"{r['timeouts']:>5.0f}{r['retried']:>6.0f}{r['outages']:>7.0f}"
              f"{r['probes_ok']:>4.0f}/{r['probes_failed']:<3.0f}"
              f"{'yes' if r['agree'] else 'NO':>6}")
        bad = by.get("lost", 0) + by.get("error", 0) + by.get("hung", 0) + by.get("failed", 0)
        if bad or not r["agree"] or sum(by.values()) != args.queries:
            ok = False
        if r["name"].startswith("hang") and base and ratio > 3:
            ok = False
        for reason, n in r["reasons"].most_common(2):
            print(f"    x{n}: {reason}")
    print("\ncolumns: p99/ok = P99 client latency over the healthy run's; re-run = failed "
          "attempts the answers show re-run on another instance; t/o = calls cut off at "
          "their deadline or stalled; moved = calls re-dispatched (timed out, failed, or "
          "moved off an instance taken out); outage = times an instance was taken out; "
          "probes = ok/failed; agree = client and /metrics query counts match")
    print("OK: nothing lost, hung or failed; counts agree; P99 under hang within 3x healthy"
          if ok else "PROBLEM: see the table")
    return 0 if ok else 1


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "40", "--clients", "8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--inflight", type=int, default=4)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--max-active", type=int, default=40)
    p.add_argument("--retries", type=int, default=1000,
                   help="times a client re-sends after a 429, honouring Retry-After")
    p.add_argument("--timeout", type=float, default=60.0, help="client timeout: 'hung'")
    p.add_argument("--policy", default="flowsage")
    p.add_argument("--pipeline", default="chess")
    p.add_argument("--slo", type=float, default=5.0)
    args = p.parse_args(argv)
    args.instances, args.url, args.key = 2, None, None
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    results = []
    for name in names:
        print(f"running {name} ...", flush=True)
        results.append(run_scenario(name, args))
    return report(results, args)


if __name__ == "__main__":
    sys.exit(main())
