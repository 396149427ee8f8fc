"""``replicas_load --against`` and ``--profile``: server CPU per query of this checkout against
another in interleaved pairs, and a profile of one server.

    agentflow bench replicas_load --against /work/wt/before [--pairs 4] [--replicas 1]
    agentflow bench replicas_load --profile DIR [--top 40]   # where one server's CPU goes

On a shared machine an absolute CPU figure moves with the load (caches, frequency, other
processes' cache traffic), so a change is judged by a ratio: the same ``replicas_load`` run
(scripted instances, NOT a model; a connection per query) is made with this checkout's server
and with the ``--against`` checkout's server, in pairs whose order alternates (A B, B A, ...),
and the median of the per-pair ratios of server CPU per answered query is printed beside each
side's median. The benchmark's own client and code are this checkout's in both runs; only the
server differs.

``--profile DIR`` runs this checkout's server once under ``thread_profile`` (cProfile on every
thread: the engine loop and the SQL worker threads are not the main thread) and prints the
functions with the most own time and the most cumulative time, merged over threads; the
pstats files stay in DIR.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

# replicas_load.one, passed in (this module is its helper and does not import it back)
Run = Callable[..., dict[str, Any]]

HERE = Path(__file__).resolve().parent


def run_args(args: argparse.Namespace) -> argparse.Namespace:
    """``replicas_load``'s arguments, with a connection per query (the kernel spreads
    connections, not requests, over replicas)."""
    return argparse.Namespace(**{**vars(args), "fresh_connections": True})


def pairs(args: argparse.Namespace, one: Run) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``args.pairs`` interleaved (before, after) runs of ``one`` (``replicas_load.one``)."""

    against = Path(args.against).resolve()
    if not (against / "serve.py").exists():
        raise SystemExit(f"--against {against}: no serve.py there")
    out = []
    for i in range(args.pairs):
        order = [("after", None), ("before", against)]
        if i % 2:
            order.reverse()
        got: dict[str, dict[str, Any]] = {}
        for label, root in order:
            got[label] = one(args.ab_replicas, run_args(args), root=root)
            r = got[label]
            print(f"  pair {i + 1} {label:>6}: {r['cpu_ms_per_query']:.1f} ms/q, "
                  f"{r['answered']}/{r['queries']} answered, {r['errors']} errors, "
                  f"load {r['load']:.1f}", flush=True)
        out.append((got["before"], got["after"]))
    return out


def report(done: list[tuple[dict[str, Any], dict[str, Any]]], args: argparse.Namespace) -> int:
    def med(side: int, key: str) -> float:
        return statistics.median(p[side][key] for p in done)

    ratios = [a["cpu_ms_per_query"] / b["cpu_ms_per_query"] for b, a in done]
    print(f"\n{args.queries} {args.pipeline} queries, {args.clients} clients, "
          f"--replicas {args.ab_replicas}, scripted instances (NOT a model: {args.instances} x "
          f"{args.latency * 1000:g} ms per call), a connection per query; {len(done)} "
          f"interleaved pairs; before = {Path(args.against).resolve()}")
    print(f"{'':>8} {'CPU ms/q':>9} {'sched ms/q':>11} {'queries/s':>10} {'errors':>7}")
    for side, label in ((0, "before"), (1, "after")):
        print(f"{label:>8} {med(side, 'cpu_ms_per_query'):>9.1f} "
              f"{med(side, 'scheduler_ms_per_query'):>11.1f} {med(side, 'qps'):>10.1f} "
              f"{sum(p[side]['errors'] for p in done):>7}")
    print("after/before CPU per query, pair by pair: "
          + ", ".join(f"{x:.3f}" for x in ratios)
          + f"; median {statistics.median(ratios):.3f}")
    print("load (1-min) at each run: " + ", ".join(
        f"{b['load']:.1f}/{a['load']:.1f}" for b, a in done) + " (before/after)")
    return 0 if all(p[s]["errors"] == 0 for p in done for s in (0, 1)) else 1


def profile(args: argparse.Namespace, one: Run) -> int:
    import pstats


    out = Path(args.profile).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("thread-*.prof"):
        old.unlink()
    r = one(args.ab_replicas, run_args(args),
            launcher=(str(HERE / "thread_profile.py"), str(out)))
    files = sorted(str(p) for p in out.glob("thread-*.prof") if p.stat().st_size)
    if not files:
        raise SystemExit(f"no profile was written to {out}")
    stats = pstats.Stats(*files)
    print(f"{r['answered']} queries answered; server CPU {r['cpu_ms_per_query']:.1f} ms/q "
          f"under the profiler (cProfile slows Python code ~1.5-2x, unevenly); "
          f"{len(files)} thread profiles in {out}")
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    return 0
