"""The O(log n) queues pick exactly what the O(n) reference scan over the same keys picks."""

from __future__ import annotations

import random

import pytest

from agentflow.bench.scheduler.ablation_queues import register_ablation_queues
from agentflow.scheduler import policies
from agentflow.scheduler.ranking import KineticTournament, Segment, key_at, next_switch
from agentflow.sim.cluster import CLUSTERS
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import build_workload
from agentflow.sim.workload import TraceNode, TraceQuery


def test_kinetic_tournament_matches_a_scan_under_random_inserts_removals_and_time() -> None:
    rng = random.Random(7)
    kt = KineticTournament(2)  # starts tiny, so it grows several times
    live: dict[int, tuple[float, float, int]] = {}
    now, disagreements = 0.0, 0
    for seq in range(6000):
        now += rng.random() * 0.3
        if rng.random() < 0.55 or not live:
            a = rng.uniform(-50, 50)
            s = rng.choice([0.0, 1.0, rng.random(), 3 * rng.random()])
            live[seq] = (a, s, kt.insert(seq, a, s, seq))
        else:
            kt.remove(live.pop(rng.choice(list(live)))[2])
        want = min(live, key=lambda k: (live[k][0] - live[k][1] * now, k)) if live else None
        disagreements += kt.peek(now) != want
    assert disagreements == 0
    assert len(kt) == len(live)


def test_keys_switch_segments_at_their_start_times() -> None:
    key = (Segment(float("-inf"), 1, 5.0), Segment(10.0, 0, 20.0, 1.0), Segment(30.0, 2, 0.0))
    assert key_at(key, 9.9) == (1, 5.0)
    assert key_at(key, 10.0) == (0, 10.0)
    assert key_at(key, 31.0) == (2, 0.0)
    assert next_switch(key, 0.0) == 10.0 and next_switch(key, 10.0) == 30.0
    assert next_switch(key, 30.0) is None


def _chess_like(n: int) -> list[TraceQuery]:
    rng = random.Random(3)
    out = []
    for i in range(n):
        cands = [TraceNode(f"c{j}", "generate_candidate", "llm", ("kw",),
                           rng.randint(2000, 6000), rng.randint(20, 600)) for j in range(3)]
        out.append(TraceQuery(id=f"t{i}", question=f"question {i % 7}", nodes=[
            TraceNode("kw", "extract_keywords", "llm", (), rng.randint(300, 900),
                      rng.randint(5, 60)),
            *cands,
            TraceNode("exec", "execute", "tool", tuple(c.id for c in cands), duration_s=0.05),
            TraceNode("rev", "revise", "llm", ("exec",), rng.randint(1000, 4000),
                      rng.randint(10, 200)),
            TraceNode("eval", "evaluate", "llm", ("rev",), 900, rng.randint(5, 40)),
        ]))
    return out


@pytest.mark.parametrize("policy", ["vllm", "hexgen-flow", "sagesched", "llf", "flowsage",
                                    "least_loaded+edf", "least_loaded+flowsage_v1",
                                    "least_loaded+urgency"])
def test_fast_queue_picks_what_the_reference_scan_picks_on_a_replayed_trace(
        policy, monkeypatch) -> None:
    """Replays an overloaded workload (long queues, keys moving and switching tier) with every
    queue checking each pick against ``reference_peek``; any disagreement raises. (The
    ablation ``flowsage_v1``, registered for the test, has keys that switch tier mid-wait.)"""
    monkeypatch.setattr(policies, "QUEUE", dict(policies.QUEUE))
    register_ablation_queues()
    cluster = CLUSTERS["paper-4gpu"]
    wl = build_workload(_chess_like(12), cluster, n=60, rate=2.0, seed=5)
    sim = Simulation(cluster, policy)
    contested = []
    for queue in sim.coordinator.queues.values():
        queue.check_reference = True
        fast = queue.peek

        def peek(now, queue=queue, fast=fast):
            if len(queue.waiting) >= 2:
                contested.append(len(queue.waiting))
            return fast(now)
        queue.peek = peek
    result = sim.run(wl.queries, wl.arrivals, wl.deadlines(1.5), wl.idle_latency_s)
    assert all(r.status == "done" for r in result.records)
    assert len(contested) > 100 and max(contested) >= 20  # the queues really were contested
