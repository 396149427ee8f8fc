"""agentflow bench real_tenants: the tenant grid's mixes on real engines and in the simulator.
The real side needs a built llama-server and minutes of CPU (run by hand, figures in issue
22's notes); here: what runs, what is compared, and the simulated side end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.bench.fidelity.real_tenants import main, plan, ratio_rows, tenant_stats
from agentflow.sim.workload import TraceNode, TraceQuery

ROOT = Path(__file__).resolve().parents[2]

CLUSTER = ROOT / "examples" / "cluster-llama-server-2cpu.yaml"


def test_each_alone_scenario_runs_once_before_the_mixed_ones() -> None:
    assert plan(["isolation-2x", "isolation-1.5x", "fairness"], ["off", "auto"]) == [
        ("interactive-alone", "off"), ("light-alone", "off"),
        ("isolation-2x", "off"), ("isolation-2x", "auto"),
        ("isolation-1.5x", "off"), ("isolation-1.5x", "auto"),
        ("fairness", "off"), ("fairness", "auto")]
    with pytest.raises(ValueError, match="unknown scenario 'isolation-3x'"):
        plan(["isolation-3x"], ["off"])


def test_the_protected_tenant_is_read_against_its_own_alone_run() -> None:
    stats = tenant_stats({"interactive": [1.0, 2.0, 3.0, 4.0], "batch": [10.0]},
                         {"interactive": 4, "batch": 3})
    assert stats["interactive"]["answers"] == 4 and stats["batch"]["queries"] == 3
    assert stats["interactive"]["p50_s"] == pytest.approx(2.5)
    alone = {"real": {"interactive": {"p95_s": 2.0}}, "sim": {"interactive": {"p95_s": 4.0}}}
    mixed = {"real": {"interactive": {"p95_s": 3.0}, "batch": {"p95_s": 50.0}},
             "sim": {"interactive": {"p95_s": 5.0}}}
    sim_only = {"sim": {"interactive": {"p95_s": 6.0}}}
    rows = ratio_rows({"interactive-alone/off": alone, "isolation-2x/off": mixed,
                       "isolation-2x/auto": sim_only})
    assert rows == [
        {"scenario": "isolation-2x", "preemption": "off", "tenant": "interactive",
         "real": pytest.approx(1.5), "sim": pytest.approx(1.25)},
        {"scenario": "isolation-2x", "preemption": "auto", "tenant": "interactive",
         "real": None, "sim": pytest.approx(1.5)}]


def test_a_tenant_that_answered_nothing_has_no_p95() -> None:
    assert tenant_stats({}, {"batch": 5})["batch"] == {
        "p95_s": None, "p50_s": None, "answers": 0, "queries": 5}


def test_the_simulated_side_runs_the_mixes_end_to_end(tmp_path, monkeypatch, capsys) -> None:
    """A two-stage pipeline on the two-core llama-server cluster file: the interactive
    tenant alone, then beside a batch flood with preemption off and auto; every tenant's
    queries are answered and the ratio rows are printed and written."""
    import json

    from agentflow.bench.fidelity import real_tenants
    nodes = [TraceNode("a", "schema", "llm", (), prompt_tokens=400, output_tokens=30),
             TraceNode("b", "sql", "llm", ("a",), prompt_tokens=600, output_tokens=40)]
    trace = [TraceQuery(f"q{i}", nodes) for i in range(4)]
    monkeypatch.setattr(real_tenants, "load_trace", lambda path: trace)
    out = tmp_path / "r.json"
    main(["--cluster", str(CLUSTER), "--trace", "unused", "--sim-only", "--l1", "0.5",
          "--scale", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "isolation-2x     preemption auto" in printed
    data = json.loads(out.read_text())
    assert set(data["runs"]) == {"interactive-alone/off", "isolation-2x/off",
                                 "isolation-2x/auto"}
    mixed = data["runs"]["isolation-2x/auto"]["sim"]
    assert mixed["interactive"]["answers"] == mixed["interactive"]["queries"] == 20
    assert mixed["batch"]["answers"] == mixed["batch"]["queries"] == 40
    assert all(row["sim"] and row["real"] is None for row in data["ratios"])
