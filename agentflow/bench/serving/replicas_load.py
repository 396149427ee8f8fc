"""Does a second replica double what one host serves? load_test against 1 and 2 replicas.

    agentflow bench replicas_load [--queries 200] [--clients 16] [--replicas 1,2]
    agentflow bench replicas_load --quick          # 60 queries, 8 clients
    agentflow bench replicas_load --rounds 5       # pairs 1,2,1,2,...: the median ratio

Each run starts ``serve.py --replicas N`` on a free loopback port with its own state store
file and *scripted* instances (NOT a model: canned SQL, ``--latency`` seconds per call, as
load_test), then drives it with load_test's clients (``wait=true``, new connections spread by
the kernel over the replicas). With N > 1 every replica submits its calls to one scheduler
process (``--scheduler-per-replica``: each its own, as before). Printed per N, side by side
in one run: answered queries/s, errors, the server's CPU per answered query (every process
of the server, read from ``/proc``), each replica's own CPU per query it answered, the
scheduler process's CPU per query, and how many of the host's cores the server kept busy
(CPU seconds / wall seconds). The scripted latency is kept low so that one replica is
CPU-bound, which is what this measures. The clients run on the same machine and take CPU
too (their CPU per query is printed); on a shared machine the ratio is a floor.

``--against PATH`` compares this checkout's server with another checkout's (a "before"
worktree): server CPU per query in interleaved pairs, ``--pairs K``, at the first ``--replicas``
count; ``--profile DIR`` profiles one server on every thread (``cpu_ab``).

A shared machine's load moves between runs, so ``--rounds K`` runs the configurations in
turn (1, 2, 1, 2, ...) and prints the median of the per-round ratios, each round's ratio
and the 1-minute load average at each run. The CPU figures hold under any load; the
queries/s ratio is what the load leaves. ``--baseline`` adds one replica with ``--state
off`` (everything in the process, as before the store): the store's own cost.
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


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux: ``/proc/PID/task/*/children``)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def replica_pids(state: Path) -> dict[str, int]:
    """Replica id -> its process id, from the store's heartbeat table."""
    from agentflow.state import open_store

    store = open_store(state)
    try:
        with store._tx(write=False) as q:
            rows = q("SELECT id, info FROM af_replicas")
    finally:
        store.close()
    return {rid: int(info.split()[1]) for rid, info in rows if info.startswith("pid ")}


def answered_by(state: Path, since: float) -> dict[str, int]:
    """Queries created after ``since`` and answered, by the replica that answered them."""
    from agentflow.state import open_store

    store = open_store(state)
    try:
        with store._tx(write=False) as q:
            rows = q("SELECT owner, count(*) FROM af_queries WHERE created >= ? AND "
                     "finished IS NOT NULL GROUP BY owner", since)
    finally:
        store.close()
    return {owner: n for owner, n in rows}


def one(n: int, args: argparse.Namespace, *, state: bool = True, root: Path | None = None,
        launcher: tuple[str, ...] = ()) -> dict[str, Any]:
    """One run of ``n`` replicas; ``root``: the checkout whose server runs (this one by
    default), ``launcher``: see ``served.serve``."""
    from agentflow.bench.serving.load_test import SQL, drive
    from agentflow.bench.serving.served import ROOT

    instances = [{"name": f"scripted-{i}", "max_inflight": args.inflight,
                  "backend": {"type": "scripted", "name": f"scripted-{i}",
                              "answers": {"extract_keywords": "stores"}, "default": SQL,
                              "latency_s": args.latency}} for i in range(args.instances)]
    config = {"fewshot": None, "pipeline": args.pipeline, "slo_s": args.slo,
              "instances": instances, "scheduler": {"max_active_queries": 200},
              "server": {"drain_s": 5}}
    extra = ["--replicas", str(n), *(() if state else ("--state", "off"))]
    if args.scheduler_per_replica:
        extra.append("--scheduler-per-replica")
    # its own session: one replica gets the CPU share each of N replicas gets (supervisor)
    proc, url, path = serve(config, prefix="agentflow-replicas-", start_timeout_s=180,
                            extra_args=extra, new_session=True, root=root or ROOT,
                            launcher=launcher)
    store_path = path.parent / "state.sqlite"
    try:
        if state:
            wait_replicas(store_path, n)
        drive_args = argparse.Namespace(queries=args.queries, clients=args.clients,
                                        timeout=args.timeout, key=None, retries=3,
                                        fresh_connections=args.fresh_connections,
                                        lean_client=not args.httpx)
        asyncio.run(drive(url, argparse.Namespace(**{**vars(drive_args), "queries":
                                                     min(10, args.queries)})))  # warm-up
        pids = replica_pids(store_path) if state else {"": proc.pid}
        sched = [c for c in children(proc.pid)
                 if "agentflow.distributed.shard_socket" in cmdline(c)]
        load = os.getloadavg()[0]
        since = time.time()
        before = tree_cpu_s(proc.pid)
        each_before = {rid: tree_cpu_s(pid) for rid, pid in pids.items()}
        sched_before = sum(tree_cpu_s(c) for c in sched)
        client_before = self_cpu_s()
        run = asyncio.run(drive(url, drive_args))
        client = self_cpu_s() - client_before
        cpu = tree_cpu_s(proc.pid) - before
        each = {rid: tree_cpu_s(pid) - each_before[rid] for rid, pid in pids.items()}
        sched_cpu = sum(tree_cpu_s(c) for c in sched) - sched_before
        served = answered_by(store_path, since) if state else {"": len(run.outcomes)}
    finally:
        stop_server(proc, 60)
    answered = [o for o in run.outcomes if o.kind == "done"]
    elapsed = run.finished - run.started
    per_replica = sorted(1000 * each[rid] / served[rid] for rid in each if served.get(rid))
    return {"replicas": n if state else f"{n}, no store", "answered": len(answered),
            "queries": len(run.outcomes),
            "errors": sum(o.kind != "done" for o in run.outcomes),
            "qps": len(answered) / elapsed if elapsed > 0 else float("nan"),
            "cpu_ms_per_query": 1000 * cpu / max(1, len(answered)), "elapsed_s": elapsed,
            "replica_ms_per_query": per_replica,
            "split": sorted(served.values(), reverse=True),
            "scheduler_ms_per_query": 1000 * sched_cpu / max(1, len(answered)),
            "client_ms_per_query": 1000 * client / max(1, len(answered)),
            "cores_busy": cpu / elapsed if elapsed > 0 else float("nan"), "load": load}


def median_run(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's rounds as one row: medians of the rates, sums of the counts."""
    row = dict(rounds[0])
    for key in ("qps", "cpu_ms_per_query", "elapsed_s", "scheduler_ms_per_query",
                "client_ms_per_query", "cores_busy", "load"):
        row[key] = statistics.median(r[key] for r in rounds)
    for key in ("answered", "queries", "errors"):
        row[key] = sum(r[key] for r in rounds)
    row["split"] = [sum(n) for n in zip(*(r["split"] for r in rounds))]
    row["replica_ms_per_query"] = [statistics.median(ms) for ms in zip(
        *(r["replica_ms_per_query"] for r in rounds if r["replica_ms_per_query"]))]
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
    p.add_argument("--scheduler-per-replica", action="store_true",
                   help="each replica its own coordinator (serve --scheduler-per-replica)")
    p.add_argument("--fresh-connections", action="store_true",
                   help="a new connection per query (no keep-alive): the kernel spreads "
                        "connections over the replicas, so a few kept-alive ones can pin "
                        "most clients to one replica")
    p.add_argument("--httpx", action="store_true",
                   help="drive the server with httpx (load_test's client) instead of the "
                        "lean HTTP/1.1 client, which takes less of the cores the server "
                        "is measured on")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every configuration this many times, in turn; medians")
    p.add_argument("--against", metavar="PATH",
                   help="another checkout (a 'before' worktree): server CPU per query of "
                        "this checkout's server against its, in interleaved pairs, at the "
                        "first --replicas count, a connection per query")
    p.add_argument("--pairs", type=int, default=4, help="with --against: pairs to run")
    p.add_argument("--profile", metavar="DIR",
                   help="profile this checkout's server (cProfile on every thread, pstats "
                        "files in DIR) at the first --replicas count, instead")
    p.add_argument("--top", type=int, default=40, help="with --profile: rows printed")
    args = p.parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",") if x.strip()]
    if args.against or args.profile:
        from agentflow.bench.serving import cpu_ab

        args.ab_replicas = counts[0]
        if args.profile:
            return cpu_ab.profile(args, one)
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
        return cpu_ab.report(cpu_ab.pairs(args, one), args)
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
          f"instances (NOT a model: {args.instances} x {args.latency * 1000:g} ms per call); "
          f"scheduler {'per replica' if args.scheduler_per_replica else 'shared'}; machine: "
          f"{os.cpu_count()} CPUs; client {'httpx' if args.httpx else 'lean HTTP/1.1'}"
          f"{', a connection per query' if args.fresh_connections else ''}; medians over "
          f"{max(1, args.rounds)} round(s)")
    print(f"{'replicas':>14} {'answered':>9} {'errors':>7} {'queries/s':>10} {'ratio':>6} "
          f"{'CPU ms/q':>9} {'ratio':>6} {'per replica':>14} {'split':>9} {'sched':>6} "
          f"{'client':>7} {'cores':>6} {'load':>5}")
    for r in results:
        each = "/".join(f"{ms:.0f}" for ms in r["replica_ms_per_query"]) or "-"
        split = "/".join(str(n) for n in r["split"]) if len(r["split"]) > 1 else "-"
        print(f"{r['replicas']!s:>14} {r['answered']:>9} {r['errors']:>7} {r['qps']:>10.1f} "
              f"{r['qps'] / base['qps']:>6.2f} {r['cpu_ms_per_query']:>9.1f} "
              f"{r['cpu_ms_per_query'] / base['cpu_ms_per_query']:>6.2f} {each:>14} "
              f"{split:>9} {r['scheduler_ms_per_query']:>6.1f} "
              f"{r['client_ms_per_query']:>7.1f} {r['cores_busy']:>6.2f} {r['load']:>5.1f}")
    print("  CPU ms/q: every server process; per replica: each replica's CPU per query it "
          "answered; split: queries each replica answered (the kernel spreads the clients' "
          "connections, not their requests); sched: the scheduler process; client: this "
          "load generator; cores: server CPU s per wall s; load: 1-min load average")
    if args.rounds > 1:
        for i, ((n, state), rs) in enumerate(zip(plan, runs)):
            label = n if state else f"{n}, no store"
            line = (f"  round by round, {label}: queries/s "
                    + ", ".join(f"{r['qps']:.1f}" for r in rs) + "; load "
                    + ", ".join(f"{r['load']:.1f}" for r in rs))
            if any(len(r["split"]) > 1 for r in rs):
                line += "; split " + ", ".join("/".join(map(str, r["split"])) for r in rs)
            if i:  # each round's ratio to the first configuration's run of that round
                ratios = [r["qps"] / b["qps"] for r, b in zip(rs, runs[0])]
                line += ("; ratio: " + ", ".join(f"{x:.2f}" for x in ratios)
                         + f" (median {statistics.median(ratios):.2f})")
            print(line)
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
