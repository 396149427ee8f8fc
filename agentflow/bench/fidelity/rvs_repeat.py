"""How far two real replays of the same arrivals are from each other: the floor under
``real_vs_sim``'s error.

    agentflow bench rvs_repeat RUN1.json RUN2.json [RUN3.json ...]

Why: ``real_vs_sim`` compares one deterministic simulation with one real run. The real run
is itself one draw: on a shared VM the cores' speed drifts from one minute to the next, and
in a continuous-batching engine a few percent of drift changes which calls meet in a batch,
which prompt's prefill a decode waits behind (a 1,200-token prompt stalls every decoding
slot of its server for seconds on one CPU core), and so the order the rest of a query's
chain runs in. No simulator can predict one draw closer than a second draw of the same
arrivals predicts it, so the useful question is how the simulator's error compares with the
real side's own repeat error, measured the same way.

Input: ``--json`` files that ``real_vs_sim.py`` wrote for the same workload (trace, rate,
queries, scale, seed, assignment: checked; the call ids must match). Take them from one
commit, back to back: runs of different code or cluster files differ for other reasons too
(pairs across cluster files are printed but left out of the summary).

For every ordered pair (A as the reference, B in the simulator's place) the same two figures
``real_vs_sim`` prints, on the real latencies only: the median over calls of
``|B - A| / A`` and the 95th percentile over queries of the same for end-to-end latency;
beside them each run's own simulator error (its headline: the calibrate-first figures when
the run had them, else the stored profile's). The last two lines are the medians over the
pairs: ``repeat error, median per call: X`` and ``repeat error, P95 per query: Y``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# real_vs_sim arguments that define the workload both runs replayed
WORKLOAD_KEYS = ("trace", "rate", "queries", "skip", "scale", "max_prompt", "max_output",
                 "assign", "seed")


@dataclass(frozen=True)
class Run:
    """One saved real_vs_sim run: its real latencies and its own simulator error."""

    path: str
    cluster: str
    call_ids: tuple[str, ...]
    call_real_s: np.ndarray
    query_real_s: np.ndarray
    sim_median_call: float
    sim_p95_query: float

    @classmethod
    def load(cls, path: str, saved: dict[str, Any]) -> Run:
        try:
            ids = tuple(c["id"] for c in saved["calls"])
            calls = np.asarray(saved["call_real_s"], dtype=float)
            queries = np.asarray(saved["query_real_s"], dtype=float)
            headline = saved.get("calibrate_first", {}).get("figures") or saved
            sim = (float(headline["median_call_error"]), float(headline["p95_query_error"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a real_vs_sim --json file (missing {exc})") from None
        if len(ids) != len(calls) or not len(queries):
            raise ValueError(f"{path}: {len(ids)} call records for {len(calls)} call "
                             f"latencies and {len(queries)} queries")
        if np.any(calls <= 0) or np.any(queries <= 0):
            raise ValueError(f"{path}: a real latency is not positive")
        return cls(path, str(saved.get("args", {}).get("cluster")), ids, calls, queries, *sim)


def load_runs(paths: list[str]) -> list[Run]:
    """The runs, checked to be replays of one workload."""
    if len(paths) < 2:
        raise ValueError("need at least two runs of the same workload")
    saved = {}
    for p in paths:
        try:
            saved[p] = json.loads(Path(p).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{p}: {exc}") from None
    first = paths[0]
    for p in paths[1:]:
        for key in WORKLOAD_KEYS:
            a, b = saved[first].get("args", {}).get(key), saved[p].get("args", {}).get(key)
            if a != b:
                raise ValueError(f"{p} replayed another workload than {first}: {key} {b!r} "
                                 f"vs {a!r}")
    runs = [Run.load(p, saved[p]) for p in paths]
    for r in runs[1:]:
        if r.call_ids != runs[0].call_ids:
            raise ValueError(f"{r.path}: its calls are not {runs[0].path}'s")
    return runs


def repeat_error(reference: Run, other: Run) -> tuple[float, float]:
    """``other``'s real latencies in the simulator's place against ``reference``'s: median
    per call, P95 per query (``real_vs_sim``'s two figures)."""
    call = np.abs(other.call_real_s - reference.call_real_s) / reference.call_real_s
    query = np.abs(other.query_real_s - reference.query_real_s) / reference.query_real_s
    return float(np.median(call)), float(np.percentile(query, 95))


def summarise(runs: list[Run]) -> dict[str, Any]:
    pairs = []
    for a, b in itertools.permutations(runs, 2):
        median, p95 = repeat_error(a, b)
        pairs.append({"reference": a.path, "other": b.path, "same_cluster": a.cluster == b.cluster,
                      "median_call_error": median, "p95_query_error": p95})
    same = [p for p in pairs if p["same_cluster"]]
    out: dict[str, Any] = {
        "pairs": pairs,
        "sim": [{"run": r.path, "median_call_error": r.sim_median_call,
                 "p95_query_error": r.sim_p95_query} for r in runs]}
    if same:
        out["repeat_median_call_error"] = float(np.median([p["median_call_error"] for p in same]))
        out["repeat_p95_query_error"] = float(np.median([p["p95_query_error"] for p in same]))
    return out


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="real_vs_sim --json files of one workload")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    try:
        runs = load_runs(args.runs)
    except ValueError as exc:
        ap.error(str(exc))
    out = summarise(runs)
    name = {r.path: f"run{i + 1}" for i, r in enumerate(runs)}
    for r in runs:
        print(f"{name[r.path]}: {r.path} (cluster {r.cluster}); its simulator: median per call "
              f"{r.sim_median_call:.3f}, P95 per query {r.sim_p95_query:.3f}")
    print(f"{'reference':>9} {'other':>6} {'median/call':>11} {'P95/query':>9}")
    for p in out["pairs"]:
        note = "" if p["same_cluster"] else "  (other cluster file: not in the summary)"
        print(f"{name[p['reference']]:>9} {name[p['other']]:>6} {p['median_call_error']:11.3f} "
              f"{p['p95_query_error']:9.3f}{note}")
    sims = out["sim"]
    print(f"simulator, median over the runs: median per call "
          f"{np.median([s['median_call_error'] for s in sims]):.4f}, P95 per query "
          f"{np.median([s['p95_query_error'] for s in sims]):.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if "repeat_median_call_error" not in out:
        print("no two runs share a cluster file: no repeat error")
        return
    print(f"repeat error, median per call: {out['repeat_median_call_error']:.4f}")
    print(f"repeat error, P95 per query: {out['repeat_p95_query_error']:.4f}")


if __name__ == "__main__":
    main()
