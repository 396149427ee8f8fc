"""What a simulation run is judged by: latency percentiles, throughput, SLO attainment —
computed by ``agentflow.metrics``, as every other report is."""

from __future__ import annotations

from typing import Any

from agentflow.metrics import (
    SLO_SCALES,
    Outcome,
    attainment_table,
    completed_latencies,
    latency_stats,
    throughput,
)


def outcomes(result) -> list[Outcome]:
    return [Outcome(r.status, r.latency_s, r.idle_latency_s, r.slo_s) for r in result.records]


def summarize(result, scales=SLO_SCALES) -> dict[str, Any]:
    records = result.records
    done = [r for r in records if r.status == "done"]
    qps, makespan = throughput(("sim", r.arrival, r.finish, r.status) for r in records)
    outs = outcomes(result)
    stats = latency_stats(completed_latencies(outs))
    return {
        "queries": len(records),
        "completed": len(done),
        "rejected": sum(r.status == "rejected" for r in records),
        "failed": sum(r.status == "failed" for r in records),
        "mean": stats["mean"], "p50": stats["p50"], "p95": stats["p95"], "p99": stats["p99"],
        "makespan": makespan,
        "throughput_qps": qps or 0.0,
        "slo_attainment": attainment_table(outs, scales),
    }
