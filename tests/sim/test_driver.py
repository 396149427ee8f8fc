"""The simulator end to end on small slices of the shared traces (and made-up ones)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentflow.cli.main import main
from agentflow.sim.alpha import OnlineAlphaTuner, tune_alpha
from agentflow.sim.cluster import CLUSTERS, load_cluster
from agentflow.sim.experiment import build_workload, run_policy
from agentflow.sim.workload import TraceNode, TraceQuery, arrival_times, load_hexgen

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hexgen-flow"


def small_trace() -> list[TraceQuery]:
    """Three CHESS-like queries: a keyword call, two parallel candidates, a tool, a check."""
    out = []
    for i, (cand, check) in enumerate([(300, 10), (60, 5), (600, 40)]):
        out.append(TraceQuery(id=f"t{i}", question=f"question {i}", nodes=[
            TraceNode("kw", "extract_keywords", "llm", (), 600, 20),
            TraceNode("c0", "generate_candidate", "llm", ("kw",), 3000, cand),
            TraceNode("c1", "generate_candidate", "llm", ("kw",), 3000, cand // 2),
            TraceNode("exec", "execute", "tool", ("c0", "c1"), duration_s=0.05),
            TraceNode("eval", "evaluate", "llm", ("exec",), 900, check),
        ]))
    return out


def test_hexgen_import_groups_parallel_stages() -> None:
    trace = TRACES / "trace1.json"
    if not trace.is_file():
        pytest.skip("shared traces not found")
    queries = load_hexgen(trace)
    assert len(queries) == 90
    q = queries[0]
    cands = [n for n in q.nodes if n.stage == "generate_candidate_llama-agent"]
    assert len(cands) >= 2 and len({n.parents for n in cands}) == 1  # same stage, parallel
    revise = next(n for n in q.nodes if n.stage == "revise")
    assert set(revise.parents) == {n.id for n in cands}


def test_arrival_processes() -> None:
    a = arrival_times(2000, 4.0, "poisson", seed=1)
    assert abs(2000 / a[-1] - 4.0) < 0.4 and np.all(np.diff(a) >= 0)
    g = np.diff(arrival_times(4000, 4.0, "gamma:3", seed=1))
    assert 2.4 < g.std() / g.mean() < 3.6  # bursty: CV about 3
    s = arrival_times(300, 0, "steps:1/100,10/100", seed=1)
    assert (s < 100).sum() < (s[(s >= 100) & (s < 200)]).size  # the fast segment is denser
    with pytest.raises(ValueError, match="unknown arrival"):
        arrival_times(3, 1.0, "weibull")


def test_every_query_completes_and_policies_see_the_same_arrivals() -> None:
    cluster = CLUSTERS["paper-4gpu"]
    wl = build_workload(small_trace(), cluster, n=40, rate=0.5, seed=3)
    results = {p: run_policy(cluster, wl, p).summary() for p in ("vllm", "flowsage", "oracle")}
    for s in results.values():
        assert s["completed"] == 40 and s["rejected"] == 0 and s["failed"] == 0
        assert 0 < s["p50"] <= s["p95"] <= s["p99"]
        assert s["slo_attainment"]["5"] >= s["slo_attainment"]["1"]
    # idle latencies are the same for all policies: at 1.0 x nothing is much faster than idle
    assert all(s["slo_attainment"]["1"] <= 0.6 for s in results.values())


def test_same_seed_same_json(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"Text2SQLRequest": [
        {"step": "extract_keywords", "input_length": 650, "output_length": 20},
        {"step": "generate_candidate_llama-agent", "input_length": 9000, "output_length": 500},
        {"step": "generate_candidate_llama-agent", "input_length": 9000, "output_length": 300},
        {"step": "revise", "input_length": 6000, "output_length": 80},
        {"step": "evaluate", "input_length": 960, "output_length": 22},
        {"step": "evaluate", "input_length": 960, "output_length": 22}]}] * 3))
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}.json"
        assert main(["simulate", "--trace", str(trace), "--cluster", "paper-4gpu", "--policy",
                     "vllm,flowsage", "--rate", "0.3", "--queries", "30", "--seed", "7",
                     "--json", str(out)]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    data = json.loads(outs[0])
    assert set(data["policies"]) == {"vllm", "flowsage"}
    assert set(data["policies"]["vllm"]["slo_attainment"]) == {"1", "1.5", "2", "3", "5"}
    for key in ("completed", "rejected", "mean", "p50", "p95", "p99", "makespan",
                "throughput_qps"):
        assert key in data["policies"]["flowsage"]


def test_alpha_tuning_picks_from_the_grid_and_runs_online() -> None:
    cluster = CLUSTERS["paper-4gpu"]
    wl = build_workload(small_trace(), cluster, n=30, rate=0.5, seed=2)
    best, scores = tune_alpha(cluster, wl, grid=(0.0, 1.0), metric="p95")
    assert best in (0.0, 1.0) and scores[best] == min(scores.values())
    tuner = OnlineAlphaTuner(cluster, every_s=20, window_s=20, grid=(0.0, 1.0))
    result = run_policy(cluster, wl, "hexgen-flow", alpha_tuner=tuner)
    assert result.alpha_history and all(a in (0.0, 1.0) for _, a in result.alpha_history)


def test_cluster_yaml_and_bad_names(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("name: two\ninstances:\n  - {gpu: H100, model: Llama-3.1-8B, count: 2}\n")
    cluster = load_cluster(str(f))
    assert [n for n, _ in cluster.expanded()] == ["h100-0", "h100-1"]
    with pytest.raises(ValueError, match="unknown cluster"):
        load_cluster("nope")
    f.write_text("instances:\n  - {gpu: B300, model: Llama-3.1-8B}\n")
    with pytest.raises(ValueError, match="unknown GPU"):
        load_cluster(str(f))


def test_the_stage_timeline_hook_reports_real_queue_and_run_times() -> None:
    from agentflow.sim.driver import Simulation

    cluster = CLUSTERS["h100-8b-4"]

    def timings(rate: float):
        wl = build_workload(small_trace(), cluster, n=30, rate=rate, seed=4)
        got: list = []
        sim = Simulation(cluster, "vllm", on_stage=got.append)
        result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
        assert all(r.status == "done" for r in result.records)
        return got

    alone, busy = timings(0.01), timings(50.0)
    for got in (alone, busy):
        assert len(got) == 30 * 5  # every stage of every query, once
        for t in got:
            assert t.queue_s >= 0 and t.run_s >= 0
            assert t.queue_s + t.run_s == pytest.approx(t.end - t.start)
            assert (t.instance is not None) == (t.kind == "llm")
    llm = lambda ts: [t for t in ts if t.kind == "llm"]  # noqa: E731
    # alone, a call waits only for the engine's front end; under a burst it queues
    assert max(t.queue_s for t in llm(alone)) < 0.1
    assert sum(t.queue_s for t in llm(busy)) > 10 * sum(t.queue_s for t in llm(alone))
