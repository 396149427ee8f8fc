"""What a simulation run is judged by: latency percentiles, throughput, SLO attainment."""

from __future__ import annotations

from typing import Any

import numpy as np

SCALES = (1.0, 1.5, 2.0, 3.0, 5.0)


def summarize(result, scales=SCALES) -> dict[str, Any]:
    records = result.records
    done = [r for r in records if r.status == "done"]
    lat = np.array([r.latency_s for r in done]) if done else np.zeros(0)
    arrivals = [r.arrival for r in records]
    finishes = [r.finish for r in done]
    makespan = (max(finishes) - min(arrivals)) if done else 0.0

    def pct(q: float) -> float | None:
        return float(np.percentile(lat, q)) if len(lat) else None

    attainment = {}
    for scale in scales:
        met = sum(1 for r in done if r.latency_s <= scale * r.idle_latency_s + 1e-9)
        attainment[f"{scale:.1f}"] = met / len(records) if records else 0.0
    return {
        "queries": len(records),
        "completed": len(done),
        "rejected": sum(r.status == "rejected" for r in records),
        "failed": sum(r.status == "failed" for r in records),
        "mean": float(lat.mean()) if len(lat) else None,
        "p50": pct(50), "p95": pct(95), "p99": pct(99),
        "makespan": makespan,
        "throughput_qps": len(done) / makespan if makespan > 0 else 0.0,
        "slo_attainment": attainment,
    }
