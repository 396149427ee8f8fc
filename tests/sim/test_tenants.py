"""Tenants sharing a simulated cluster: ``agentflow simulate --tenant``, per-tenant metrics, and
the one-tenant path left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.cli.main import main
from agentflow.sim.cluster import load_cluster
from agentflow.sim.experiment import build_tenant_workload, build_workload, run_policy
from agentflow.sim.workload import TenantSpec
from tests.sim.test_driver import small_trace

KEYS = {"queries", "completed", "failed", "rejected", "mean", "p50", "p95", "p99",
        "slo_attainment"}
OLD_CONFIG = {"trace", "cluster", "rate", "arrival", "queries", "seed", "slo_scale",
              "deadline", "alpha", "cached_prefix", "faults", "tune_alpha"}


def test_tenant_spec_parses_and_says_what_is_wrong() -> None:
    assert TenantSpec.parse("ui:0.5:30:interactive") == TenantSpec("ui", 0.5, 30.0,
                                                                   "interactive")
    assert TenantSpec.parse("eval:2:none:batch").slo_s is None
    assert TenantSpec.parse("a:1:10").slo_class is None
    for bad, why in (("ui:0.5", "expected NAME"), ("ui:x:3", "not a number"),
                     ("ui:0:3", "positive"), ("ui:1:-2", "positive"), (":1:2", "NAME")):
        with pytest.raises(ValueError, match=why):
            TenantSpec.parse(bad)


def test_a_tenant_draws_the_same_queries_whoever_shares_the_cluster() -> None:
    cluster, trace = load_cluster("paper-4gpu"), small_trace()
    a = TenantSpec("a", 0.2, 60.0)
    alone = build_tenant_workload(trace, cluster, [a], n=5, seed=3)
    shared = build_tenant_workload(trace, cluster, [TenantSpec("b", 1.0, None, "batch"), a],
                                   n=5, seed=3)
    assert alone.tenants is not None and shared.tenants is not None
    mine = [(t, q.id) for t, q, who in zip(shared.arrivals, shared.queries, shared.tenants)
            if who == "a"]
    assert mine == [(t, q.id) for t, q in zip(alone.arrivals, alone.queries)]
    assert shared.arrivals == sorted(shared.arrivals) and len(shared.queries) == 10
    assert shared.deadlines(2.0).count(None) == 5  # the batch tenant's: its class decides
    other_seed = build_tenant_workload(trace, cluster, [a], n=5, seed=4)
    assert other_seed.arrivals != alone.arrivals
    with pytest.raises(ValueError, match="unique"):
        build_tenant_workload(trace, cluster, [a, a], n=5)


def test_per_tenant_metrics_and_classes_reach_the_scheduler() -> None:
    cluster, trace = load_cluster("paper-4gpu"), small_trace()
    wl = build_tenant_workload(trace, cluster, [TenantSpec("ui", 0.5, 100.0, "interactive"),
                                                TenantSpec("eval", 2.0, None, "batch")],
                               n=6, seed=1)
    result = run_policy(cluster, wl, "flowsage")
    summary = result.summary()
    assert set(summary["tenants"]) == {"ui", "eval"}
    for t in summary["tenants"].values():
        assert KEYS <= set(t) and t["queries"] == 6
    assert sum(t["completed"] for t in summary["tenants"].values()) == summary["completed"]
    batch = [r for r in result.records if r.tenant == "eval"]
    assert all(r.slo_class == "batch" and r.slo_s is None for r in batch)
    assert summary["tenants"]["eval"]["deadline_attainment"] is None  # no deadline to meet
    # one tenant's runs have no per-tenant block
    plain = run_policy(cluster, build_workload(trace, cluster, n=6, rate=0.5, seed=1),
                       "flowsage").summary()
    assert "tenants" not in plain


def test_simulate_cli_tenants_in_the_json_and_none_without(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"Text2SQLRequest": [
        {"step": "extract_keywords", "input_length": 650, "output_length": 20},
        {"step": "generate_candidate_llama-agent", "input_length": 4000, "output_length": 200},
        {"step": "evaluate", "input_length": 960, "output_length": 22}]}] * 3))
    common = ["simulate", "--trace", str(trace), "--policy", "vllm,flowsage", "--queries", "8"]
    out = tmp_path / "tenants.json"
    assert main([*common, "--tenant", "ui:0.2:60:interactive", "--tenant",
                 "eval:0.5:none:batch", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [t["name"] for t in data["config"]["tenants"]] == ["ui", "eval"]
    for policy in ("vllm", "flowsage"):
        tenants = data["policies"][policy]["tenants"]
        assert set(tenants) == {"ui", "eval"} and KEYS <= set(tenants["ui"])
        assert tenants["ui"]["queries"] == tenants["eval"]["queries"] == 8
    plain = tmp_path / "plain.json"
    assert main([*common, "--rate", "0.3", "--json", str(plain)]) == 0
    before = json.loads(plain.read_text())
    assert set(before["config"]) == OLD_CONFIG
    assert all("tenants" not in s for s in before["policies"].values())
    with pytest.raises(SystemExit):
        main([*common, "--tenant", "ui:fast:60"])
    with pytest.raises(SystemExit):
        main([*common, "--tenant", "ui:1:60:gold"])
