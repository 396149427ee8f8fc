"""What a simulation run is judged by: latency percentiles, throughput, SLO attainment —
computed by ``agentflow.metrics``, as every other report is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentflow.metrics import (
    SLO_SCALES,
    Outcome,
    absolute_attainment,
    attainment_table,
    completed_latencies,
    latency_stats,
    throughput,
)


def outcomes(result) -> list[Outcome]:
    return [Outcome(r.status, r.latency_s, r.idle_latency_s, r.slo_s) for r in result.records]


def summarize_records(records: Sequence[Any], scales=SLO_SCALES) -> dict[str, Any]:
    """The metrics of any subset of a run's query records (a policy's, one tenant's)."""
    done = [r for r in records if r.status == "done"]
    qps, makespan = throughput(("sim", r.arrival, r.finish, r.status) for r in records)
    outs = [Outcome(r.status, r.latency_s, r.idle_latency_s, r.slo_s) for r in records]
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
        **_preempted(records),
    }


def _preempted(records: Sequence[Any]) -> dict[str, int]:
    """Calls stopped for a better class (``scheduler.preemption``), only when it was on."""
    counts = [r.preemptions for r in records if getattr(r, "preemptions", None) is not None]
    return {"preempted_calls": sum(counts)} if counts else {}


def summarize(result, scales=SLO_SCALES) -> dict[str, Any]:
    summary = summarize_records(result.records, scales)
    tenants = tenant_summaries(result.records, scales)
    if tenants:  # shared-cluster runs only: a one-tenant run's summary is unchanged
        summary["tenants"] = tenants
    return summary


def tenant_summaries(records: Sequence[Any], scales=SLO_SCALES) -> dict[str, dict[str, Any]]:
    """Per tenant (records that name one), the policy's keys plus ``deadline_attainment``:
    the share of its queries done within the deadline the tenant gave them (None: no query
    of the tenant had one) — what admission control is judged by."""
    groups: dict[str, list[Any]] = {}
    for r in records:
        if getattr(r, "tenant", None) is not None:
            groups.setdefault(r.tenant, []).append(r)
    out = {}
    for name, group in groups.items():
        s = summarize_records(group, scales)
        met = absolute_attainment([Outcome(r.status, r.latency_s, r.idle_latency_s, r.slo_s)
                                   for r in group])
        s["deadline_attainment"] = None if met is None else met["met"] / len(group)
        out[name] = s
    return out
