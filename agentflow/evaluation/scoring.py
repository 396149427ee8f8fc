"""From per-question records to one run's numbers: accuracy, latency, SLO attainment, cost.

Percentiles, attainment and the attainment keys come from ``agentflow.metrics`` (the one
definition every report shares: only a ``done`` question meets an SLO)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np

from agentflow.accuracy import REASONS
from agentflow.metrics import (
    SLO_SCALES,
    Outcome,
    absolute_attainment,
    attainment_table,
    completed_latencies,
    latency_stats,
)
from agentflow.metrics import throughput as _throughput

CURVE_SCALES = tuple(float(x) for x in np.round(np.arange(1.0, 10.001, 0.25), 2))
LEVEL_ORDER = ("easy", "medium", "hard", "extra", "simple", "moderate", "challenging", "unknown")
# the query came back: an answer (unsure: below min_confidence, still answered), or a reason
# it has none
COMPLETED = ("done", "unsure", "failed")


dist = latency_stats  # the summary's distributions (latency, queue and run time, ...)


def _acc(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Execution accuracy over the questions that could be judged (a replayed trace without
    a gold answer cannot); a question with no answer at all counts as wrong."""
    judged = [r for r in records if r.get("correct") is not None]
    n = len(judged)
    correct = sum(bool(r["correct"]) for r in judged)
    correct_bird = sum(bool(r.get("correct_bird")) for r in judged)
    return {"n": n, "correct": correct, "accuracy": correct / n if n else None,
            "correct_bird": correct_bird, "accuracy_bird": correct_bird / n if n else None}


def level_key(level: str) -> tuple[int, str]:
    return (LEVEL_ORDER.index(level) if level in LEVEL_ORDER else len(LEVEL_ORDER), level)


def throughput(records: list[dict[str, Any]]) -> tuple[float | None, float]:
    """Answered questions per second of serving time (``agentflow.metrics.throughput``)."""
    return _throughput((r.get("session", ""), r.get("arrival_s"), r.get("finish_s"),
                        r.get("status", "")) for r in records)


def summarize_run(records: list[dict[str, Any]], *, slo_scale: float) -> dict[str, Any]:
    completed = [r for r in records if r.get("status") in COMPLETED]
    reasons = Counter(r.get("reason", "unknown") for r in records)
    by_reason = {k: reasons.get(k, 0) for k in (*REASONS, "no_sql")}
    by_reason.update({k: v for k, v in reasons.items() if k not in by_reason})

    by_level: dict[str, list] = defaultdict(list)
    by_db: dict[str, list] = defaultdict(list)
    for r in records:
        by_level[r.get("difficulty") or "unknown"].append(r)
        by_db[r.get("db_id") or "?"].append(r)

    stage_nodes: dict[str, list[dict]] = defaultdict(list)
    for r in completed:
        for row in r.get("stages") or []:
            stage_nodes[row["stage"]].append(row)
    stages = {}
    for stage, rows in stage_nodes.items():
        stages[stage] = {
            "nodes": len(rows),
            "per_question": len(rows) / len(completed) if completed else None,
            "duration_s": dist([row["end"] - row["start"] for row in rows]),
            "queue_s_mean": float(np.mean([row.get("queue_s", 0.0) for row in rows])),
            "run_s_mean": float(np.mean([row.get("run_s", 0.0) for row in rows])),
            "calls": sum(row.get("calls", 0) for row in rows),
        }
    qps, span = throughput(records)
    statuses = Counter(r.get("status", "?") for r in records)
    slo_scales = sorted({*SLO_SCALES, float(slo_scale)})
    outcomes = [Outcome.of(r) for r in records]
    n_c = len(completed)
    return {
        "questions": len(records),
        "status": dict(statuses),
        "accuracy": {**_acc(records), "by_reason": by_reason},
        "by_difficulty": {k: _acc(by_level[k]) for k in sorted(by_level, key=level_key)},
        "by_database": {k: _acc(by_db[k]) for k in sorted(by_db)},
        "latency_s": dist(completed_latencies(outcomes)),  # answered questions
        "idle_latency_s": dist([r.get("idle_latency_s") for r in completed]),
        "queue_s_per_question": dist([r.get("queue_s", 0.0) for r in completed]),
        "run_s_per_question": dist([r.get("run_s", 0.0) for r in completed]),
        "stages": dict(sorted(stages.items(), key=lambda kv: -kv[1]["duration_s"]["mean"])),
        "slo_attainment": attainment_table(outcomes, slo_scales),
        "slo_curve": attainment_table(outcomes, CURVE_SCALES),
        "slo_scale": float(slo_scale),
        "slo_absolute": absolute_attainment(outcomes),
        "throughput_qps": qps,
        "serving_span_s": span,
        # A replayed trace line of another run may carry no usage (None): it counts as 0.
        "usage_per_question": {
            k: float(np.mean([r.get(k) or 0 for r in completed])) if n_c else None
            for k in ("calls", "prompt_tokens", "completion_tokens")},
        "usage_total": {k: int(sum(r.get(k) or 0 for r in records))
                        for k in ("calls", "prompt_tokens", "completion_tokens")},
    }
