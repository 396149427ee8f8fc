"""SLO classes and tenants in the scheduler (agentflow.scheduler.classes, .fairness, .backlog):
hand-computed cases on one instance that decodes 1 token/s with fixed output lengths
(tests/scheduler/utils.py), so every number below is seconds you can add up."""

from __future__ import annotations

import pytest

from agentflow.scheduler import QueryRejected
from agentflow.scheduler.backlog import DeadlineRejected, backlog_clear_s
from agentflow.scheduler.call import QueryState
from agentflow.scheduler.classes import PRIORITY_BAND, TIER_BAND, queue_rank, shed_limit
from agentflow.scheduler.fairness import TenantShares
from agentflow.slo_classes import DEFAULT_SLO_CLASSES, SloClass
from tests.scheduler.utils import chain_run, coordinator, occupy


def _q(name: str, tenant: str, cls: str = "standard") -> QueryState:
    return QueryState(id=name, arrival=0.0, deadline=None, slo_class=cls, tenant=tenant)


# ------------------------------------------------------------------------ fairness counters
def test_virtual_time_flags_the_tenant_a_quantum_ahead_and_clears_it_when_others_catch_up(
        ) -> None:
    shares = TenantShares(quantum_s=10.0)
    a, b = _q("a", "A"), _q("b", "B")
    assert shares.arrive(a) == [] and shares.arrive(b) == []
    assert shares.charge(a, 15.0) == [("standard", "A")]  # 15 - 0 > 10: over
    assert shares.over_share(a) and not shares.over_share(b)
    assert shares.charge(b, 4.0) == []  # 15 - 4 = 11 > 10: still over
    assert shares.charge(b, 2.0) == [("standard", "A")]  # 15 - 6 = 9: back in share
    assert not shares.over_share(a)
    assert shares.virtual_time(a) == 15.0 and shares.virtual_time(b) == 6.0


def test_weights_divide_the_charge_and_a_lone_tenant_is_never_over() -> None:
    shares = TenantShares(quantum_s=10.0, weights={"B": 2.0})
    a, b = _q("a", "A"), _q("b", "B")
    shares.arrive(a)
    shares.charge(a, 1000.0)  # alone: whatever it uses, nobody waits
    assert not shares.over_share(a)
    shares.arrive(b)  # B starts at A's virtual time: no credit from before it came
    assert shares.virtual_time(b) == 1000.0
    shares.charge(b, 30.0)  # weight 2: 15 s of virtual time
    assert shares.virtual_time(b) == 1015.0 and shares.over_share(b)


def test_an_idle_tenant_banks_no_credit_and_classes_do_not_mix() -> None:
    shares = TenantShares(quantum_s=10.0)
    a, b, other = _q("a", "A"), _q("b", "B"), _q("x", "B", cls="batch")
    shares.arrive(a)
    shares.arrive(b)
    shares.leave(b)  # B idle while A is served
    shares.charge(a, 200.0)
    shares.arrive(b)  # comes back at A's 200, not at 0: it cannot flood A out
    assert shares.virtual_time(b) == 200.0 and not shares.over_share(a)
    shares.arrive(other)  # B's batch queries are another account
    assert shares.virtual_time(other) == 0.0
    with pytest.raises(ValueError):
        TenantShares(quantum_s=0)


# ------------------------------------------------------------------------- class ordering
def _ready(c, query_id: str, *, deadline: float | None, cls: str | None,
           tenant: str | None = None, stage: str = "s"):
    run = chain_run(query_id, deadline or 0.0, [stage])
    c.on_query_arrival(query_id, deadline=deadline, run=run, slo_class=cls, tenant=tenant)
    call, _ = c.on_call_ready(query_id, stage=stage, node_id=f"{query_id}.0", prompt_tokens=0)
    return call


def _order(c) -> list[str]:
    return [call.query.id for call in c.queues["fast"].ordered_waiting(0.0)]


@pytest.mark.parametrize("policy", ["vllm", "flowsage"])
def test_class_rank_goes_before_the_policys_own_key(policy) -> None:
    c = coordinator(policy, {"s": 10, "blocker": 100})
    occupy(c)
    _ready(c, "batch", deadline=None, cls="batch")
    _ready(c, "std-late", deadline=500.0, cls="standard")
    _ready(c, "std-urgent", deadline=20.0, cls="standard")
    _ready(c, "ui", deadline=900.0, cls="interactive")
    order = _order(c)
    assert order[0] == "ui" and order[-1] == "batch"
    # within the class each policy's own order: arrival (vllm), the urgent one (flowsage)
    assert order[1:3] == (["std-late", "std-urgent"] if policy == "vllm"
                          else ["std-urgent", "std-late"])


def test_class_blind_baselines_stay_class_blind() -> None:
    c = coordinator("llf", {"s": 10, "blocker": 100})
    occupy(c)
    _ready(c, "std-urgent", deadline=20.0, cls="standard")
    _ready(c, "ui", deadline=900.0, cls="interactive")
    assert _order(c) == ["std-urgent", "ui"]


def test_the_backend_priority_is_band_major() -> None:
    c = coordinator("vllm", {"s": 10}, max_inflight=3)
    started = [_ready(c, q, deadline=None, cls=k) for q, k in
               (("b", "batch"), ("s", "standard"), ("i", "interactive"))]
    # admitted in arrival order (free slots), told to the engine by class first (the
    # default class in [0, PRIORITY_BAND)), then by the queue's own key (classes.queue_rank)
    assert [x.priority // PRIORITY_BAND for x in started] == [2, 0, -2]
    assert [x.priority % PRIORITY_BAND for x in started] == [queue_rank(x, 0.0)
                                                             for x in started]


def test_within_a_band_the_engine_is_told_the_queue_order_not_the_admission_order() -> None:
    """Issue 38: calls are admitted long before they contend, and the engine's waiting queue
    and preemption order by this number; before, it was the admission number, so within a
    class the engine ran first-come-first-served whatever the queue policy said."""
    c = coordinator("flowsage", {"s": 10}, max_inflight=3)
    loose = _ready(c, "loose", deadline=500.0, cls="standard")
    tight = _ready(c, "tight", deadline=30.0, cls="standard")
    later = _ready(c, "later", deadline=None, cls="standard")  # no deadline: after both
    assert [x.state.name for x in (loose, tight, later)] == ["RUNNING"] * 3
    assert tight.priority < loose.priority < later.priority  # before: loose < tight < later
    assert 0 <= tight.priority < PRIORITY_BAND and later.priority < PRIORITY_BAND


def test_queue_rank_keeps_the_order_of_keys_across_their_range() -> None:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.ranking import Segment

    def rank(tier: int, value: float) -> int:
        call = ScheduledCall.__new__(ScheduledCall)
        call.rank_key = (Segment(float("-inf"), tier, value, 0.0),)
        return queue_rank(call, 0.0)

    values = [-1e9, -3600.0, -2.0, -1e-3, 0.0, 1e-3, 0.5, 0.501, 2.0, 86400.0, 86400.5, 1e11]
    ranks = [rank(0, v) for v in values]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    assert rank(0, 1e12) < rank(1, -1e12) < rank(TIER_BAND + 1, 0.0) + 1  # tier first
    assert rank(TIER_BAND + 1, 0.0) == rank(1, 0.0)  # the class band's tier shift is removed
    assert 0 <= rank(0, float("-inf")) and rank(31, float("inf")) < PRIORITY_BAND


def test_fair_share_puts_an_over_share_tenant_behind_within_its_class() -> None:
    c = coordinator("flowsage", {"s": 30, "blocker": 100})
    c.fairness.quantum_s = 10.0
    occupy(c)
    heavy1 = _ready(c, "h1", deadline=1000.0, cls="standard", tenant="heavy")
    _ready(c, "l1", deadline=2000.0, cls="standard", tenant="light")
    # flowsage by itself runs the earlier deadline (h1) first
    assert _order(c)[0] == "h1"
    c.fairness.charge(heavy1.query, 50.0)  # heavy got 50 s while light waited
    from agentflow.scheduler.fairness import rekey_tenants

    rekey_tenants(c, [("standard", "heavy")], 0.0)
    assert c.fairness.over_share(heavy1.query)
    assert _order(c) == ["l1", "h1"]  # still served (work-conserving), after light


def test_unknown_class_is_refused_and_a_class_default_deadline_applies() -> None:
    classes = {**DEFAULT_SLO_CLASSES,
               "interactive": SloClass(name="interactive", rank=0, slo_seconds=30.0)}
    c = coordinator("flowsage", {"s": 10}, slo_classes=classes)
    q = c.on_query_arrival("a", run=chain_run("a", 0.0, ["s"]), slo_class="interactive")
    assert q.deadline == pytest.approx(30.0)
    own = c.on_query_arrival("b", deadline=99.0, run=chain_run("b", 0.0, ["s"]),
                             slo_class="interactive")
    assert own.deadline == 99.0
    with pytest.raises(ValueError, match="unknown SLO class 'gold'"):
        c.on_query_arrival("c", run=chain_run("c", 0.0, ["s"]), slo_class="gold")
    assert set(c.queries) == {"a", "b"}


# ------------------------------------------------------------------------------ shed order
def test_count_limits_shed_batch_first() -> None:
    classes = DEFAULT_SLO_CLASSES
    assert shed_limit(10, classes["interactive"], classes) == 10
    assert shed_limit(10, classes["standard"], classes) == 10
    assert shed_limit(10, classes["batch"], classes) == 8
    assert shed_limit(None, classes["batch"], classes) is None
    c = coordinator("flowsage", {"s": 10}, max_active_queries=5)
    for i in range(4):
        c.on_query_arrival(f"s{i}", run=chain_run(f"s{i}", 0.0, ["s"]))
    with pytest.raises(QueryRejected, match="limit 4 for batch"):
        c.on_query_arrival("b", run=chain_run("b", 0.0, ["s"]), slo_class="batch")
    c.on_query_arrival("s4", run=chain_run("s4", 0.0, ["s"]))  # standard: the 5th fits
    with pytest.raises(QueryRejected, match="limit 5 for interactive"):
        c.on_query_arrival("i", run=chain_run("i", 0.0, ["s"]), slo_class="interactive")


def test_backlog_counts_only_the_work_a_class_waits_behind() -> None:
    for policy, admitted in (("flowsage", True), ("hexgen-flow", False)):
        c = coordinator(policy, {"s": 100}, admit_by_backlog=True)
        c.on_query_arrival("b", run=chain_run("b", 0.0, ["s"]), slo_class="batch")
        assert backlog_clear_s(c, 0.0) == pytest.approx(100.0)
        run = chain_run("i", 40.0, ["s"])
        if admitted:  # ranked by class, the interactive query jumps the batch work
            assert backlog_clear_s(c, 0.0, band=0) == pytest.approx(0.0)
            c.on_query_arrival("i", deadline=40.0, run=run, slo_class="interactive")
        else:  # a class-blind queue makes it wait behind the batch work: refused
            with pytest.raises(QueryRejected, match="about 100 s"):
                c.on_query_arrival("i", deadline=40.0, run=run, slo_class="interactive")
        # and a second batch query waits behind the first: it is the one shed
        with pytest.raises(QueryRejected):
            c.on_query_arrival("b2", deadline=40.0, run=chain_run("b2", 0.0, ["s"]),
                               slo_class="batch")


# ---------------------------------------------------------------------- deadline admission
def test_deadline_admission_refuses_with_the_earliest_feasible_slo() -> None:
    c = coordinator("flowsage", {"s": 100}, deadline_admission="reject")
    with pytest.raises(DeadlineRejected) as refused:  # its own path is 100 s
        c.on_query_arrival("a", deadline=50.0, run=chain_run("a", 50.0, ["s"]))
    assert refused.value.reason.startswith("would_miss_deadline")
    assert refused.value.code == "would_miss_deadline"
    assert refused.value.earliest_slo_s == 100.0
    assert isinstance(refused.value, QueryRejected)  # serving answers it as a 429
    c.on_query_arrival("b", deadline=120.0, run=chain_run("b", 120.0, ["s"]))
    # now 100 s of b's work is ahead of any standard query: 100 + 100
    with pytest.raises(DeadlineRejected) as late:
        c.on_query_arrival("c", deadline=150.0, run=chain_run("c", 150.0, ["s"]))
    assert late.value.earliest_slo_s == 200.0
    assert set(c.queries) == {"b"}  # nothing of the refused ones stays behind


def test_deadline_admission_can_move_to_batch_and_is_off_by_default() -> None:
    moved = coordinator("flowsage", {"s": 100}, deadline_admission="batch")
    q = moved.on_query_arrival("a", deadline=50.0, run=chain_run("a", 50.0, ["s"]),
                               slo_class="interactive")
    assert q.slo_class == "batch" and q.deadline is None
    off = coordinator("flowsage", {"s": 100})
    assert off.on_query_arrival("a", deadline=50.0, run=chain_run("a", 50.0, ["s"])
                                ).deadline == 50.0
    with pytest.raises(ValueError, match="deadline_admission"):
        coordinator("flowsage", {"s": 100}, deadline_admission="sometimes")


def test_deadline_admission_counts_only_the_work_a_tenant_in_share_waits_behind() -> None:
    c = coordinator("flowsage", {"s": 100}, max_inflight=2, deadline_admission="reject")
    c.fairness.quantum_s = 10.0

    def arrive(q: str, tenant: str, deadline: float, ready: bool = False) -> None:
        c.on_query_arrival(q, deadline=deadline, run=chain_run(q, deadline, ["s"]),
                           tenant=tenant)
        if ready:
            c.on_call_ready(q, stage="s", node_id=f"{q}.0", prompt_tokens=0)

    arrive("h1", "heavy", 10_000, ready=True)  # runs: heavy charged 100 s, alone
    arrive("l0", "light", 10_000)  # light starts at heavy's 100 s
    arrive("h2", "heavy", 10_000, ready=True)  # runs too: heavy at 200 s, over its share
    assert c.fairness.over_share(c.queries["h2"])
    arrive("h3", "heavy", 10_000)  # 100 s pending, behind light from now on
    # light: 200 s running + l0's 100 s pending + its own 100 s = 400 <= 450 (h3 not ahead)
    arrive("l1", "light", 450)
    with pytest.raises(DeadlineRejected) as refused:  # heavy waits behind everything
        arrive("h4", "heavy", 450)
    assert refused.value.earliest_slo_s == 600.0  # 200 + 100 + 100 + 100, then its 100


# ------------------------------------------------------------------------ copies, positions memo
def test_a_simulation_under_a_class_ranked_queue_can_fork() -> None:
    # deepcopy builds the wrapper without __init__ and asks for __setstate__ before ``inner``
    # is set: a KeyError there made every fork under flowsage/vllm fail (the alpha tuner forks)
    import copy

    from agentflow.scheduler.classes import ClassRankedQueue
    from agentflow.sim.cluster import CLUSTERS
    from agentflow.sim.driver import Simulation
    from agentflow.sim.experiment import build_workload
    from tests.sim.test_alpha import trace

    for policy in ("flowsage", "vllm"):
        cluster = CLUSTERS["paper-4gpu"]
        wl = build_workload(trace(), cluster, n=20, rate=5.0, seed=2)
        sim = Simulation(cluster, policy)
        assert isinstance(sim.coordinator._queue_policy, ClassRankedQueue)
        copied = copy.deepcopy(sim.coordinator._queue_policy)
        assert copied.name == sim.coordinator._queue_policy.name and copied.inner is not None
        seen: dict[str, int] = {}

        def probe(s: Simulation, seen: dict[str, int] = seen) -> None:
            fork = s.fork()
            fork.drain()
            seen["fork_left"] = len(fork.in_flight)
            seen["live"] = len(s.in_flight)

        sim.schedule_hook(3.0, probe)
        result = sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
        assert seen["fork_left"] == 0 and seen["live"] >= 1, policy
        assert all(r.status == "done" for r in result.records)


def test_class_positions_follow_a_mapping_edited_in_place() -> None:
    from agentflow.scheduler.classes import class_positions

    classes = dict(DEFAULT_SLO_CLASSES)
    before = class_positions(classes)
    assert class_positions(classes) is before  # kept while nothing changed
    assert sorted(before.values()) == list(range(len(set(c.rank for c in classes.values()))))
    classes["extra"] = SloClass(name="extra", rank=50, weight=1.0)  # a class added in place
    after = class_positions(classes)
    assert after == {r: i for i, r in enumerate(sorted({50, *before}))}
    existing = min(before)
    classes["extra"] = SloClass(name="extra", rank=existing, weight=1.0)  # a value replaced
    assert class_positions(classes) == before
