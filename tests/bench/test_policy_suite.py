"""The policy suite's summary: what it averages, and over which cells (agentflow bench policy_suite
is a script; its report is checked here on hand-made results, not on a run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.bench.scheduler.policy_suite import Cell, report

POLICIES = ["vllm", "sagesched", "flowsage", "oracle"]


def entry(p95: float, slo: float, goodput: float) -> dict:
    return {"p95": p95, "mean": p95 / 2, "slo": slo, "goodput": goodput}


def test_a_policy_at_zero_goodput_in_a_cell_does_not_leave_that_cell_out_of_its_means() -> None:
    a, b = Cell("trace1"), Cell("trace2")
    results = {"cells": {
        a.name: {"rate": 1.0, "policies": {
            "vllm": entry(400, 0.5, 0.02), "sagesched": entry(300, 0.8, 0.04),
            "flowsage": entry(240, 0.9, 0.05), "oracle": entry(250, 0.9, 0.05)}},
        # deeply overloaded: sagesched met no deadline at all
        b.name: {"rate": 1.0, "policies": {
            "vllm": entry(100, 0.1, 0.01), "sagesched": entry(90, 0.0, 0.0),
            "flowsage": entry(99, 0.05, 0.005), "oracle": entry(99, 0.05, 0.005)}}}}
    text = report(results, POLICIES, [a, b])
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and "x |" in line}
    # attainment is averaged, zeros included: sagesched (0.8 + 0) / 2, not 0.8
    assert float(rows["sagesched"][2]) == pytest.approx(0.4)
    # goodput only over the cell where every policy's is positive (trace1): 0.04 / 0.02
    assert rows["sagesched"][4] == "2.00x" and rows["flowsage"][4] == "2.50x"
    assert "over the 1 cells where every policy's is positive" in text
    # P95: geometric means over both cells; flowsage vs the best other (oracle excluded)
    assert float(rows["flowsage"][0]) == pytest.approx((240 * 99) ** 0.5, abs=0.05)
    assert "best other (sagesched): 0.938" in text
    assert "worst cell ratio to the best other policy in that cell: 1.100" in text


def test_a_workload_with_no_load_level_is_named_in_the_report_and_its_cells_left_out() -> None:
    a = Cell("trace1")
    results = {"cells": {a.name: {"rate": 1.0, "policies": {
        "vllm": entry(400, 0.5, 0.02), "sagesched": entry(300, 0.8, 0.04),
        "flowsage": entry(240, 0.9, 0.05), "oracle": entry(250, 0.9, 0.05)}}},
        "no_l1": {"mixed/hetero-64": "vllm's P95 never doubled with 512 queries"}}
    text = report(results, POLICIES, [a, Cell("mixed", cluster="hetero-64")])
    assert "Skipped `mixed/hetero-64`: no load level L1 (vllm's P95 never doubled" in text
    assert "best other (sagesched): 0.800" in text  # the skipped cell is in no mean


def test_a_run_of_flowsage_alone_is_reported_without_a_best_other() -> None:
    """``--policies flowsage[,oracle]`` (re-measuring flowsage on cells whose baselines are
    known) used to end in ``min()`` of nothing after every cell had run."""
    a = Cell("trace1")
    results = {"cells": {a.name: {"rate": 1.0, "policies": {
        "flowsage": entry(240, 0.9, 0.05), "oracle": entry(250, 0.9, 0.05)}}}}
    text = report(results, ["flowsage", "oracle"], [a])
    assert "| trace1/paper-4gpu/poisson/2x | 1 | 240 | 250 | - |" in text
    assert "flowsage geomean P95 / best other" not in text
    assert "flowsage geomean P95 / oracle: 0.960" in text


def test_a_run_too_short_to_load_the_cluster_raises_its_own_error() -> None:
    """The suite skips only this case (no load level), not any simulator error."""
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.experiment import NoLoadLevel, loaded_rate
    from agentflow.sim.slo import IdleLatency
    from agentflow.sim.workload import load_hexgen

    trace_file = Path(__file__).resolve().parents[3] / "shared/traces/hexgen-flow/trace1.json"
    if not trace_file.exists():
        pytest.skip("shared traces absent")
    cluster = load_cluster("paper-4gpu")
    trace = load_hexgen(trace_file)[:3]
    # three queries cannot double vllm's P95 at any rate; the search may double once
    with pytest.raises(NoLoadLevel, match="never doubled with 3 queries"):
        loaded_rate(cluster, trace, IdleLatency(cluster), n=3, seed=1, idle_rate=1e-5,
                    low=0.0, high=1e-5, iterations=1, max_high=2e-5)
