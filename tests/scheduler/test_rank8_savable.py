"""``flowsage-savable`` (issue 38, ``scheduler.savable``): a query whose probability of
meeting its deadline has fallen to at most ``LOST_MEET`` ranks behind every savable query
(as if it had no deadline) and no prompt is held to spare its decode; ``flowsage`` as
shipped is unchanged. Real simulations (one instance, then a seeded trace1 run) and the
bound's edge cases."""

from __future__ import annotations

import math
import subprocess
import sys
from statistics import NormalDist
from types import SimpleNamespace
from typing import Any

import pytest

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.scheduler import Coordinator, policies, savable
from agentflow.scheduler.instance import InstanceQueue
from agentflow.scheduler.policies import parse_policy, resolve
from agentflow.scheduler.policies.queue_flowsage import LOST_MEET, FlowSageQueue, lost_z
from agentflow.scheduler.ranking import key_at, next_switch, segment_at
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.driver import Simulation, StageTiming
from agentflow.sim.workload import TraceNode, TraceQuery


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """flowsage-savable in the registry for each test (as the benchmarks register it), the
    product's registry restored after it."""
    monkeypatch.setattr(policies, "QUEUE", dict(policies.QUEUE))
    monkeypatch.setattr(policies, "PRESETS", dict(policies.PRESETS))
    savable.register()


# ------------------------------------------------------------------------ the bound itself
def test_the_bound_is_the_mirror_of_the_safe_one():
    from agentflow.scheduler import risk

    assert LOST_MEET == risk.HOLD_SAFE == 0.02
    assert lost_z(LOST_MEET) == pytest.approx(-2.0537489, abs=1e-6)
    assert NormalDist().cdf(lost_z(0.02)) == pytest.approx(0.02, abs=1e-12)


@pytest.mark.parametrize("bad", [0.0, 0.5, 0.7, 1.0, -0.1, math.nan])
def test_bounds_outside_zero_to_a_half_are_refused(bad: float):
    with pytest.raises(ValueError):
        lost_z(bad)
    with pytest.raises(ValueError):
        FlowSageQueue(lost_meet=bad)


def test_registry_names_the_variant_and_leaves_flowsage_off():
    assert policies.PRESETS["flowsage-savable"] == ("marginal_delay", "flowsage-savable")
    savable.register()  # again: a no-op
    _, plain = resolve("flowsage")
    _, variant = resolve("flowsage-savable")
    assert isinstance(plain, FlowSageQueue) and plain.lost_meet is None
    assert isinstance(variant, FlowSageQueue) and variant.lost_meet == LOST_MEET
    assert variant.name == "flowsage"  # the hold, class ranking and fair shares act alike
    assert parse_policy("marginal_delay+flowsage-savable").queue == "flowsage-savable"
    assert "flowsage-savable" in policies.QUEUE


# ------------------------------------------------------------------------------ the key
def _call(deadline: float | None, remaining: float, lo: float, hi: float, *,
          arrival: float = 0.0, work: float = 50.0) -> tuple[Any, Any]:
    query = SimpleNamespace(deadline=deadline, run=object(), path_lo=lo, path_hi=hi,
                            work_left=work, arrival=arrival)
    view = SimpleNamespace(remaining_s=lambda q, now: remaining)
    return SimpleNamespace(query=query), view


SIGMA = (14.0 - 6.0) / (2 * 1.2815515655446004)  # remaining_spread_s of lo 6, hi 14


def test_off_the_key_is_flowsages_own():
    call, view = _call(100.0, 10.0, 6.0, 14.0)
    assert FlowSageQueue().rank(call, 0.0, view) == \
        FlowSageQueue(lost_meet=None).rank(call, 0.0, view)
    assert len(FlowSageQueue().rank(call, 0.0, view)) == 1


def test_the_key_switches_behind_at_the_instant_the_bound_is_reached():
    call, view = _call(100.0, 10.0, 6.0, 14.0, arrival=3.0, work=50.0)
    key = FlowSageQueue(lost_meet=LOST_MEET).rank(call, 0.0, view)
    t_lost = 100.0 - 10.0 - lost_z(LOST_MEET) * SIGMA  # z = lost_z there
    switch = next_switch(key, 0.0)
    assert switch == pytest.approx(t_lost, rel=1e-12)
    assert switch is not None
    before = math.nextafter(switch, -math.inf)
    tier, z = key_at(key, before)
    assert tier == 0 and z > lost_z(LOST_MEET)  # still savable just before
    assert z == pytest.approx(lost_z(LOST_MEET), abs=1e-9)
    assert key_at(key, switch) == (1, 3.0 + 50.0)  # at the bound: lost ("at most")
    # a savable key before the switch equals flowsage's own
    assert key[0] == FlowSageQueue().rank(call, 0.0, view)[0]


def test_a_query_already_lost_ranks_behind_from_now():
    call, view = _call(100.0, 10.0, 6.0, 14.0, arrival=3.0)
    now = 100.0 - 10.0 - lost_z(LOST_MEET) * SIGMA + 1e-6
    key = FlowSageQueue(lost_meet=LOST_MEET).rank(call, now, view)
    assert len(key) == 1 and key[0].start == -math.inf and key[0].tier == 1
    assert next_switch(key, now) is None


def test_lost_goes_behind_every_savable_query_and_queries_without_a_deadline_keep_theirs():
    q = FlowSageQueue(lost_meet=LOST_MEET)
    lost_call, view_l = _call(10.0, 30.0, 25.0, 35.0)  # z ~ -5.1 at 0
    tight, view_t = _call(10.0, 10.5, 9.0, 12.0)  # z ~ -0.2: at risk, savable
    free, view_f = _call(None, 5.0, 4.0, 6.0, arrival=0.0, work=5.0)
    kl, kt, kf = (q.rank(c, 0.0, v) for c, v in ((lost_call, view_l), (tight, view_t),
                                                 (free, view_f)))
    assert key_at(kt, 0.0) < key_at(kl, 0.0)  # flowsage would serve the lost one first
    assert key_at(FlowSageQueue().rank(lost_call, 0.0, view_l), 0.0) < \
        key_at(FlowSageQueue().rank(tight, 0.0, view_t), 0.0)
    assert kf == FlowSageQueue().rank(free, 0.0, view_f)  # no deadline: unchanged
    assert segment_at(kl, 0.0).tier == segment_at(kf, 0.0).tier == 1  # ranked as if none


def test_is_lost_reads_the_same_bound_with_at_most():
    z_b = lost_z(LOST_MEET)
    sigma = SIGMA
    q = SimpleNamespace(deadline=100.0, run=object(), path_lo=6.0, path_hi=14.0)
    coord = SimpleNamespace(remaining_s=lambda query, now: 10.0)
    t_lost = 100.0 - 10.0 - z_b * sigma
    assert savable.is_lost(coord, q, t_lost, (100.0 - t_lost - 10.0) / sigma)  # equality
    assert not savable.is_lost(coord, q, t_lost - 1e-6, z_b)
    assert savable.is_lost(coord, q, t_lost + 1e-6, z_b)
    q.deadline = None
    assert not savable.is_lost(coord, q, 1e9, z_b)  # no deadline: never lost


# ------------------------------------------------------------ real simulations, one GPU
URGENT = TraceQuery(id="u", question="q1", nodes=[TraceNode("a", "generate", "llm", (), 600,
                                                            1500)])
RICH = TraceQuery(id="r", question="q2", nodes=[TraceNode("a", "generate", "llm", (), 12000,
                                                          40)])


def _pair(policy: str, urgent_slo: float, rich_at: float) -> dict[str, StageTiming]:
    cluster = SimClusterConfig(name="one", instances=[
        SimInstanceConfig(name="gpu", gpu="A100-80G", model="Llama-3.1-8B")])
    seen: list[StageTiming] = []
    sim = Simulation(cluster, policy, on_stage=seen.append)
    result = sim.run([URGENT, RICH], [0.0, rich_at], [urgent_slo, 600.0], [10.0, 1.0])
    assert all(r.status == "done" for r in result.records)
    return {s.query_id.split(":")[1]: s for s in seen}


def _held(got: dict[str, StageTiming]) -> bool:
    return got["r"].end - got["r"].run_s >= got["u"].end - 1e-9


def test_no_prompt_waits_to_spare_a_lost_decode():
    # at r's arrival (4 s) u is 2 s past its deadline and z ~ -6: lost
    assert _held(_pair("flowsage", 2.0, 4.0))  # flowsage holds r for it
    got = _pair("flowsage-savable", 2.0, 4.0)
    assert not _held(got)
    assert got["r"].end - got["r"].run_s < 4.1  # r starts at once


@pytest.mark.parametrize("slo", [0.1, 2.0])  # z ~ -1.83 and 0 at r's arrival: savable
def test_a_savable_at_risk_decode_is_still_spared(slo: float):
    assert _held(_pair("flowsage", slo, 2.0))
    assert _held(_pair("flowsage-savable", slo, 2.0))


BUSY = TraceQuery(id="b", question="q0", nodes=[TraceNode("a", "generate", "llm", (), 2000,
                                                          600)])
SHORT_L = TraceQuery(id="l", question="ql", nodes=[TraceNode("a", "generate", "llm", (), 800,
                                                             200)])
SHORT_S = TraceQuery(id="s", question="qs", nodes=[TraceNode("a", "generate", "llm", (), 800,
                                                             200)])


def _queue_order(policy: str) -> dict[str, StageTiming]:
    """One slot: b runs from 0; l (deadline 0.5 s: lost long before b ends) and s (deadline
    b's end + its own run, savable) wait for it; who starts when b is done?"""
    cluster = SimClusterConfig(name="one", instances=[
        SimInstanceConfig(name="gpu", gpu="A100-80G", model="Llama-3.1-8B", max_inflight=1)])
    seen: list[StageTiming] = []
    sim = Simulation(cluster, policy, on_stage=seen.append)
    result = sim.run([BUSY, SHORT_L, SHORT_S], [0.0, 0.5, 1.0], [None, 0.5, 60.0],
                     [10.0, 3.0, 3.0])
    assert all(r.status == "done" for r in result.records)  # the lost one still runs
    return {s.query_id.split(":")[1]: s for s in seen}


def test_a_lost_query_waits_behind_a_savable_one():
    plain = _queue_order("flowsage")
    assert plain["l"].end < plain["s"].end  # lowest z first: the lost query
    got = _queue_order("flowsage-savable")
    assert got["s"].end < got["l"].end  # the savable one first, the lost one next
    assert got["s"].end < plain["s"].end


# ----------------------------------------------------------------- a seeded trace1 run
def _admissions(policy: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """paper-4gpu, trace1, 60 queries at its slo50 rate (seed 3): admissions that started a
    call of a lost query while a call of a savable query with a deadline waited on the same
    instance (by ``savable.is_lost``'s reading then), and admissions of lost calls."""
    from agentflow.bench.scheduler.policy_suite import cluster_named, workloads
    from agentflow.sim.experiment import build_workload
    from agentflow.sim.slo import IdleLatency

    base = cluster_named("paper-4gpu")
    wl = build_workload(workloads()["trace1"], base, n=60, rate=0.0664, seed=3,
                        idle=IdleLatency(base))
    sim = Simulation(base, policy)
    coord = sim.coordinator
    z_b = lost_z(LOST_MEET)
    counts = [0, 0]
    admit = InstanceQueue.admit

    def spy(self: InstanceQueue, now: float, view: Any, kv: Any) -> Any:
        waiting = list(self.waiting)
        started = admit(self, now, view, kv)
        if started:
            first = started[0]
            if savable.is_lost(coord, first.query, now, z_b):
                counts[1] += 1
                if any(c.query.deadline is not None and c is not first
                       and not savable.is_lost(coord, c.query, now, z_b) for c in waiting):
                    counts[0] += 1
        return started

    monkeypatch.setattr(InstanceQueue, "admit", spy)
    sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
    return counts[0], counts[1]


@pytest.mark.skipif(not (HEXGEN_TRACES / "trace1.json").is_file(),
                    reason="the shared HexGen-Flow trace is not here")
def test_seeded_run_lost_calls_do_not_jump_savable_ones(monkeypatch: pytest.MonkeyPatch):
    jumped_plain, lost_plain = _admissions("flowsage", monkeypatch)
    jumped, lost = _admissions("flowsage-savable", monkeypatch)
    assert jumped_plain > 0  # flowsage serves lost calls ahead of savable ones
    assert lost > 0  # lost calls still run (behind)
    assert jumped == 0


def test_shipped_registry_does_not_hold_it():
    """The product's registry, as a user's ``--help`` reads it, in a fresh process: this
    process's registry may hold the variant already (the bench tests run ``queue_choice``,
    which registers it for the rest of the process)."""
    code = ("from agentflow.scheduler import policies; import agentflow.cli.main; "
            "assert 'flowsage-savable' not in policies.QUEUE, 'queue'; "
            "assert 'flowsage-savable' not in policies.PRESETS, 'preset'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_decision_matches_the_eager_queue_with_retries():
    """The seeded replay of test_decide_exact (progress, failures and retries, instances down
    and up, cancels) under the variant: its keys switch tier at known instants, so a query's
    entry dropped and re-made by a retry leaves a timer of the same (switch, seq, version)
    in the heap (the push number breaks that tie)."""
    from tests.scheduler.test_decide_exact import (
        ReferenceCoordinator,
        _checked,
        _compare,
    )
    from tests.scheduler.test_view_rows import replay

    new = replay(Coordinator, "flowsage-savable", seed=7, check=_checked)
    old = replay(ReferenceCoordinator, "flowsage-savable", seed=7)
    assert sum(1 for e in old if e[0] == "start") > 100
    _compare(new, old)
