"""Simulated mode: the recorded answers of a real run, timed on a simulated cluster.

Each recorded query (its DAG of LLM calls with token counts, and tool steps with their
measured durations) is replayed by ``agentflow.sim`` under every policy, with the same
arrivals. Accuracy is the recording's — the SQL does not change — and latency, per-call queue
waits (from the simulator's stage timeline) and SLO attainment come from the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow.datasets import Example
from agentflow.evaluation.records import Judge, difficulty_of, hardness_or_none
from agentflow.evaluation.spec import EvalError
from agentflow.metrics import Outcome, met_slo


@dataclass
class SimSource:
    """The recording one pipeline is replayed from."""

    pipeline: str
    trace_path: Path
    recorded_policy: str | None  # the policy of the real run that made the recording
    queries: list[Any] = field(default_factory=list)  # TraceQuery
    base: dict[str, dict[str, Any]] = field(default_factory=dict)  # query id -> record fields
    skipped: dict[str, int] = field(default_factory=dict)  # why some trace lines were left out


def load_source(pipeline: str, trace_path: Path, recorded_policy: str | None, *,
                records_by_query: dict[str, dict[str, Any]], strict: bool,
                examples_by_question: dict[tuple[str, str], Example],
                kind: str | None, judge: Judge | None) -> SimSource:
    """Trace queries of ``pipeline`` worth replaying, each with what its record says.

    ``records_by_query`` maps a query id to the real run's per-question record (its verdict,
    tokens). ``strict``: the trace belongs to that run, so a trace line without a record (a
    try that was cancelled, or superseded by a later one) is left out; otherwise such a line
    is judged afresh against the dataset's gold SQL, matched by database and question.
    """
    import json

    from agentflow.sim.workload import load_agentflow

    source = SimSource(pipeline, trace_path, recorded_policy)
    meta: dict[str, dict[str, Any]] = {}
    with trace_path.open() as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                meta[str(rec.get("query_id"))] = rec
    skipped = {"other pipeline": 0, "not finished": 0, "no record (cancelled or retried)": 0,
               "question asked again later": 0, "no recorded stages": 0}
    chosen: dict[str, tuple[Any, dict[str, Any]]] = {}  # example id -> (query, base)
    for query in load_agentflow(trace_path):
        rec = meta.get(query.id, {})
        if (rec.get("pipeline") or {}).get("name", pipeline) != pipeline:
            skipped["other pipeline"] += 1
            continue
        if rec.get("status") not in ("done", "unsure", "failed"):
            skipped["not finished"] += 1
            continue
        base = records_by_query.get(query.id)
        if base is None and strict:
            skipped["no record (cancelled or retried)"] += 1
            continue
        if not query.nodes:
            skipped["no recorded stages"] += 1
            continue
        if base is None:
            base = _judged(rec, examples_by_question, kind, judge) or {
                "example_id": query.id, "db_id": rec.get("db_id"),
                "question": rec.get("question"), "difficulty": "unknown",
                "difficulty_source": None, "gold_sql": None, "pred_sql": rec.get("sql"),
                "correct": None, "reason": "no_gold", "correct_bird": None,
                "reason_bird": "no_gold", **_usage(rec)}
        base = {**base, "recorded_status": rec.get("status"),
                "recorded_latency_s": rec.get("latency_s"), "query_id": query.id}
        if base["example_id"] in chosen:
            skipped["question asked again later"] += 1  # the latest try wins
        chosen[base["example_id"]] = (query, base)
    for query, base in chosen.values():
        source.queries.append(query)
        source.base[query.id] = base
    source.skipped = {k: v for k, v in skipped.items() if v}
    return source


def _judged(rec: dict[str, Any], examples_by_question: dict[tuple[str, str], Example],
            kind: str | None, judge: Judge | None) -> dict[str, Any] | None:
    example = examples_by_question.get((rec.get("db_id", ""), rec.get("question", "")))
    if example is None or judge is None:
        return None
    level, src = difficulty_of(example, kind or "spider")
    return {"example_id": example.id, "db_id": example.db_id, "question": example.question,
            "difficulty": level, "difficulty_source": src,
            "spider_hardness": hardness_or_none(example.gold_sql),
            "gold_sql": example.gold_sql, "pred_sql": rec.get("sql"),
            **judge.judge(example, rec.get("sql")), **_usage(rec)}


def _usage(rec: dict[str, Any]) -> dict[str, int]:
    """LLM calls and tokens of a recorded query, from its trace line."""
    calls = [c for n in rec.get("nodes", []) for c in n.get("calls") or []]
    return {"calls": len(calls),
            "prompt_tokens": sum(c.get("prompt_tokens") or 0 for c in calls),
            "completion_tokens": sum(c.get("completion_tokens") or 0 for c in calls)}


KEEP = ("example_id", "db_id", "question", "difficulty", "difficulty_source", "spider_hardness",
        "gold_sql", "pred_sql", "error", "correct", "reason", "detail", "correct_bird",
        "reason_bird", "calls", "prompt_tokens", "completion_tokens", "usage_by_stage",
        "recorded_status", "recorded_latency_s", "query_id")


def simulate(source: SimSource, *, cluster_name: str, policies: list[str], rate: float,
             arrival: str, seed: int, slo_scale: float,
             on_record=None, slo_class: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per policy, one record per replayed query: the recorded answer, the simulated timing;
    every query runs in ``slo_class`` (None: the default class)."""
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.experiment import build_workload
    from agentflow.sim.slo import IdleLatency

    if not source.queries:
        raise EvalError(f"nothing to replay for pipeline {source.pipeline!r}: "
                        f"{source.trace_path} has no finished query with recorded stages")
    cluster = load_cluster(cluster_name)
    idle = IdleLatency(cluster)
    workload = build_workload(source.queries, cluster, n=len(source.queries), rate=rate,
                              arrival=arrival, seed=seed, idle=idle)
    out: dict[str, list[dict[str, Any]]] = {}
    for policy in policies:
        result, timelines = _run(cluster, workload, policy, slo_scale, slo_class)
        records = []
        for trace_query, sim in zip(workload.queries, result.records):
            base = source.base[trace_query.id]
            rows = _stage_rows(timelines.get(sim.id), sim.arrival)
            status = sim.status  # a recorded failure replays as a failure (see sim.driver)
            rec = {k: base.get(k) for k in KEEP}
            rec.update({
                "pipeline": source.pipeline, "policy": policy, "mode": "simulated",
                "cluster": cluster.name, "session": "sim", "sim_id": sim.id,
                "status": status, "sim_reason": sim.reason,
                "arrival_s": sim.arrival, "finish_s": sim.finish,
                "latency_s": sim.latency_s, "idle_latency_s": sim.idle_latency_s,
                "slo_s": sim.slo_s, "slo_class": sim.slo_class,
                "met_slo": met_slo(Outcome(status, sim.latency_s, slo_s=sim.slo_s)),
                "queue_s": sum(r["queue_s"] for r in rows),
                "run_s": sum(r["run_s"] for r in rows), "stages": rows})
            records.append(rec)
            if on_record is not None:
                on_record(policy, rec)
        out[policy] = records
    return out


def _run(cluster, workload, policy: str, slo_scale: float, slo_class: str | None = None):
    """``run_policy`` that also collects every stage's timing (by simulated query id)."""
    from agentflow.sim.driver import Simulation

    timelines: dict[str, list] = {}
    sim = Simulation(cluster, policy,
                     on_stage=lambda t: timelines.setdefault(t.query_id, []).append(t))
    result = sim.run(workload.queries, workload.arrivals, workload.deadlines(slo_scale),
                     workload.idle_latency_s,
                     classes=None if slo_class is None else [slo_class] * len(workload.queries))
    return result, timelines


def _stage_rows(timings, arrival: float) -> list[dict[str, Any]]:
    """The simulated stages of one query, times relative to its arrival: ``queue_s`` is the
    wait for an instance (the scheduler's queue and the engine's), ``run_s`` the run."""
    rows = []
    for t in sorted(timings or [], key=lambda t: (t.start, t.node_id)):
        llm = t.kind == "llm"
        rows.append({"node": t.node_id, "stage": t.stage, "kind": t.kind,
                     "parents": list(t.parents), "status": "ok",
                     "start": t.start - arrival, "end": t.end - arrival,
                     "queue_s": t.queue_s, "run_s": t.run_s, "instance": t.instance,
                     "calls": 1 if llm else 0,
                     "prompt_tokens": t.prompt_tokens if llm else 0,
                     "completion_tokens": t.output_tokens if llm else 0})
    return rows
