"""The queue-choice benchmark's own arithmetic: depths per GPU kind, the tuned pick, the
geometric means over cells, and a real (small) cell run end to end in the simulator."""

from __future__ import annotations

import argparse

import pytest

from agentflow.bench.scheduler.queue_choice import (
    PARTS,
    RISK_CLASSES,
    best_depth_per_kind,
    parse_depths,
    risk_class,
    run_cell,
    run_depth,
    summarize,
    with_depth,
)
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.experiment import build_workload
from agentflow.sim.workload import TraceNode, TraceQuery

CLUSTER = SimClusterConfig(name="two-kinds", instances=[
    SimInstanceConfig(gpu="H100", model="Llama-3.1-8B"),
    SimInstanceConfig(gpu="A6000", model="Llama-3.1-8B", max_pending_prefill=4)])


def test_depths_parse_and_reject_nonsense() -> None:
    assert parse_depths("1, 2,off") == [1, 2, None]
    for bad in ("0", "two", "-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_depths(bad)


def test_a_depth_per_kind_leaves_unnamed_kinds_as_configured() -> None:
    out = with_depth(CLUSTER, {"H100": 1})
    assert [i.max_pending_prefill for i in out.instances] == [1, 4]
    assert [i.max_pending_prefill for i in with_depth(CLUSTER, None).instances] == [None, None]


def test_the_tuned_depth_is_each_kinds_fastest_calls() -> None:
    sweep = {1: {"call_s_by_kind": {"H100": 5.0, "A6000": 9.0}},
             2: {"call_s_by_kind": {"H100": 4.0, "A6000": 9.0}},
             None: {"call_s_by_kind": {"H100": 4.5}}}  # no call ran on the A6000
    # H100: depth 2 is fastest; A6000: a tie between 1 and 2 goes to the smaller bound
    assert best_depth_per_kind(sweep) == {"A6000": 1, "H100": 2}


def test_the_summary_is_geometric_over_cells() -> None:
    def cell(a: float, b: float, other: float) -> dict:
        runs = {"fs": {"p95": a}, "md": {"p95": b}}
        return {"depths": {"2": runs}, "own": {**runs, "x": {"p95": other},
                                                "y": {"p95": other * 2}}}
    s = summarize({"c1": cell(1.0, 2.0, 4.0), "c2": cell(2.0, 1.0, 1.0)}, ("fs", "md"),
                  ["x", "y"])
    assert s["fs/md"]["2"] == pytest.approx(1.0)  # sqrt(0.5 * 2)
    assert s["fs/best other"] == pytest.approx((0.25 * 2.0) ** 0.5)


def test_a_small_cell_runs_every_depth_the_tuned_pick_and_the_others() -> None:
    trace = [TraceQuery(id=f"t{i}", question=f"question {i}", nodes=[
        TraceNode("a", "link", "llm", (), 2000, 40),
        TraceNode("b", "generate", "llm", ("a",), 3000, 200),
        TraceNode("c", "generate", "llm", ("a",), 3000, 200),
        TraceNode("d", "select", "llm", ("b", "c"), 1500, 20)]) for i in range(6)]
    wl = build_workload(trace, CLUSTER, n=12, rate=2.0, seed=1)
    cell = run_cell(CLUSTER, wl, ["flowsage", "marginal_delay+fcfs"], ["vllm"], [1, None])
    assert set(cell["depths"]) == {"1", "off", "tuned"}
    for runs in cell["depths"].values():
        for f in runs.values():
            assert f["done"] == 12 and 0.0 <= f["wait_share"] < 1.0
            assert f["admissions"] >= 48  # every call admitted at least once
    # with no bound nothing waits in agentflow's queue beside another call: no choice made
    assert all(f["choice"] == 0 for f in cell["depths"]["off"].values())
    assert set(cell["own"]) == {"flowsage", "marginal_delay+fcfs", "vllm"}
    assert set(cell["tuned_depths"]["flowsage"]) <= {"H100", "A6000"}


def test_attribution_parts_add_up_to_the_calls_time() -> None:
    trace = [TraceQuery(id=f"t{i}", question=f"question {i}", nodes=[
        TraceNode("a", "link", "llm", (), 6000, 40),
        TraceNode("b", "generate", "llm", ("a",), 3000, 400),
        TraceNode("c", "generate", "llm", ("a",), 3000, 400)]) for i in range(6)]
    wl = build_workload(trace, CLUSTER, n=12, rate=2.0, seed=1)
    f = run_depth(CLUSTER, wl, "marginal_delay+fcfs", attribute=True)
    where = f["where"]
    assert set(where) == set(PARTS)
    assert where["solo"] > 0 and where["stall"] > 0  # prompts arrived beside decodes
    assert min(where.values()) >= -1e-9
    calls = sum(f["calls_by_kind"].values())
    assert calls == 36
    mean_call = sum(s * n for s, n in zip(f["call_s_by_kind"].values(),
                                           f["calls_by_kind"].values())) / calls
    assert sum(where.values()) == pytest.approx(mean_call, rel=1e-6)
    assert run_depth(CLUSTER, wl, "marginal_delay+fcfs")["where"] == {}


def test_stall_by_risk_splits_the_attributed_stall_and_changes_nothing() -> None:
    """The who-stalled-whom table sums to the stall the engines attribute to the calls'
    decodes (every decoder and prompt is a running call the coordinator knows), and turning
    it on changes no result (it only reads)."""
    trace = [TraceQuery(id=f"t{i}", question=f"question {i}", nodes=[
        TraceNode("a", "link", "llm", (), 6000, 40),
        TraceNode("b", "generate", "llm", ("a",), 3000, 400),
        TraceNode("c", "generate", "llm", ("a",), 3000, 400)]) for i in range(6)]
    wl = build_workload(trace, CLUSTER, n=12, rate=2.0, seed=1)
    on = run_depth(CLUSTER, wl, "flowsage", attribute=True, by_risk=True)
    off = run_depth(CLUSTER, wl, "flowsage")
    assert (on["p95"], on["mean"], on["choice"]) == (off["p95"], off["mean"], off["choice"])
    table = on["stall_by_risk"]
    assert set(table) == set(RISK_CLASSES) and all(set(r) == set(RISK_CLASSES)
                                                   for r in table.values())
    total = sum(v for r in table.values() for v in r.values())
    calls = sum(on["calls_by_kind"].values())
    assert total > 0
    assert total == pytest.approx(on["where"]["stall"] * calls, rel=1e-6)
    assert off["stall_by_risk"] == {}


def test_risk_classes_use_the_holds_thresholds() -> None:
    assert [risk_class(p) for p in (0.0, 0.02, 0.1, 0.39, 0.4, 1.0)] == [
        "safe", "safe", "middle", "middle", "at_risk", "at_risk"]
