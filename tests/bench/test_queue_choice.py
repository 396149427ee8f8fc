"""The queue-choice benchmark's own arithmetic: depths per GPU kind, the tuned pick, the
geometric means over cells, and a real (small) cell run end to end in the simulator."""

from __future__ import annotations

import argparse
import math
import statistics

import pytest

from agentflow.bench.scheduler.queue_choice import (
    AXIS_LOADS,
    PARTS,
    RISK_CLASSES,
    at_risk_share,
    axis_defaults,
    axis_rows,
    axis_summary,
    best_depth_per_kind,
    format_axis,
    parse_depths,
    parse_seeds,
    parse_targets,
    point_label,
    risk_class,
    run_cell,
    run_depth,
    saturation_points,
    saturation_rate,
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


def test_seeds_take_lists_and_inclusive_ranges() -> None:
    assert parse_seeds("1,2,5-8") == [1, 2, 5, 6, 7, 8]
    assert parse_seeds("1-3") == [1, 2, 3]
    for bad in ("3-1", "a", "1-b", "", "-2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_seeds(bad)


def test_the_axis_preset_fills_only_what_was_not_named() -> None:
    args = argparse.Namespace(clusters="hetero-8", loads=[1.5, 2.0], l1="",
                              pending=[1, 2, None])
    axis_defaults(args, ["--axis", "--clusters", "hetero-8"])
    assert args.clusters == "hetero-8"  # named: kept
    assert args.loads == list(AXIS_LOADS) == [1.5, 2.0, 3.0]
    assert args.pending == [2] and "hetero-8=" in args.l1
    args = argparse.Namespace(clusters="x", loads=[4.0], l1="x=1", pending=[1])
    axis_defaults(args, ["--axis", "--loads=4", "--l1", "x=1", "--pending", "1"])
    assert (args.loads, args.l1, args.pending) == ([4.0], "x=1", [1])


def test_at_risk_share_is_the_stall_on_at_risk_decodes() -> None:
    table = {"at_risk": {"at_risk": 1.0, "middle": 0.0, "safe": 3.0},
             "middle": {"at_risk": 0.0, "middle": 2.0, "safe": 0.0},
             "safe": {"at_risk": 0.0, "middle": 0.0, "safe": 14.0}}
    assert at_risk_share(table) == pytest.approx(0.2)
    zero = {d: {p: 0.0 for p in RISK_CLASSES} for d in RISK_CLASSES}
    assert at_risk_share(zero) is None


def _axis_cell(cluster: str, load: float, seed: int, fs: float, md: float, other: float,
               wait_md: float) -> dict:
    def run(p95: float, wait: float, table: dict | None = None) -> dict:
        return {"p95": p95, "wait_share": wait, "choice": 3, "admissions": 10,
                "stall_by_risk": table or {}}
    table = {"at_risk": {"safe": 1.0}, "middle": {}, "safe": {"safe": 3.0}}
    return {"cluster": cluster, "load": load, "seed": seed,
            "own": {"fs": run(fs, 0.01), "md": run(md, wait_md, table),
                    "x": run(other, 0.0), "y": run(other * 3, 0.0)}}


def test_axis_rows_and_means_per_load_cluster_all_and_contended() -> None:
    cells = {"a/x1.5/s1": _axis_cell("a", 1.5, 1, 1.0, 2.0, 4.0, 0.01),
             "a/x3/s1": _axis_cell("a", 3.0, 1, 2.0, 1.0, 1.0, 0.08),
             "b/x3/s1": _axis_cell("b", 3.0, 1, 1.0, 1.0, 2.0, 0.02)}
    rows = axis_rows(cells, ("fs", "md"), ["x", "y"])
    assert [r["ratio"] for r in rows] == [0.5, 2.0, 1.0]
    assert [r["vs_best"] for r in rows] == [0.25, 2.0, 0.5]
    assert all(r["best"] == "x" for r in rows)
    assert rows[0]["at_risk"] == pytest.approx(0.25)
    assert rows[0]["choice"]["md"] == (3, 10) and rows[1]["wait"]["md"] == 0.08
    s = axis_summary(rows, "md", contended_wait=0.05)
    assert s["x3"]["n"] == 2 and s["x3"]["ratio"] == pytest.approx(2.0 ** 0.5)
    assert s["a"]["ratio"] == pytest.approx(1.0)  # sqrt(0.5 * 2)
    assert s["b x3"]["vs_best"] == pytest.approx(0.5)
    assert s["all"]["n"] == 3 and s["all"]["ratio"] == pytest.approx(1.0)
    logs = [math.log(0.5), math.log(2.0), 0.0]
    assert s["all"]["se"] == pytest.approx(statistics.stdev(logs) / math.sqrt(3))
    assert math.isnan(s["b x3"]["se"])  # one cell: no spread to read
    contended = s["contended (md wait >= 0.05)"]
    assert contended["n"] == 1 and contended["ratio"] == pytest.approx(2.0)
    text = format_axis(rows, s, ("fs", "md"))
    assert "a/x3/s1" in text and "0.250" in text
    none = axis_summary(rows, "md", contended_wait=0.5)["contended (md wait >= 0.5)"]
    assert none["n"] == 0  # reported, not dropped, when no cell contends


def test_the_stall_table_can_be_kept_for_one_policy_only() -> None:
    trace = [TraceQuery(id=f"t{i}", question=f"question {i}", nodes=[
        TraceNode("a", "link", "llm", (), 6000, 40),
        TraceNode("b", "generate", "llm", ("a",), 3000, 400)]) for i in range(4)]
    wl = build_workload(trace, CLUSTER, n=8, rate=2.0, seed=1)
    cell = run_cell(CLUSTER, wl, ["flowsage", "marginal_delay+fcfs"], [], [2],
                    by_risk=["marginal_delay+fcfs"])
    own = cell["own"]
    assert own["flowsage"]["stall_by_risk"] == {}
    assert set(own["marginal_delay+fcfs"]["stall_by_risk"]) == set(RISK_CLASSES)


def _falling(half: float, calls: list[float]):
    """An SLO attainment that falls with the rate, 0.5 at ``half``; records each rate run."""
    def attainment(rate: float) -> float:
        calls.append(rate)
        return 1.0 / (1.0 + (rate / half) ** 2)
    return attainment


def test_saturation_brackets_by_doubling_then_bisects_in_log_rate() -> None:
    calls: list[float] = []
    seen: dict[float, float] = {}
    rate = saturation_rate(_falling(3.0, calls), 0.5, start=1.0, iterations=6, seen=seen)
    # doubled 1 -> 2 -> 4 (bracket [2, 4]), then 6 bisections: within 2^(1/128) of 3
    assert calls[:3] == [1.0, 2.0, 4.0] and len(calls) == 3 + 6
    assert abs(math.log(rate / 3.0)) <= math.log(2.0) / 2 ** 7 + 1e-12
    lo = max(r for r, a in seen.items() if a >= 0.5)
    hi = min(r for r, a in seen.items() if a < 0.5)
    assert lo < rate < hi and rate == pytest.approx(math.sqrt(lo * hi))
    # a second target reads the bracket from what was run: no new doubling
    calls.clear()
    high = saturation_rate(_falling(3.0, calls), 0.8, start=1.0, iterations=3, seen=seen)
    assert calls == pytest.approx([2 ** 0.5, 2 ** 0.75, 2 ** 0.625])  # bisecting [1, 2]
    assert high < rate and abs(math.log(high / 1.5)) <= math.log(2.0) / 2 ** 4


def test_saturation_halves_from_a_start_past_the_target_and_fails_where_none_is() -> None:
    calls: list[float] = []
    rate = saturation_rate(_falling(0.3, calls), 0.5, start=1.0, iterations=0)
    assert calls == [1.0, 0.5, 0.25] and rate == pytest.approx(math.sqrt(0.125))
    with pytest.raises(ValueError, match="no rate brackets"):
        saturation_rate(lambda rate: 1.0, 0.5, start=1.0, max_steps=3)


def test_saturation_targets_parse_and_label() -> None:
    assert parse_targets("0.9,0.7, 0.5") == [0.9, 0.7, 0.5]
    for bad in ("1", "0", "1.2", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_targets(bad)
    assert [point_label(t) for t in (0.9, 0.7, 0.5, 0.333)] == ["slo90", "slo70", "slo50",
                                                                "slo33"]


def test_saturation_points_read_the_baselines_attainment_in_a_real_simulation() -> None:
    from agentflow.sim.slo import IdleLatency
    trace = [TraceQuery(id=f"t{i}", question=f"question {i}", nodes=[
        TraceNode("a", "link", "llm", (), 8000, 50),
        TraceNode("b", "generate", "llm", ("a",), 8000, 50)]) for i in range(6)]
    idle = IdleLatency(CLUSTER)  # prompt-heavy: deadlines are missed from ~2 q/s
    rates, seen = saturation_points(CLUSTER, trace, idle, [0.5], [1], 30,
                                    "marginal_delay+fcfs", start=1.0, iterations=2)
    rate = rates[0.5]
    lo = max(r for r, a in seen.items() if a >= 0.5)
    hi = min(r for r, a in seen.items() if r > lo and a < 0.5)
    assert lo < rate < hi
    # the reading is the baseline's own: rerun at the bracket's ends
    for r, want in ((lo, True), (hi, False)):
        wl = build_workload(trace, CLUSTER, n=30, rate=r, seed=1, idle=idle)
        assert (run_depth(CLUSTER, wl, "marginal_delay+fcfs")["slo"] >= 0.5) is want


def test_axis_groups_saturation_points_by_their_label() -> None:
    cells = {"a/slo90/s1": _axis_cell("a", 1.2, 1, 1.0, 2.0, 4.0, 0.01),
             "a/slo90/s2": _axis_cell("a", 1.2, 2, 1.0, 1.0, 4.0, 0.01),
             "a/slo50/s1": _axis_cell("a", 2.7, 1, 2.0, 1.0, 1.0, 0.08)}
    for key, cell in cells.items():
        cell["point"] = key.split("/")[1]
    rows = axis_rows(cells, ("fs", "md"), ["x", "y"])
    assert [r["point"] for r in rows] == ["slo90", "slo90", "slo50"]
    s = axis_summary(rows, "md")
    assert s["slo90"]["n"] == 2 and s["slo90"]["ratio"] == pytest.approx(0.5 ** 0.5)
    assert s["a slo50"]["n"] == 1 and "x1.2" not in s
