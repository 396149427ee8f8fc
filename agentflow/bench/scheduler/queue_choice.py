"""Where the queue order acts: flowsage against marginal_delay+fcfs per engine-side depth, over
seeds and loads, beside the best other policy, with how many admissions had a choice and how
much of a call's time was spent waiting at all.

    agentflow bench queue_choice [--clusters paper-4gpu,hetero-8] [--pending 1,2,off]
        [--policies flowsage,marginal_delay+fcfs]
        [--others vllm,hexgen-flow,sagesched,llf,least_loaded+edf]
        [--loads 1.5,2] [--seeds 1,2,3] [--queries 80] [--l1 paper-4gpu=0.0325,...]
        [--inflight N] [--attribute] [--stall-by-risk] [--json OUT]
    agentflow bench queue_choice --axis [--seeds 1-3 | --seeds 1-20]
    agentflow bench queue_choice --axis --saturation 0.9,0.7,0.5 [--sat-seeds 1,2]
        [--queries 240] [--seeds 1-5]

Why: under ``marginal_delay`` almost every call is admitted to an instance the moment it is
ready, so the agentflow queue rarely holds two calls to order and ``marginal_delay+fcfs``
tied flowsage. What is left to order is inside the engine — its own waiting queue and the
sequence it preempts — which the coordinator tells each call's queue rank
(``scheduler.classes.engine_priority``), and how much waits there rather than in agentflow's
queue, which the instance's ``max_pending_prefill`` bounds (admitted calls without a first
token).

A cell is (cluster, load, seed): trace1, Poisson at ``load`` x L1 (the policy suite's load
level; ``--l1`` reuses known L1 rates, else they are searched). In each cell the two
``--policies`` run at every depth of ``--pending`` and then at a depth chosen per GPU kind
(``tuned``: for each kind, the swept depth whose calls on that kind spent the least mean time
from ready to done — measured, not fixed, since the best depth may differ by how fast a kind
drains its prompts); the ``--others`` run at the cluster's own depth (the configured
default). Printed per cell: P95, the admissions made while two or more calls waited
(``InstanceQueue.admitted_with_choice``) per GPU kind, and ``wait``, the share of the LLM
calls' time spent waiting (agentflow's queue and the engine's) rather than running — the
most any queue order can take off; then the geometric means over cells of flowsage /
md+fcfs per depth and flowsage / best other. CPU-heavy: keep ``--queries`` small on a
shared box. ``--inflight N`` caps every instance's admitted calls at N (``max_inflight``):
the rest wait in agentflow's queue, as they do on an engine with few slots (llama-server),
which shows what the order is worth once queues form.

``--axis`` is the suite along a contention axis (issue 38): the queue can only matter where
calls contend, so the cells span load rather than sit at the policy suite's one level. The
loads are fixed up front, the same multiples of each cluster's own L1 on every cluster
(``AXIS_LOADS``: the suite's 1.5, then 2 and 3 x L1 — not chosen by where flowsage wins), at
the clusters' configured engine-side depth, both clusters (the known L1 rates of the policy
suite, ``AXIS_L1``), and it reports every cell: flowsage / md+fcfs P95, flowsage / best
other, the waiting share and the admissions with a choice under each of the pair, and the
**at-risk share** — of the decode seconds that co-running prompt chunks add under md+fcfs,
the part on decodes of queries at risk (miss probability >= the hold's ``HOLD_AT_RISK``;
``StallByRisk``), i.e. what the rank hold could move. Then geometric means per (cluster,
load), per load, per cluster and over all cells, and over the cells where calls contend by
a rule stated here, not by result: md+fcfs's LLM calls spend at least ``CONTENDED_WAIT`` of
their time waiting.

``--saturation T1,T2,...`` places the axis's load points by the baseline's own saturation
instead of by vllm's L1 (issue 38: at fixed multiples of L1 hetero-8 never queues and
paper-4gpu at 3 x is past its deadlines, so neither reaches the middle regime where the order
could act): for each cluster and each target T (an SLO attainment, e.g. 0.9 / 0.7 / 0.5),
the arrival rate at which ``pair[1]``'s (md+fcfs's) SLO attainment, averaged over
``--sat-seeds``, falls to T — bracketed by doubling or halving from the cluster's L1, then
bisected in log rate ``--sat-iterations`` times (``saturation_rate``; each run at the
cluster's configured depth, ``--queries`` queries). The rule reads only the baseline, not
flowsage; the cells are then run at those rates and reported like ``--axis``'s (a point is
named ``slo90`` etc., its load printed as a multiple of L1). Keep ``--queries`` large
enough that the arrivals outlast a query: with 80 hetero-8 queries arrive in a burst the
cluster absorbs (md+fcfs meets 97% of deadlines at 3 x L1 with 80 queries, 59% at 4 x with
240).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from agentflow.bench.scheduler.policy_suite import cluster_named, find_l1, geomean, workloads
from agentflow.scheduler import risk, savable
from agentflow.sim.cluster import SimClusterConfig
from agentflow.sim.driver import Simulation, StageTiming, _engine_id
from agentflow.sim.experiment import build_workload
from agentflow.sim.slo import IdleLatency

Depth = int | None  # max_pending_prefill; None: no bound
TUNED = "tuned"


def parse_depths(text: str) -> list[Depth]:
    """``1,2,off`` -> [1, 2, None] (off: no bound, every free slot admits at once)."""
    out: list[Depth] = []
    for part in text.split(","):
        part = part.strip()
        if part == "off":
            out.append(None)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"--pending: {part!r} is not a depth >= 1 or off")
    return out


def parse_floats(text: str, what: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: {text!r} is not a list of numbers") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{what}: {text!r} needs positive numbers")
    return values


def parse_seeds(text: str) -> list[int]:
    """``1,2,5-8`` -> [1, 2, 5, 6, 7, 8] (a range is inclusive)."""
    out: list[int] = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())):
            raise argparse.ArgumentTypeError(f"--seeds: {part!r} is not a seed or a range a-b")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise argparse.ArgumentTypeError(f"--seeds: {part!r} is an empty range")
        out.extend(range(first, last + 1))
    if not out:
        raise argparse.ArgumentTypeError("--seeds: no seed given")
    return out


# ``--axis``: the contention axis (module docstring). Stated before any run, not tuned.
AXIS_CLUSTERS = ("paper-4gpu", "hetero-8")
AXIS_LOADS = (1.5, 2.0, 3.0)
AXIS_L1 = "paper-4gpu=0.0325,hetero-8=0.48"  # the policy suite's L1 (vllm P95 2 x idle)
CONTENDED_WAIT = 0.05  # a cell contends when md+fcfs's calls wait >= 5% of their time
SAT_ITERATIONS = 4  # log-rate bisection steps of ``--saturation`` (a 2x bracket -> ~4%)


def parse_targets(text: str) -> list[float]:
    """``0.9,0.7,0.5`` -> [0.9, 0.7, 0.5]: SLO attainments strictly between 0 and 1."""
    values = parse_floats(text, "--saturation")
    if any(v >= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"--saturation: {text!r} needs attainments below 1")
    return values


def point_label(target: float) -> str:
    """0.9 -> ``slo90``: the name of a ``--saturation`` load point."""
    return f"slo{round(100 * target):d}"


def saturation_rate(attainment: Any, target: float, start: float,
                    iterations: int = SAT_ITERATIONS,
                    seen: dict[float, float] | None = None, max_steps: int = 12) -> float:
    """The arrival rate at which ``attainment(rate)`` (an SLO attainment that falls as the
    rate grows) falls to ``target``: a bracket [lo, hi] with attainment(lo) >= target >
    attainment(hi), taken from ``seen`` (rate -> attainment, shared between targets and
    filled here) where it holds one, else found by doubling or halving from ``start``; then
    ``iterations`` bisections in log rate; the bracket's geometric middle is returned.
    ``max_steps`` bounds the doubling/halving (a target never reached raises ValueError)."""
    seen = {} if seen is None else seen

    def f(rate: float) -> float:
        if rate not in seen:
            seen[rate] = float(attainment(rate))
        return seen[rate]

    if not seen:
        f(start)
    ok = [r for r, a in seen.items() if a >= target]
    lo = max(ok) if ok else None
    above = [r for r, a in seen.items() if a < target and (lo is None or r > lo)]
    hi = min(above) if above else None
    steps = 0
    while lo is None or hi is None:
        steps += 1
        if steps > max_steps:
            raise ValueError(f"no rate brackets SLO attainment {target:g} within "
                             f"{max_steps} doublings of {start:g} q/s")
        if lo is None:
            assert hi is not None
            rate = hi / 2
            if f(rate) >= target:
                lo = rate
            else:
                hi = rate
        else:
            rate = lo * 2
            if f(rate) < target:
                hi = rate
            else:
                lo = rate
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        if f(mid) >= target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def saturation_points(cluster: SimClusterConfig, trace: Any, idle: IdleLatency,
                      targets: list[float], seeds: list[int], n: int, policy: str,
                      start: float, iterations: int = SAT_ITERATIONS
                      ) -> tuple[dict[float, float], dict[float, float]]:
    """``saturation_rate`` for every target on one cluster, ``policy``'s SLO attainment
    (mean over ``seeds``, ``n`` queries, the cluster as configured) as the reading; the
    evaluations are shared between targets (highest target first). Returns ({target:
    rate}, {rate: attainment} of every rate run)."""
    seen: dict[float, float] = {}

    def attainment(rate: float) -> float:
        values = []
        for seed in seeds:
            wl = build_workload(trace, cluster, n=n, rate=rate, seed=seed, idle=idle)
            values.append(run_depth(cluster, wl, policy)["slo"] or 0.0)
        print(f"  saturation: {policy} at {rate:.4g} q/s: SLO attainment "
              f"{statistics.fmean(values):.3f} (seeds {','.join(map(str, seeds))})",
              flush=True)
        return statistics.fmean(values)

    rates = {t: saturation_rate(attainment, t, start, iterations, seen)
             for t in sorted(targets, reverse=True)}
    return {t: rates[t] for t in targets}, dict(sorted(seen.items()))


def depth_label(depth: Depth) -> str:
    return "off" if depth is None else str(depth)


def with_depth(cluster: SimClusterConfig, depth: Depth | Mapping[str, Depth]
               ) -> SimClusterConfig:
    """The cluster with every instance's ``max_pending_prefill`` set to ``depth`` (a mapping:
    per GPU kind; a kind it does not name keeps its configured depth)."""
    def pick(inst: Any) -> Depth:
        if isinstance(depth, Mapping):
            return depth.get(inst.gpu or "cpu", inst.max_pending_prefill)
        return depth
    return cluster.model_copy(update={"instances": [
        i.model_copy(update={"max_pending_prefill": pick(i)}) for i in cluster.instances]})


# Where an LLM call's time above its time alone goes (``attribution``), in print order.
PARTS = ("solo", "queue", "engine_queue", "prefill_shared", "stall", "decode_shared", "lost",
         "sat_out")


def attribution(engines: Any, queued_s: float, calls: int) -> dict[str, float]:
    """Mean seconds per LLM call, from the engines' ``SeqTimes``: ``solo`` (its work alone on
    the instance it ran on), ``queue`` (waiting in agentflow's queue: the stages' queue time
    less the engines'), ``engine_queue``, ``prefill_shared`` (its prompt's steps shared with
    others, above solo), ``stall`` (its decode steps lengthened by co-running prefill
    chunks), ``decode_shared`` (its decode steps lengthened by co-running decodes), ``lost``
    (attempts a KV preemption threw away) and ``sat_out`` (iterations it was running but not
    in: the token budget went to others first)."""
    rows = [x for e in engines for x in e.attributed]
    if not rows or calls == 0:
        return {}
    n = len(rows)
    eq = sum(x.queue_s for x in rows)
    out = {
        "solo": sum(x.solo_prefill_s + x.solo_decode_s for x in rows) / n,
        "queue": max(0.0, queued_s - eq) / calls,
        "engine_queue": eq / n,
        "prefill_shared": sum(x.prefill_s - x.solo_prefill_s for x in rows) / n,
        "stall": sum(x.stall_s for x in rows) / n,
        "decode_shared": sum(x.decode_s - x.stall_s - x.solo_decode_s for x in rows) / n,
        "lost": sum(x.lost_s for x in rows) / n,
        "sat_out": sum(x.run_s - x.prefill_s - x.decode_s - x.lost_s for x in rows) / n,
    }
    return out


# Miss-probability classes of ``--stall-by-risk`` (the rank hold's own thresholds).
RISK_CLASSES = ("at_risk", "middle", "safe")


def risk_class(p_miss: float) -> str:
    """``at_risk`` at the hold's ``HOLD_AT_RISK`` or above, ``safe`` at its ``HOLD_SAFE`` or
    below, else ``middle``."""
    if p_miss >= risk.HOLD_AT_RISK:
        return "at_risk"
    return "safe" if p_miss <= risk.HOLD_SAFE else "middle"


class StallByRisk:
    """Who stalled whom: decode seconds added by co-running prompt chunks, summed over the
    decoding calls, by (the decoder's class, the prompt's class) — each query's miss
    probability at the iteration's start (``scheduler.risk.miss_probability``, flowsage's
    reading, whatever policy ran), an iteration's stall split over its prompts by tokens.
    Why: the rank hold moves stalls from at-risk decodes to safe prompts' calls; what is
    left on the at-risk decodes, and from whom, says what a further gain must move."""

    def __init__(self, sim: Simulation):
        self.coordinator = sim.coordinator
        self.seconds: dict[tuple[str, str], float] = {}
        for name, engine in sim.instances.items():
            engine.attribute = True
            engine.stall_observer = self._observer(name)

    def _observer(self, name: str) -> Any:
        queue = self.coordinator.queues[name]

        def observe(t: float, decoding: list[str], prompts: list[tuple[str, int]],
                    stall_s: float) -> None:
            calls = {_engine_id(c): c for c in queue.running}
            known = [(calls[i], n) for i, n in prompts if i in calls]
            tokens = sum(n for _, n in known)
            if not tokens:
                return
            by = [(risk_class(risk.miss_probability(self.coordinator, c.query, t)), n)
                  for c, n in known]
            for i in decoding:
                if i not in calls:
                    continue
                mine = risk_class(risk.miss_probability(self.coordinator, calls[i].query, t))
                for theirs, n in by:
                    key = (mine, theirs)
                    self.seconds[key] = self.seconds.get(key, 0.0) + stall_s * n / tokens
        return observe

    def table(self) -> dict[str, dict[str, float]]:
        """{decoder class: {prompt class: stall seconds}}."""
        return {d: {p: self.seconds.get((d, p), 0.0) for p in RISK_CLASSES}
                for d in RISK_CLASSES}


def at_risk_share(table: Mapping[str, Mapping[str, float]]) -> float | None:
    """Of all stall seconds in a ``StallByRisk.table``, the share on at-risk decodes (None:
    no stall at all) — what the rank hold, which only moves prompts off at-risk decodes,
    has to act on."""
    total = sum(v for row in table.values() for v in row.values())
    return sum(table["at_risk"].values()) / total if total > 0 else None


def run_depth(cluster: SimClusterConfig, wl: Any, policy: str, attribute: bool = False,
              by_risk: bool = False) -> dict[str, Any]:
    """One policy on one cluster: P95 and mean latency, SLO attainment, the admissions with a
    choice, and per GPU kind the LLM calls' mean time from ready to done and their share of
    it spent waiting (``attribute``: also where the calls' time went, ``attribution``;
    ``by_risk``: also the stall table of ``StallByRisk``)."""
    kind_of = {name: cfg.gpu or "cpu" for name, cfg in cluster.expanded()}
    stage_time: dict[str, list[float]] = {}  # kind -> [queue_s, run_s, calls]

    def on_stage(st: StageTiming) -> None:
        if st.kind != "llm" or st.instance is None:
            return
        row = stage_time.setdefault(kind_of.get(st.instance, "?"), [0.0, 0.0, 0])
        row[0] += st.queue_s
        row[1] += st.run_s
        row[2] += 1

    sim = Simulation(cluster, policy, on_stage=on_stage)
    for engine in sim.instances.values():
        engine.attribute = attribute
    stalls = StallByRisk(sim) if by_risk else None
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
    lat = [r.latency_s for r in result.records if r.status == "done" and r.latency_s]
    met = [r for r in result.records if r.slo_s is not None]
    by_kind: dict[str, list[int]] = {}
    for queue in sim.coordinator.queues.values():
        kind = queue.spec.gpu or "cpu"
        row = by_kind.setdefault(kind, [0, 0])
        row[0] += queue.admitted_with_choice
        row[1] += queue._admitted
    waited = sum(r[0] for r in stage_time.values())
    ran = sum(r[1] for r in stage_time.values())
    return {"p95": float(np.percentile(lat, 95)), "mean": float(np.mean(lat)),
            "done": len(lat), "queries": len(result.records),
            "slo": (sum(1 for r in met if r.latency_s is not None and r.slo_s is not None
                        and r.latency_s <= r.slo_s) / len(met)) if met else None,
            "choice": sum(v[0] for v in by_kind.values()),
            "admissions": sum(v[1] for v in by_kind.values()), "by_kind": by_kind,
            "wait_share": waited / (waited + ran) if waited + ran > 0 else 0.0,
            "call_s_by_kind": {k: (r[0] + r[1]) / r[2] for k, r in stage_time.items() if r[2]},
            "calls_by_kind": {k: r[2] for k, r in stage_time.items() if r[2]},
            "where": attribution(sim.instances.values(), waited,
                                 sum(r[2] for r in stage_time.values())) if attribute else {},
            "stall_by_risk": stalls.table() if stalls is not None else {}}


def best_depth_per_kind(sweep: Mapping[Depth, Mapping[str, Any]]) -> dict[str, Depth]:
    """Per GPU kind, the swept depth whose calls on that kind took the least mean time from
    ready to done (a kind that ran nothing at some depth is judged on the others; ties: the
    smaller bound, since it keeps more of the order in agentflow's queue)."""
    kinds = sorted({k for run in sweep.values() for k in run["call_s_by_kind"]})
    order = sorted(sweep, key=lambda d: (d is None, d or 0))
    out: dict[str, Depth] = {}
    for kind in kinds:
        scored = [(sweep[d]["call_s_by_kind"][kind], i) for i, d in enumerate(order)
                  if kind in sweep[d]["call_s_by_kind"]]
        out[kind] = order[min(scored)[1]]
    return out


def summarize(cells: Mapping[str, Mapping[str, Any]], pair: tuple[str, str],
              others: list[str]) -> dict[str, Any]:
    """Geometric means over cells: ``pair[0] / pair[1]`` P95 at each depth label, and
    ``pair[0]`` (at the cluster's own depth) over the best of ``others`` per cell."""
    first, second = pair
    ratios: dict[str, list[float]] = {}
    vs_best: list[float] = []
    for cell in cells.values():
        for label, runs in cell["depths"].items():
            if first in runs and second in runs:
                ratios.setdefault(label, []).append(runs[first]["p95"] / runs[second]["p95"])
        own = cell["own"]
        rivals = [own[p]["p95"] for p in others if p in own]
        if first in own and rivals:
            vs_best.append(own[first]["p95"] / min(rivals))
    out: dict[str, Any] = {f"{first}/{second}": {k: geomean(v) for k, v in ratios.items()}}
    if vs_best:
        out[f"{first}/best other"] = geomean(vs_best)
    return out


def axis_rows(cells: Mapping[str, Mapping[str, Any]], pair: tuple[str, str],
              others: list[str]) -> list[dict[str, Any]]:
    """One row per cell of ``--axis``, at the cluster's own depth: ``ratio`` (``pair[0]`` /
    ``pair[1]`` P95), ``vs_best`` (``pair[0]`` over the best of ``others``), each of the
    pair's waiting share and admissions with a choice, and ``at_risk`` (``at_risk_share`` of
    ``pair[1]``'s stall table; None where it was not kept or nothing stalled)."""
    first, second = pair
    rows = []
    for key, cell in cells.items():
        own = cell["own"]
        rivals = {p: own[p]["p95"] for p in others if p in own}
        best = min(rivals, key=lambda p: rivals[p]) if rivals else None
        table = own[second].get("stall_by_risk")
        rows.append({
            "cell": key, "cluster": cell["cluster"], "load": cell["load"],
            "point": cell.get("point") or f"x{cell['load']:g}",
            "seed": cell["seed"], "ratio": own[first]["p95"] / own[second]["p95"],
            "vs_best": own[first]["p95"] / rivals[best] if best else None, "best": best,
            "wait": {p: own[p]["wait_share"] for p in pair},
            "choice": {p: (own[p]["choice"], own[p]["admissions"]) for p in pair},
            "at_risk": at_risk_share(table) if table else None})
    return rows


def axis_summary(rows: list[dict[str, Any]], second: str,
                 contended_wait: float = CONTENDED_WAIT) -> dict[str, dict[str, Any]]:
    """Geometric means of ``ratio`` and ``vs_best`` over groups of ``axis_rows``: per
    (cluster, load), per load, per cluster, all, and ``contended`` (the cells where
    ``second``'s calls waited at least ``contended_wait`` of their time: a rule on the
    baseline's contention, not on the result). Each group: n, ratio, vs_best."""
    groups: dict[str, list[dict[str, Any]]] = {}

    def add(name: str, row: dict[str, Any]) -> None:
        groups.setdefault(name, []).append(row)

    def point(row: dict[str, Any]) -> str:
        return str(row.get("point") or f"x{row['load']:g}")

    for row in rows:
        add(f"{row['cluster']} {point(row)}", row)
    for row in rows:
        add(point(row), row)
    for row in rows:
        add(row["cluster"], row)
    contended = f"contended (md wait >= {contended_wait:g})"
    groups[contended] = []  # shown even when no cell contends
    for row in rows:
        add("all", row)
        if row["wait"][second] >= contended_wait:
            add(contended, row)
    return {name: {"n": len(g), "ratio": geomean([r["ratio"] for r in g]),
                   "se": log_se([r["ratio"] for r in g]),
                   "vs_best": geomean([r["vs_best"] for r in g if r["vs_best"] is not None])}
            for name, g in groups.items()}


def log_se(values: list[float]) -> float:
    """The standard error of the mean log of ``values`` (a geomean's relative spread: one
    cell moves 3-6% by seed, so a geomean over n cells carries about that / sqrt(n)); nan
    under two values."""
    if len(values) < 2:
        return math.nan
    logs = [math.log(v) for v in values]
    return float(statistics.stdev(logs) / math.sqrt(len(logs)))


def format_axis(rows: list[dict[str, Any]], summary: Mapping[str, Mapping[str, Any]],
                pair: tuple[str, str]) -> str:
    """The per-cell table and the group means, as printed by ``--axis``."""
    first, second = pair
    head = (f"{'cell':<22} {'fs/md':>6} {'fs/best':>7} {'best':<16} {'wait md':>7} "
            f"{'wait fs':>7} {'choice md':>10} {'choice fs':>10} {'at-risk':>7}")
    lines = [f"per cell ({first} = fs, {second} = md; wait: share of the LLM calls' time "
             "waiting; choice: admissions made with 2+ calls waiting; at-risk: share of the "
             "md run's prefill stall on at-risk decodes)", head]
    for r in rows:
        vb = f"{r['vs_best']:.3f}" if r["vs_best"] is not None else "-"
        ar = f"{r['at_risk']:.3f}" if r["at_risk"] is not None else "-"
        cm, cf = (f"{r['choice'][p][0]}/{r['choice'][p][1]}" for p in (second, first))
        lines.append(f"{r['cell']:<22} {r['ratio']:6.3f} {vb:>7} {r['best'] or '-':<16} "
                     f"{r['wait'][second]:7.3f} {r['wait'][first]:7.3f} {cm:>10} {cf:>10} "
                     f"{ar:>7}")
    lines.append("geomean (n cells: fs/md +- s.e. of the log, fs/best)")
    for name, g in summary.items():
        lines.append(f"  {name:<30} n={g['n']:<4} {g['ratio']:.3f} +-{g['se']:.3f}  "
                     f"{g['vs_best']:.3f}")
    return "\n".join(lines)


def axis_defaults(args: argparse.Namespace, given: list[str]) -> None:
    """``--axis``: fill the axis's clusters, loads, L1 rates and depth (2, the clusters'
    configured one) into ``args``, except where the command line (``given``) named them."""
    def named(flag: str) -> bool:
        return any(a == flag or a.startswith(flag + "=") for a in given)
    if not named("--clusters"):
        args.clusters = ",".join(AXIS_CLUSTERS)
    if not named("--loads"):
        args.loads = list(AXIS_LOADS)
    if not named("--l1"):
        args.l1 = AXIS_L1
    if not named("--pending"):
        args.pending = [2]


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--clusters", "paper-4gpu", "--pending", "2,off",
                               "--queries", "40", "--seeds", "1", "--loads", "1.5",
                               "--others", "vllm")


def _line(label: str, policy: str, f: dict[str, Any], wall: float) -> str:
    kinds = " ".join(f"{k}:{c}/{n}" for k, (c, n) in sorted(f["by_kind"].items()))
    line = (f"    {label:<6} {policy:<22} p95={f['p95']:7.2f} mean={f['mean']:6.2f} "
            f"done={f['done']}/{f['queries']} wait={f['wait_share']:.3f} "
            f"choice={f['choice']}/{f['admissions']} [{kinds}] ({wall:.0f}s)")
    where = f.get("where")
    if where:
        line += "\n           s/call " + " ".join(f"{k}={where[k]:.2f}" for k in PARTS)
    table = f.get("stall_by_risk")
    if table:
        for d in RISK_CLASSES:
            line += (f"\n           stall s on {d:<7} decodes by prompts of: "
                     + " ".join(f"{p}={table[d][p]:.0f}" for p in RISK_CLASSES))
    return line


def run_cell(base: SimClusterConfig, wl: Any, policies: list[str], others: list[str],
             depths: list[Depth], attribute: bool = False,
             by_risk: bool | Collection[str] = False) -> dict[str, Any]:
    """One (cluster, load, seed) cell: the sweep, the per-kind tuned depth, the others
    (``by_risk``: the stall table for every policy, or for those named)."""
    def risk_for(policy: str) -> bool:
        return by_risk if isinstance(by_risk, bool) else policy in by_risk

    cell: dict[str, Any] = {"depths": {}, "own": {}, "tuned_depths": {}}
    sweeps: dict[str, dict[Depth, dict[str, Any]]] = {p: {} for p in policies}
    for depth in depths:
        label = depth_label(depth)
        runs = cell["depths"].setdefault(label, {})
        for policy in policies:
            t0 = time.perf_counter()
            runs[policy] = sweeps[policy][depth] = run_depth(
                with_depth(base, depth), wl, policy, attribute, risk_for(policy))
            print(_line(label, policy, runs[policy], time.perf_counter() - t0), flush=True)
    if len(depths) > 1:
        runs = cell["depths"].setdefault(TUNED, {})
        for policy in policies:
            chosen = best_depth_per_kind(sweeps[policy])
            cell["tuned_depths"][policy] = {k: depth_label(d) for k, d in chosen.items()}
            t0 = time.perf_counter()
            runs[policy] = run_depth(with_depth(base, chosen), wl, policy, attribute,
                                     risk_for(policy))
            print(_line(TUNED, policy, runs[policy], time.perf_counter() - t0)
                  + "  depths " + " ".join(f"{k}={depth_label(d)}"
                                           for k, d in sorted(chosen.items())), flush=True)
    default = {i.max_pending_prefill for i in base.instances}
    own_label = depth_label(default.pop()) if len(default) == 1 else None
    for policy in policies + others:
        if own_label is not None and policy in cell["depths"].get(own_label, {}):
            cell["own"][policy] = cell["depths"][own_label][policy]
            continue
        t0 = time.perf_counter()
        cell["own"][policy] = run_depth(base, wl, policy, attribute, risk_for(policy))
        print(_line("own", policy, cell["own"][policy], time.perf_counter() - t0), flush=True)
    return cell


def main(argv: list[str] | None = None) -> int:
    savable.register()  # flowsage-savable, measured here (not a shipped policy)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--clusters", default="paper-4gpu,hetero-8")
    p.add_argument("--pending", type=parse_depths, default=parse_depths("1,2,off"),
                   help="engine-side depths: max_pending_prefill values, or off")
    p.add_argument("--policies", default="flowsage,marginal_delay+fcfs",
                   help="the pair compared at every depth")
    p.add_argument("--others", default="vllm,hexgen-flow,sagesched,llf,least_loaded+edf",
                   help="policies run at the cluster's own depth; the best per cell is the "
                        "'best other'")
    p.add_argument("--loads", type=lambda s: parse_floats(s, "--loads"), default=[1.5, 2.0],
                   help="x L1 (the policy suite's 1.5)")
    p.add_argument("--seeds", type=parse_seeds, default=parse_seeds("1,2,3"),
                   help="seeds: 1,2,3 or ranges 1-20")
    p.add_argument("--queries", type=int, default=80)
    p.add_argument("--l1", default="", help="CLUSTER=RATE,... known L1 rates (else searched)")
    p.add_argument("--inflight", type=int, help="every instance's max_inflight (default: as "
                   "configured, max_num_seqs on a GPU)")
    p.add_argument("--attribute", action="store_true",
                   help="also print where each policy's LLM call time went, per call: "
                        "alone, queues, shared prefill, stalls by co-running prefill chunks, "
                        "shared decode, preemption")
    p.add_argument("--stall-by-risk", action="store_true",
                   help="also print the decode seconds co-running prompt chunks added, by the "
                        "decoder's and the prompt's miss probability (at risk >= the hold's "
                        "0.4, safe <= 0.02, middle between)")
    p.add_argument("--axis", action="store_true",
                   help="the contention axis: both clusters at 1.5, 2 and 3 x their known "
                        "L1, the configured depth, the at-risk share under the second "
                        "policy, and a per-cell table with geomeans per load and overall "
                        "(explicit --clusters/--loads/--pending/--l1 still win)")
    p.add_argument("--saturation", type=parse_targets, default=None,
                   help="place the load points by the second policy's own saturation: the "
                        "rates where its SLO attainment (mean over --sat-seeds) falls to "
                        "each of these, e.g. 0.9,0.7,0.5, by bisection from L1 (replaces "
                        "--loads)")
    p.add_argument("--sat-seeds", type=parse_seeds, default=parse_seeds("1,2"),
                   help="seeds whose mean SLO attainment --saturation bisects on")
    p.add_argument("--sat-iterations", type=int, default=SAT_ITERATIONS,
                   help="log-rate bisection steps per --saturation target")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if args.axis:
        axis_defaults(args, list(sys.argv[1:] if argv is None else argv))
    if args.inflight is not None and args.inflight < 1:
        p.error("--inflight must be >= 1")
    known = {k: float(v) for k, v in (x.split("=") for x in args.l1.split(",") if x)}
    policies = [x for x in args.policies.split(",") if x]
    if len(policies) != 2:
        p.error("--policies takes exactly two policies (the pair compared)")
    others = [x for x in args.others.split(",") if x and x not in policies]
    seeds: list[int] = args.seeds
    trace = workloads()["trace1"]
    cells: dict[str, Any] = {}
    l1s: dict[str, float] = {}
    saturation: dict[str, Any] = {}
    if args.sat_iterations < 0:
        p.error("--sat-iterations must be >= 0")
    for name in args.clusters.split(","):
        base = cluster_named(name)
        if args.inflight is not None:
            base = base.model_copy(update={"instances": [
                i.model_copy(update={"max_inflight": args.inflight}) for i in base.instances]})
        idle = IdleLatency(base)
        l1 = known.get(name)
        if l1 is None:
            l1 = find_l1(trace, base, idle, max(60, 8 * len(base.expanded())), seeds[0])
        l1s[name] = l1
        points: list[tuple[str | None, float]] = [(None, load * l1) for load in args.loads]
        if args.saturation:
            rates, seen = saturation_points(base, trace, idle, args.saturation,
                                            args.sat_seeds, args.queries, policies[1], l1,
                                            args.sat_iterations)
            saturation[name] = {"rates": {point_label(t): r for t, r in rates.items()},
                                "seen": seen}
            print(f"{name}: {policies[1]} saturation points " + ", ".join(
                f"{point_label(t)} {r:.4g} q/s ({r / l1:.2f} x L1)" for t, r in rates.items()),
                  flush=True)
            points = [(point_label(t), r) for t, r in rates.items()]
        for label, rate in points:
            load = rate / l1
            for seed in seeds:
                wl = build_workload(trace, base, n=args.queries, rate=rate, seed=seed,
                                    idle=idle)
                key = f"{name}/{label or f'x{load:g}'}/s{seed}"
                print(f"{key}: L1 {l1:.4g} q/s, rate {rate:.4g}, {args.queries} queries",
                      flush=True)
                by_risk: bool | Collection[str] = args.stall_by_risk or (
                    [policies[1]] if args.axis else False)
                cells[key] = run_cell(base, wl, policies, others, args.pending,
                                      args.attribute, by_risk)
                cells[key].update(cluster=name, load=load, seed=seed, point=label,
                                  rate=rate)
                pair = cells[key]["depths"]
                print("    " + "  ".join(
                    f"{lab}: {pair[lab][policies[0]]['p95'] / pair[lab][policies[1]]['p95']:.3f}"
                    for lab in pair) + f"  ({policies[0]} / {policies[1]} P95)", flush=True)
    summary = summarize(cells, (policies[0], policies[1]), others)
    print(f"geomean over {len(cells)} cells: " + json.dumps(summary), flush=True)
    out: dict[str, Any] = {"l1": l1s, "cells": cells, "summary": summary}
    if saturation:
        out["saturation"] = saturation
    if args.axis:
        pair = (policies[0], policies[1])
        rows = axis_rows(cells, pair, others)
        out["axis"] = {"rows": rows, "summary": axis_summary(rows, policies[1])}
        print(format_axis(rows, out["axis"]["summary"], pair), flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
