"""Simulated LLM calls per CPU-second at fleet size, and whether it holds as a run grows.

    agentflow bench sim_speed [--cluster hetero-1024] [--queries 500,5000] [--rate 80]
        [--policy flowsage] [--trace trace2.json] [--seed 0] [--profile FILE]
        [--digest] [--window CALLS] [--compiled]

Replays ``--queries`` queries of a HexGen-Flow trace (trace2 by default: not the trace the
policies were tuned on) arriving at ``--rate`` queries/s on ``--cluster`` (a name or a
cluster file) under one policy, as ``agentflow simulate`` does, and prints for each run
length the calls simulated, the CPU seconds of the replay alone (``time.process_time``; the
workload is built outside the timing) and their ratio, then the ratio of the longest run's
rate to the shortest's (1.0: flat in run length). CPU time, not wall time, so a machine
shared with other jobs inflates it less. ``--profile FILE`` writes a cProfile of the last
run (``python -m pstats FILE``). ``--digest`` adds a hash of every query's record (id,
status, finish time to the last float, calls, reason) per run: two checkouts (before and
after a speed-up) must print the same one, so the speed is compared on identical results.
``--window CALLS`` also prints, for the longest run, the calls/CPU-s of each window of
``CALLS`` finished calls with the simulated time and the queries and calls in flight at its
end: whether the rate holds along one run (a cost that grows with the run shows as a
falling rate at a steady load) rather than between runs of different lengths, which load
the fleet differently (a 500-query run is mostly ramp and drain). Each window is printed
as it closes, with the run's CPU seconds and calls/CPU-s so far, so a long run stopped
before its end (a 50k-query run is tens of CPU-minutes) still reports. The simulator is what
proves policies at fleet size: a day of traffic (100k queries, ~1.9M calls) must replay in
minutes, not hours. ``--compiled`` runs the same command on the mypyc-compiled copy of the hot
modules (``agentflow.compiled``, built into its cache first when the sources changed); the
header line says which ran, and ``--digest`` shows the records are the same.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.sim.cluster import load_cluster
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import build_workload, run_policy
from agentflow.sim.workload import load_trace


@dataclass(frozen=True)
class Window:
    """One window of finished calls along a run (``--window``)."""

    calls: int  # finished calls at its end
    rate: float  # calls finished in it per CPU-second
    sim_s: float  # simulated time at its end
    queries: int  # queries in flight then
    running: int  # calls in flight then (waiting or running)


class _WindowClock:
    """A coordinator observer: every ``size`` finished calls, the CPU seconds since the
    last window and what is in flight (the observer sees events; it changes none)."""

    def __init__(self, sim: Simulation, size: int,
                 on_window: Callable[[Window, float], None] | None = None):
        if size < 1:
            raise ValueError(f"a window is at least one call, not {size}")
        self.sim, self.size = sim, size
        self.on_window = on_window
        self.done = 0
        self.windows: list[Window] = []
        self._start = self._since = time.process_time()

    def event_started(self, event: str) -> None:
        pass

    def event_finished(self, event: str, decisions: list) -> None:
        if event != "on_call_done":
            return
        self.done += 1
        if self.done % self.size == 0:
            now = time.process_time()
            sim = self.sim
            self.windows.append(Window(self.done, self.size / max(now - self._since, 1e-9),
                                       sim.clock.now(), sim.pending_queries,
                                       len(sim._calls)))
            if self.on_window is not None:  # as it closes: a run cut short still reports
                self.on_window(self.windows[-1], now - self._start)
            self._since = time.process_time()


def replay(cluster_name: str, trace_path: Path, queries: int, rate: float, policy: str,
           seed: int = 0, profile: cProfile.Profile | None = None,
           windows: list[Window] | None = None, window: int = 5000,
           on_window: Callable[[Window, float], None] | None = None
           ) -> tuple[int, float, int, str]:
    """(calls simulated, CPU seconds of the replay, queries done, records digest) of one
    run; ``windows``: a list to append the run's windows of ``window`` finished calls to
    (then the run is made as ``run_policy`` makes it, with an observer added), each also
    handed to ``on_window`` with the run's CPU seconds so far as it closes."""
    cluster = load_cluster(cluster_name)
    workload = build_workload(load_trace(trace_path), cluster, n=queries, rate=rate, seed=seed)
    start = time.process_time()
    if profile is not None:
        profile.enable()
    if windows is None:
        result = run_policy(cluster, workload, policy)
    else:  # run_policy's run, with the window clock watching the coordinator
        sim = Simulation(cluster, policy)
        clock = _WindowClock(sim, window, on_window)
        sim.coordinator.add_observer(clock)
        result = sim.run(workload.queries, workload.arrivals, workload.deadlines(2.0),
                         workload.idle_latency_s)
        windows += clock.windows
    if profile is not None:
        profile.disable()
    cpu = time.process_time() - start
    calls = sum(r.calls for r in result.records)
    done = sum(1 for r in result.records if r.status == "done")
    rows = [(r.id, r.status, r.finish, r.calls, r.reason) for r in result.records]
    return calls, cpu, done, hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--cluster", "hetero-64", "--queries", "40,80", "--rate", "6")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", default="hetero-1024", help="a cluster name or file")
    p.add_argument("--queries", default="500,5000", help="run lengths, comma-separated")
    p.add_argument("--rate", type=float, default=80.0, help="arrivals, queries/s")
    p.add_argument("--policy", default="flowsage")
    p.add_argument("--trace", help="default: the shared trace2, else the demo trace that ships")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", metavar="FILE", help="write a cProfile of the last run")
    p.add_argument("--digest", action="store_true",
                   help="print a hash of each run's query records (compare checkouts)")
    p.add_argument("--window", type=int, metavar="CALLS",
                   help="the longest run's calls/CPU-s per window of CALLS finished calls")
    p.add_argument("--compiled", action="store_true",
                   help="run on the mypyc-compiled copy of the hot modules "
                        "(agentflow.compiled; built into its cache first if needed)")
    args = p.parse_args(argv)
    if args.compiled:  # the same run in a child whose hot modules are the compiled copy
        from agentflow import compiled

        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--compiled"]
        try:
            raise SystemExit(compiled.run_module("agentflow.bench.scheduler.sim_speed", rest))
        except compiled.CompileError as err:
            raise SystemExit(f"sim_speed --compiled: {err}") from None
    trace = Path(args.trace) if args.trace else HEXGEN_TRACES / "trace2.json"
    if args.trace is None and not trace.is_file():  # a fresh clone has no ../shared
        from agentflow.datasets.demo import TRACE_FILE

        print(f"no shared trace at {trace}: replaying the demo trace that ships, {TRACE_FILE}")
        trace = TRACE_FILE
    if not trace.is_file():
        raise SystemExit(f"no trace at {trace} (the shared traces: AGENTFLOW_SHARED)")
    lengths = [int(n) for n in args.queries.split(",")]
    n_inst = len(load_cluster(args.cluster).expanded())
    print(f"{args.policy} on {args.cluster} ({n_inst} instances), {trace.name} at "
          f"{args.rate:g} q/s" + _build_note())
    print(f"{'queries':>9} {'done':>7} {'calls':>9} {'CPU s':>9} {'calls/CPU-s':>12} "
          f"{'queries/CPU-s':>14}")
    rates = []
    for i, n in enumerate(lengths):
        last = i == len(lengths) - 1
        prof = cProfile.Profile() if args.profile and last else None
        windows: list[Window] | None = [] if args.window and last else None
        if windows is not None:  # printed as each closes: a long run cut short still says
            print(f"  per window of {args.window} finished calls ({n} queries), as they "
                  f"close:")
            print(f"  {'calls':>9} {'calls/CPU-s':>12} {'sim s':>8} {'queries':>8} "
                  f"{'in flight':>10} {'CPU s':>9} {'so far':>8}", flush=True)
        calls, cpu, done, digest = replay(args.cluster, trace, n, args.rate, args.policy,
                                          args.seed, prof, windows, args.window or 1,
                                          _print_window)
        rates.append(calls / cpu)
        print(f"{n:>9} {done:>7} {calls:>9} {cpu:>9.1f} {calls / cpu:>12.0f} "
              f"{n / cpu:>14.1f}" + (f"  records {digest}" if args.digest else ""),
              flush=True)
        if prof is not None:
            prof.dump_stats(args.profile)
        if windows:
            rates_w = sorted(w.rate for w in windows)
            print(f"  last window over the first: {windows[-1].rate / windows[0].rate:.2f}; "
                  f"median {rates_w[len(rates_w) // 2]:.0f} calls/CPU-s", flush=True)
    if len(rates) > 1:
        print(f"calls/CPU-s at {lengths[-1]} over at {lengths[0]} queries: "
              f"{rates[-1] / rates[0]:.2f}")


def _build_note() -> str:
    """``, compiled (N modules)`` when this process runs on the compiled copy."""
    from agentflow import compiled

    if compiled.active() is None:
        return ", pure Python"
    return f", compiled ({len(compiled.compiled_modules())} modules)"


def _print_window(w: Window, cpu_s: float) -> None:
    """One ``--window`` row: the window's rate, and the run's so far (calls / CPU s)."""
    print(f"  {w.calls:>9} {w.rate:>12.0f} {w.sim_s:>8.1f} {w.queries:>8} {w.running:>10} "
          f"{cpu_s:>9.1f} {w.calls / max(cpu_s, 1e-9):>8.0f}", flush=True)


if __name__ == "__main__":
    main()
