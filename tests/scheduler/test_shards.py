"""Sharded coordinators: the stratified split, the routing rules, and K shards in the
simulator (one shard behind the facade decides exactly as the plain coordinator)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agentflow.cli.main import main
from agentflow.config import InstanceConfig
from agentflow.scheduler.shards import (
    ShardLoad,
    ShardRouter,
    check_shards,
    instance_kind,
    split_instances,
)
from agentflow.sim.cluster import CLUSTERS
from agentflow.sim.experiment import build_workload, run_policy
from tests.sim.test_driver import small_trace


def test_split_gives_every_shard_a_share_of_every_kind() -> None:
    named = CLUSTERS["hetero-64"].expanded()  # 8 H200, 16 H100, 16 A100, 12 L40S, 12 A6000
    for k in (2, 4, 8):
        parts = split_instances(named, k, kind=lambda item: instance_kind(item[1]))
        assert sorted(n for p in parts for n, _ in p) == sorted(n for n, _ in named)
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1
        for gpu, total in Counter(c.gpu for _, c in named).items():
            counts = [sum(c.gpu == gpu for _, c in p) for p in parts]
            assert max(counts) - min(counts) <= 1 and sum(counts) == total, (k, gpu)
    names = [n for n, _ in named]
    assert split_instances(names, 4) == split_instances(names, 4)  # deterministic


def test_split_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="at least 5 instances"):
        split_instances([1, 2, 3, 4], 5)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="whole number >= 1"):
            check_shards(bad, 10)  # type: ignore[arg-type]


def test_instance_kind_tells_precisions_apart() -> None:
    a = InstanceConfig(gpu="A100-80G", model="Llama-3.1-70B", weight_bits=4, kv_bits=4)
    b = InstanceConfig(gpu="A100-80G", model="Llama-3.1-70B")
    assert instance_kind(a) != instance_kind(b)


def test_p2c_takes_the_less_loaded_of_two_and_counts_what_it_sent() -> None:
    loads = [ShardLoad(up=4, work_s=40.0, queries=4), ShardLoad(up=4, work_s=0.0),
             ShardLoad(up=4, work_s=8.0, queries=2), ShardLoad(up=0, work_s=0.0)]
    reads = []

    def summary() -> list[ShardLoad]:
        reads.append(1)
        return loads

    router = ShardRouter(4, summary, rule="least", summary_s=1.0)
    assert router.pick("q0", 0.0) == 1  # idle shard
    # shard 1 had no queries to price at the last read: each sent is a tie-break only
    assert router.pick("q1", 0.1) == 1
    assert len(reads) == 1  # the summary is read at most once a second
    router.pick("q2", 1.0)
    assert len(reads) == 2
    assert router.scores(1.0)[3] == float("inf")  # nothing up there: never chosen
    p2c = ShardRouter(4, summary, rule="p2c", summary_s=0.0)
    picks = Counter(p2c.pick(f"q{i}", float(i)) for i in range(400))
    assert 3 not in picks and picks[1] > picks[2] > picks[0]
    hashed = ShardRouter(4, summary, rule="hash")
    assert {hashed.pick(f"q{i}", 0.0) for i in range(50)} == {0, 1, 2, 3}  # reads nothing
    assert len(reads) == 2 + 400
    with pytest.raises(ValueError, match="unknown shard routing rule"):
        ShardRouter(2, summary, rule="random")


def test_sent_queries_are_priced_at_the_shards_work_per_query() -> None:
    loads = [ShardLoad(up=2, work_s=10.0, queries=5), ShardLoad(up=2, work_s=12.0, queries=2)]
    router = ShardRouter(2, lambda: loads, rule="least", summary_s=10.0)
    assert router.scores(0.0) == [5.0, 6.0]
    assert router.pick("a", 0.0) == 0  # 5 s per instance; then (10 + 2) / 2 = 6
    assert router.scores(0.0)[0] == pytest.approx(6.0, abs=1e-6)
    router.pick("b", 0.0)
    router.pick("c", 0.0)
    assert router.routed[0] >= 2 and router.routed[1] >= 1  # a burst spreads


def test_one_shard_behind_the_facade_decides_as_the_plain_coordinator() -> None:
    cluster = CLUSTERS["paper-4gpu"]
    wl = build_workload(small_trace(), cluster, n=30, rate=0.6, seed=2)
    for policy in ("flowsage", "vllm"):
        plain = run_policy(cluster, wl, policy).summary()
        faced = run_policy(cluster, wl, policy, coordinators=1).summary()
        for s in (plain, faced):
            s.pop("sim_wall_s", None)
        assert json.dumps(plain, sort_keys=True) == json.dumps(faced, sort_keys=True)


def test_k_shards_answer_every_query_on_their_own_instances() -> None:
    from agentflow.sim.driver import Simulation

    cluster = CLUSTERS["hetero-64"]
    wl = build_workload(small_trace(), cluster, n=60, rate=8.0, seed=1)
    sim = Simulation(cluster, "flowsage", coordinators=4)
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
    assert all(r.status == "done" for r in result.records)
    figures = sim.coordinator.decision_figures()
    assert sum(figures["routed"]) == 60 and min(figures["routed"]) > 0
    assert all(e > 0 for e in figures["events"])
    # each shard's calls ran only on its own instances
    shards = sim.coordinator.shards
    assert sorted(n for s in shards for n in s.queues) == sorted(sim.instances)
    assert all(not s.queries for s in shards) and not sim.coordinator.route


def test_a_shard_whose_instances_are_down_gets_no_new_query() -> None:
    from agentflow.sim.driver import Simulation
    from agentflow.sim.faults import Fault

    cluster = CLUSTERS["h100-8b-4"]
    sim = Simulation(cluster, "flowsage", coordinators=2,
                     faults=[Fault(0.0, name, "down") for name in ("h100-0", "h100-2")])
    assert sorted(sim.coordinator.shards[0].queues) == ["h100-0", "h100-2"]
    wl = build_workload(small_trace(), cluster, n=20, rate=2.0, seed=0)
    wl.arrivals = [t + 0.5 for t in wl.arrivals]  # after the faults
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
    assert all(r.status == "done" for r in result.records)
    assert sim.coordinator.router.routed == [0, 20]


def test_simulate_coordinators_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"Text2SQLRequest": [
        {"step": "extract_keywords", "input_length": 650, "output_length": 20},
        {"step": "generate_candidate_llama-agent", "input_length": 4000, "output_length": 200},
        {"step": "evaluate", "input_length": 960, "output_length": 22}]}] * 4))
    out = tmp_path / "out.json"
    assert main(["simulate", "--trace", str(trace), "--cluster", "h100-8b-4", "--policy",
                 "flowsage", "--queries", "12", "--rate", "2", "--coordinators", "2",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["config"]["coordinators"] == 2 and data["config"]["shard_route"] == "p2c"
    assert data["policies"]["flowsage"]["completed"] == 12
    one = tmp_path / "one.json"
    assert main(["simulate", "--trace", str(trace), "--cluster", "h100-8b-4", "--policy",
                 "flowsage", "--queries", "12", "--rate", "2", "--json", str(one)]) == 0
    assert "coordinators" not in json.loads(one.read_text())["config"]  # as before
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", str(trace), "--cluster", "h100-8b-4",
              "--coordinators", "5"])
    assert "5 shards need at least 5 instances" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--trace", str(trace), "--coordinators", "0"])
