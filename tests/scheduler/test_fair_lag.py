"""A tenant's lag across idle spells (agentflow.scheduler.fairness) and the charge of a call
cancelled before it was sent: hand-computed cases on the test coordinator (one instance,
1 token/s, fixed output lengths, a manual clock), so every number is seconds you can add."""

from __future__ import annotations

import asyncio

import pytest

from agentflow.scheduler.call import CallState, QueryState
from agentflow.scheduler.classes import call_band
from agentflow.scheduler.fairness import LAG_CAP_QUANTA, TenantShares
from tests.scheduler.utils import chain_run, coordinator


def _arrive(c, qid: str, tenant: str, *, ready: bool = True, deadline: float = 1000.0):
    c.on_query_arrival(qid, deadline=deadline, run=chain_run(qid, deadline, ["s"]),
                       slo_class="standard", tenant=tenant)
    if not ready:
        return None
    call, _ = c.on_call_ready(qid, stage="s", node_id=f"{qid}.0", prompt_tokens=0)
    return call


def _finish(c, call) -> None:
    c.clock.advance(max(0.0, (call.started_at or 0.0) + 30.0 - c.clock.now()))
    c.on_call_done(call, output_tokens=30)
    c.on_query_done(call.query.id)


def test_a_light_tenant_back_from_idle_finds_the_flooder_over_its_share() -> None:
    # heavy floods a 4-slot instance with 30 s calls while light has a query in flight and
    # then goes idle; when light comes back, heavy has run far ahead meanwhile
    c = coordinator("flowsage", {"s": 30}, max_inflight=4)
    c.fairness.quantum_s = 10.0
    _arrive(c, "l0", "light", ready=False)  # light in flight, level with heavy at 0
    heavy = [_arrive(c, f"h{i}", "heavy") for i in range(3)]  # 90 s: over its share
    assert c.fairness.over_share(heavy[0].query)
    c.on_query_done("l0")  # light idle, 90 s behind heavy when it leaves
    for call in heavy:
        _finish(c, call)
    more = [_arrive(c, f"h{i}", "heavy") for i in range(3, 7)]  # alone: never over
    waiting = _arrive(c, "h7", "heavy")  # the slots are full: it waits
    assert waiting.state == CallState.WAITING
    assert not c.fairness.over_share(waiting.query)
    light = _arrive(c, "l1", "light")
    # light comes back two quanta behind heavy (its lag, capped), not level with it, so
    # heavy is over its share: a worse band, its waiting call behind light's
    heavy_vt = c.fairness.virtual_time(waiting.query)
    assert c.fairness.virtual_time(light.query) == heavy_vt - LAG_CAP_QUANTA * 10.0
    assert c.fairness.over_share(waiting.query)
    assert call_band(c, waiting.query) == call_band(c, light.query) + 1
    order = [x.query.id for x in c.queues["fast"].ordered_waiting(c.clock.now())]
    assert order == ["l1", "h7"]
    # the first heavy call to end frees a slot: light's call takes it, not heavy's
    _finish(c, more[0])
    assert light.state == CallState.RUNNING and waiting.state == CallState.WAITING


def _two_tenants_in_flight() -> tuple[TenantShares, QueryState, QueryState]:
    """Shares with a quantum of 10 s, and one query of tenants A and B, both arrived."""
    shares = TenantShares(quantum_s=10.0)
    a, b = (QueryState(id=n, arrival=0.0, deadline=None, slo_class="standard", tenant=t)
            for n, t in (("a", "A"), ("b", "B")))
    shares.arrive(a)
    shares.arrive(b)
    return shares, a, b


def test_a_long_idle_tenants_credit_is_capped_and_idling_earns_none() -> None:
    shares, a, b = _two_tenants_in_flight()
    shares.charge(a, 15.0)
    shares.leave(b)  # B leaves 15 s behind: within the cap, kept as is
    shares.charge(a, 10_000.0)  # A alone for a long time
    shares.arrive(b)
    assert shares.virtual_time(b) == 10_015.0 - 15.0  # its lag, nothing for the idle time
    shares.charge(a, 500.0)  # B falls 515 s behind while both are active
    shares.leave(b)
    shares.charge(a, 10_000.0)
    shares.arrive(b)  # back with at most the cap
    assert shares.virtual_time(b) == shares.virtual_time(a) - LAG_CAP_QUANTA * 10.0
    assert shares.over_share(a)  # A is more than a quantum ahead: B first ...
    shares.charge(b, LAG_CAP_QUANTA * 10.0 - 10.0)
    assert not shares.over_share(a)  # ... until B has used its credit (a quantum left)
    # a tenant that left ahead comes back no earlier than the least-served
    shares.charge(b, 100.0)
    shares.leave(b)
    shares.arrive(b)
    assert shares.virtual_time(b) == shares.virtual_time(a) + 90.0
    # the cap 0 is start-time fair queueing: every return level with the least-served
    sfq = TenantShares(quantum_s=10.0, lag_cap_quanta=0.0)
    sfq.arrive(a)
    sfq.arrive(b)
    sfq.charge(a, 50.0)
    sfq.leave(b)
    sfq.arrive(b)
    assert sfq.virtual_time(b) == 50.0 and not sfq.over_share(a)
    with pytest.raises(ValueError, match="lag_cap_quanta"):
        TenantShares(lag_cap_quanta=-1.0)


def test_a_call_cancelled_after_its_start_but_before_its_send_is_refunded() -> None:
    c = coordinator("flowsage", {"s": 30}, max_inflight=2)
    first = _arrive(c, "q1", "t")
    assert first.state == CallState.RUNNING and c.fairness.virtual_time(first.query) == 30.0
    # the runtime gave up on it before its request left: the tenant used no instance time
    c.on_call_cancelled(first, sent=False)
    assert c.fairness.virtual_time(first.query) == 0.0
    second = _arrive(c, "q2", "t")
    c.on_call_cancelled(second)  # sent, then cancelled: its charge stands
    assert c.fairness.virtual_time(second.query) == 30.0
    # the query's cancellation: the running call the runtime never sent is refunded
    third = _arrive(c, "q3", "t")
    assert c.fairness.virtual_time(third.query) == 60.0
    running, _ = c.cancel_query("q3", sent=lambda call: False)
    assert running == [third] and c.fairness.virtual_time(third.query) == 30.0
    fourth = _arrive(c, "q4", "t")
    c.cancel_query("q4")  # the runtime says nothing: every running call was sent
    assert c.fairness.virtual_time(fourth.query) == 60.0


async def _cancel_between_start_and_send() -> None:
    from agentflow.scheduler import Coordinator, InstanceSpec, ScheduledRouter
    from agentflow.workflow import ManualClock
    from tests.scheduler.test_router_races import Gated, OnceAfterDone, _call, _until
    from tests.scheduler.utils import FixedLengths

    c = Coordinator([InstanceSpec("a", max_inflight=1)], clock=ManualClock(),
                    policy="flowsage", length_model=FixedLengths({"s": 10}))
    a = Gated("a")
    router = ScheduledRouter(c, {"a": a}, revive_after_s=None)
    a.gates["first"] = asyncio.Event()
    first = asyncio.ensure_future(router.submit(_call(router, "first", "s", "standard", "u")))
    await _until(lambda: a.prompts() == ["first"])
    nxt = asyncio.ensure_future(router.submit(_call(router, "next", "s", "standard", "t")))
    await _until(lambda: "next" in c.queries and len(c.queries["next"].calls) == 1)
    (sc,) = c.queries["next"].calls
    (mine,) = c.queries["first"].calls
    before = c.fairness.virtual_time(sc.query)  # t came in level with u
    assert before == c.fairness.virtual_time(mine.query) > 0
    c.add_observer(OnceAfterDone(lambda: router.cancel_query("next")))
    a.gates["first"].set()  # ``first`` ends: ``next`` is started (charged), then cancelled
    await first
    with pytest.raises(asyncio.CancelledError):
        await nxt
    assert sc.state == CallState.CANCELLED and a.prompts() == ["first"]  # never sent
    assert c.fairness.virtual_time(sc.query) == pytest.approx(before)  # so it paid nothing


def test_the_router_refunds_a_call_whose_query_is_cancelled_before_its_send() -> None:
    asyncio.run(_cancel_between_start_and_send())


def test_a_tenant_back_in_an_empty_group_is_placed_where_the_group_emptied() -> None:
    """The cap holds when nobody is in flight at the return: B leaves 500 s behind (lag
    capped at 20 s), A runs alone 10,000 s more and leaves last; B comes back to an empty
    group, then A. Without the group's floor B kept vt 0 and A came back 10,500 s ahead."""
    s, a, b = _two_tenants_in_flight()
    s.charge(a, 500.0)
    s.leave(b)
    s.charge(a, 10_000.0)
    s.leave(a)
    s.arrive(b)
    s.arrive(a)
    gap = s.virtual_time(a) - s.virtual_time(b)
    assert gap == pytest.approx(LAG_CAP_QUANTA * 10.0)


def test_a_call_preempted_restarted_elsewhere_and_cancelled_in_one_turn_is_refunded() -> None:
    """Serving: the stopped attempt's backend task stays in the router's books until its
    watcher unwinds, a loop turn later; a cancel in that turn must see that the new attempt
    (admitted, and charged, on the other instance) was never sent."""
    from agentflow.scheduler import Coordinator, InstanceSpec, ScheduledRouter
    from agentflow.workflow import ManualClock
    from tests.scheduler.test_router_races import Gated, _call, _until
    from tests.scheduler.utils import FixedLengths

    async def race() -> tuple[float, list[str], str]:
        c = Coordinator([InstanceSpec(n, max_inflight=1) for n in "ab"], clock=ManualClock(),
                        policy="flowsage", preemption="class",
                        length_model=FixedLengths({"b": 100, "i": 10}))
        sends = {"batch": 0}

        def choose(call, cands, now, view):  # batch first on a, then (preempted) on b
            if call.query.id == "batch":
                sends["batch"] += 1
                return "a" if sends["batch"] == 1 else "b"
            return "a"
        c.dispatch.choose = choose
        backends = {n: Gated(n) for n in "ab"}
        router = ScheduledRouter(c, dict(backends), revive_after_s=None)
        backends["a"].gates["batch"] = asyncio.Event()
        batch = asyncio.ensure_future(router.submit(_call(router, "batch", "b", "batch", "t")))
        await _until(lambda: backends["a"].prompts() == ["batch"])
        (sc,) = c.queries["batch"].calls
        _call(router, "page", "i", "interactive")
        _, decisions = c.on_call_ready("page", stage="i", node_id="page.0", prompt_tokens=0,
                                       payload=asyncio.get_running_loop().create_future())
        router._apply(decisions)  # batch stopped on a, started (not yet sent) on b
        state = f"{sc.state.value} on {sc.instance}"
        router.cancel_query("batch")  # the same loop turn
        vt = c.fairness._tenants[("batch", "t")].vt
        backends["a"].let_go.set()
        for gate in backends["a"].gates.values():
            gate.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(batch, 5)
        return vt, backends["b"].prompts(), state

    vt, b_prompts, state = asyncio.run(race())
    assert state == "running on b" and b_prompts == []
    assert vt == pytest.approx(0.0)  # a's charge refunded by the stop, b's by the cancel
