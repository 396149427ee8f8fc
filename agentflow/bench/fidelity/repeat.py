"""How far two real replays of the same arrivals are from each other, speed-matched as the
simulator is, and the sqrt(2) floor that puts under ``real_vs_sim``'s error.

    agentflow bench real_vs_sim --repeat RUN1.json RUN2.json [RUN3.json ...] [--json OUT]

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

For every ordered pair (A as the reference, B in the simulator's place) the figures
``real_vs_sim`` prints for the simulator, on the real latencies only, with B speed-matched to
A as the simulator is matched to A: the simulator's headline (``--calibrate-first``) is fitted
to lone requests timed just before A; B's calls on each instance are scaled by that
instance's lone-request time before A over its lone-request time before B (the same shapes,
same order: one factor per instance, where the simulator fits three speeds), so a machine
that ran 10% slower during B does not count as repeat error. Runs without
``--calibrate-first`` rows but with the speed probe before the replay (every run on a host
profile with a stored probe) are matched the way their headline is priced
(``probe.predicted_factors``): B's calls on each instance x A's predicted probe CPU-s over
B's (half the probe before each, half the instance's reference). Runs with neither are
compared unmatched (said so). Beside each pair, the simulator
on A with the same figures: median per call, time-weighted per call, median over calls of > 2
output tokens, P95 per query.

The floor: with independent run-to-run noise of spread s, two runs differ by about s x sqrt(2)
while a predictor of the mean is off by s, so the best any simulator can do on one run is the
repeat error / sqrt(2) (printed as "sqrt(2) floor"). P95 per query over fewer than 30 queries
is close to their maximum, so both are also pooled: the P95 over every pair's (and every run's)
per-query errors together.

The last two lines are the medians over the pairs of the speed-matched repeat error:
``repeat error, median per call: X`` and ``repeat error, P95 per query: Y``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.fidelity.figures import call_figures, p95, relative_errors

# real_vs_sim arguments that define the workload both runs replayed
WORKLOAD_KEYS = ("trace", "rate", "queries", "skip", "scale", "max_prompt", "max_output",
                 "assign", "seed")


@dataclass(frozen=True)
class Run:
    """One saved real_vs_sim run: its real latencies and its simulator's (the headline:
    calibrate-first where the run had it), and what speed matching needs."""

    path: str
    cluster: str
    call_ids: tuple[str, ...]
    call_real_s: np.ndarray
    query_real_s: np.ndarray
    sim_median_call: float
    sim_p95_query: float
    call_sim_s: np.ndarray | None = None
    query_sim_s: np.ndarray | None = None
    call_instance: tuple[str, ...] | None = None
    call_outputs: np.ndarray | None = None
    lone_rows: dict[str, list[tuple]] | None = None  # per instance, calibrate-first rows
    # per instance, the probe CPU-s the headline's pricing predicted for the replay (from
    # the speed probe before it and the instance's reference; ``probe.predicted_factors``)
    predicted_probe_s: dict[str, float] | None = None

    @classmethod
    def load(cls, path: str, saved: dict[str, Any]) -> Run:
        try:
            ids = tuple(c["id"] for c in saved["calls"])
            calls = np.asarray(saved["call_real_s"], dtype=float)
            queries = np.asarray(saved["query_real_s"], dtype=float)
            first = saved.get("calibrate_first", {})
            headline = first.get("figures") or saved
            sim = (float(headline["median_call_error"]), float(headline["p95_query_error"]))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: not a real_vs_sim --json file (missing {exc})") from None
        if len(ids) != len(calls) or not len(queries):
            raise ValueError(f"{path}: {len(ids)} call records for {len(calls)} call "
                             f"latencies and {len(queries)} queries")
        if np.any(calls <= 0) or np.any(queries <= 0):
            raise ValueError(f"{path}: a real latency is not positive")
        src = first if "call_sim_s" in first else saved
        call_sim = np.asarray(src["call_sim_s"], float) if "call_sim_s" in src else None
        query_sim = np.asarray(src["query_sim_s"], float) if "query_sim_s" in src else None
        inst = tuple(saved["call_instance"]) if "call_instance" in saved else None
        outs = np.asarray(saved["call_output_tokens"]) if "call_output_tokens" in saved \
            else None
        lone = {n: [tuple(r) for r in v["rows"]] for n, v in first["instances"].items()} \
            if first.get("instances") else None
        return cls(path, str(saved.get("args", {}).get("cluster")), ids, calls, queries, *sim,
                   call_sim, query_sim, inst, outs, lone, predicted_probe(saved))

    def query_of_call(self) -> list[int]:
        """Each call's query (ids are ``q<index>/<node>``)."""
        return [int(i.split("/", 1)[0][1:]) for i in self.call_ids]


def predicted_probe(saved: dict[str, Any]) -> dict[str, float] | None:
    """Per instance, the probe CPU-s a saved run's headline pricing predicted for its replay
    (``probe.predicted_factors`` x the reference); None without a speed probe before it."""
    from agentflow.bench.fidelity.probe import predicted_factors

    speed = saved.get("speed_probe") or {}
    before, refs = speed.get("before") or {}, speed.get("reference") or {}
    got = {n: f * refs[n] for n, f in predicted_factors(before, refs).items()}
    return got or None


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


def speed_factors(reference: Run, other: Run) -> dict[str, float] | None:
    """Per instance, the reference's lone-request time over the other run's (their
    calibrate-first rows: same shapes, same order); else the reference's predicted probe
    CPU-s over the other's (``predicted_probe``: the headline's pricing); None where
    either run has neither."""
    if reference.lone_rows is None or other.lone_rows is None:
        a, b = reference.predicted_probe_s, other.predicted_probe_s
        if a is None or b is None or set(a) != set(b):
            return None
        return {n: a[n] / b[n] for n in a}
    out = {}
    for name, rows in reference.lone_rows.items():
        theirs = other.lone_rows.get(name)
        if not theirs or len(theirs) != len(rows):
            return None
        # the same shapes: equal outputs, prompts as served within 2% (a token or so)
        if any(a[1] != b[1] or abs(a[0] - b[0]) > 0.02 * max(a[0], b[0], 1)
               for a, b in zip(rows, theirs)):
            return None
        out[name] = sum(r[3] for r in rows) / sum(r[3] for r in theirs)
    return out


def matched(reference: Run, other: Run) -> tuple[np.ndarray, np.ndarray, bool]:
    """``other``'s call and query latencies speed-matched to ``reference``: each call x its
    instance's factor, each query x its calls' time-weighted factor; unmatched (and False)
    where the runs lack the rows or the call instances."""
    factors = speed_factors(reference, other)
    if factors is None or other.call_instance is None:
        return other.call_real_s, other.query_real_s, False
    f = np.asarray([factors.get(i, 1.0) for i in other.call_instance])
    calls = other.call_real_s * f
    q_of = other.query_of_call()
    queries = other.query_real_s.copy()
    for q in range(len(queries)):
        sel = [k for k, qq in enumerate(q_of) if qq == q]
        if sel:
            w = other.call_real_s[sel]
            queries[q] *= float((f[sel] * w).sum() / w.sum())
    return calls, queries, True


def figures_of(pred_call, pred_query, reference: Run) -> dict[str, Any]:
    """real_vs_sim's figures of a prediction of ``reference``'s latencies, with the
    per-query errors kept for pooling."""
    q_err = relative_errors(pred_query, reference.query_real_s)
    return {**call_figures(pred_call, reference.call_real_s, reference.call_outputs),
            "p95_query_error": p95(q_err), "query_errors": q_err.tolist()}


def repeat_error(reference: Run, other: Run) -> tuple[float, float]:
    """``other``'s real latencies in the simulator's place against ``reference``'s, as they
    were (no speed matching): median per call, P95 per query."""
    call = np.abs(other.call_real_s - reference.call_real_s) / reference.call_real_s
    query = np.abs(other.query_real_s - reference.query_real_s) / reference.query_real_s
    return float(np.median(call)), float(np.percentile(query, 95))


def summarise(runs: list[Run]) -> dict[str, Any]:
    pairs = []
    for a, b in itertools.permutations(runs, 2):
        median, p95_q = repeat_error(a, b)
        calls, queries, is_matched = matched(a, b)
        pairs.append({"reference": a.path, "other": b.path, "same_cluster": a.cluster == b.cluster,
                      "median_call_error": median, "p95_query_error": p95_q,
                      "speed_matched": is_matched,
                      "speed_factors": speed_factors(a, b) if is_matched else None,
                      "matched": figures_of(calls, queries, a)})
    same = [p for p in pairs if p["same_cluster"]]
    sims = []
    for r in runs:
        entry: dict[str, Any] = {"run": r.path, "median_call_error": r.sim_median_call,
                                 "p95_query_error": r.sim_p95_query}
        if r.call_sim_s is not None and r.query_sim_s is not None:
            entry["figures"] = figures_of(r.call_sim_s, r.query_sim_s, r)
        sims.append(entry)
    out: dict[str, Any] = {"pairs": pairs, "sim": sims}
    if same:
        m = [p["matched"] for p in same]
        out["repeat_median_call_error"] = float(np.median([x["median_call_error"] for x in m]))
        out["repeat_p95_query_error"] = float(np.median([x["p95_query_error"] for x in m]))
        out["repeat_time_weighted_call_error"] = float(np.median(
            [x["time_weighted_call_error"] for x in m]))
        out["repeat_median_call_error_gt2"] = float(np.median(
            [x.get("median_call_error_gt2", float("nan")) for x in m]))
        out["repeat_pooled_p95_query_error"] = p95([e for x in m for e in x["query_errors"]])
        out["repeat_pooled_queries"] = sum(len(x["query_errors"]) for x in m)
        out["unmatched_raw_median_call_error"] = float(np.median(
            [p["median_call_error"] for p in same]))
        out["all_speed_matched"] = all(p["speed_matched"] for p in same)
    figs = [s["figures"] for s in sims if "figures" in s]
    if figs:
        out["sim_pooled_p95_query_error"] = p95([e for f in figs for e in f["query_errors"]])
        out["sim_pooled_queries"] = sum(len(f["query_errors"]) for f in figs)
    return out


def _row(label: str, f: dict[str, Any]) -> str:
    return (f"{label:28} {f['median_call_error']:11.3f} {f['time_weighted_call_error']:9.3f} "
            f"{f.get('median_call_error_gt2', float('nan')):9.3f} {f['p95_query_error']:9.3f}")


def report(paths: list[str], json_out: str | None = None) -> None:
    """Print the repeat error of the saved runs ``paths`` (``real_vs_sim --repeat``), and write
    its figures to ``json_out``; ValueError (naming the file) on runs that cannot be compared."""
    runs = load_runs(paths)
    out = summarise(runs)
    name = {r.path: f"run{i + 1}" for i, r in enumerate(runs)}
    for r in runs:
        print(f"{name[r.path]}: {r.path} (cluster {r.cluster}); its simulator: median per call "
              f"{r.sim_median_call:.3f}, P95 per query {r.sim_p95_query:.3f}")
    print(f"{'':28} {'median/call':>11} {'tw/call':>9} {'>2 tok':>9} {'P95/query':>9}")
    sim_of = {s["run"]: s for s in out["sim"]}
    for p in out["pairs"]:
        note = "" if p["same_cluster"] else "  (other cluster file: not in the summary)"
        how = "speed-matched" if p["speed_matched"] else "NOT speed-matched (no rows, no probe)"
        print(_row(f"{name[p['other']]} for {name[p['reference']]}, {how}", p["matched"])
              + note)
        print(f"{'  as recorded, unmatched':28} {p['median_call_error']:11.3f} {'':9} {'':9} "
              f"{p['p95_query_error']:9.3f}")
        sim = sim_of[p["reference"]]
        if "figures" in sim:
            print(_row(f"  simulator for {name[p['reference']]}", sim["figures"]))
    sims = out["sim"]
    print(f"simulator, median over the runs: median per call "
          f"{np.median([s['median_call_error'] for s in sims]):.4f}, P95 per query "
          f"{np.median([s['p95_query_error'] for s in sims]):.4f}")
    if "sim_pooled_p95_query_error" in out:
        print(f"simulator, P95 per query pooled over {out['sim_pooled_queries']} queries of "
              f"the runs: {out['sim_pooled_p95_query_error']:.4f}")
    if json_out:
        Path(json_out).write_text(json.dumps(out, indent=1))
    if "repeat_median_call_error" not in out:
        print("no two runs share a cluster file: no repeat error")
        return
    root2 = float(np.sqrt(2.0))
    print(f"repeat error (speed-matched: {'yes' if out['all_speed_matched'] else 'NOT all'}), "
          f"time-weighted per call {out['repeat_time_weighted_call_error']:.4f}, median over "
          f"calls of > 2 output tokens {out['repeat_median_call_error_gt2']:.4f}, P95 per "
          f"query pooled over {out['repeat_pooled_queries']} queries "
          f"{out['repeat_pooled_p95_query_error']:.4f}")
    print(f"sqrt(2) floor (repeat / sqrt 2): median per call "
          f"{out['repeat_median_call_error'] / root2:.4f}, time-weighted "
          f"{out['repeat_time_weighted_call_error'] / root2:.4f}, P95 per query "
          f"{out['repeat_p95_query_error'] / root2:.4f}, pooled P95 per query "
          f"{out['repeat_pooled_p95_query_error'] / root2:.4f}")
    print(f"repeat error, median per call: {out['repeat_median_call_error']:.4f}")
    print(f"repeat error, P95 per query: {out['repeat_p95_query_error']:.4f}")

