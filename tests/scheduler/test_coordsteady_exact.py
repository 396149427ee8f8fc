"""Stop 53 (#36) cuts to what grows with calls in flight give the values the code they
replaced gave, bit for bit: each is checked here against that code, kept in the test.

- ``remaining.remaining_s`` keeps a call's ``expected_residual`` until its prediction, its
  tokens written or its cap move: at every pricing of a seeded simulation (the admission
  gate's rank hold prices decoding co-runners at each admission it tries), the same float
  as pricing on a fresh copy of the prediction, with no kept answer anywhere.
- ``InstanceQueue.settle_kv`` reserves once per held call, at the most its reports ask
  (``ClusterView._kv_tokens_at_most``), not report by report: at every settle of seeded
  simulations under KV pressure, the instance's KV total and every call's reservation are
  the floats the report-by-report loop (kept here) gives.
- ``WorkflowPaths._critical_paths`` rebuilds a grown graph's order from the graph's own
  dicts, not through ``run.node`` and ``graph.successors``: every pass of seeded
  simulations (with tool steps and expansions) gives the paths, bounds, work left and
  kept order of the old build, and the same records.
"""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any

import numpy as np
import pytest

from agentflow.scheduler import remaining, risk
from agentflow.scheduler.call import QueryState, ScheduledCall
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.gittins import expected_residual
from agentflow.scheduler.instance import InstanceQueue


def _fresh(d: Distribution) -> Distribution:
    """A copy of ``d`` with nothing kept (its own arrays, no caches)."""
    return Distribution._trusted(d.values.copy(), d.probs.copy())


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _call(output: Distribution, attained: int, cap: int | None = None) -> ScheduledCall:
    q = QueryState(id="q", arrival=0.0, deadline=None)
    c = ScheduledCall(id="c", query=q, stage="s", node_id="n", prompt_tokens=10,
                      output=output, ready_at=0.0, max_tokens=cap)
    c.attained_tokens = attained
    return c


class _Coordinator:
    def __init__(self) -> None:
        from agentflow.scheduler.time_model import InstanceTimeModel
        self.time_models = {"i": InstanceTimeModel(prefill_s_per_token=1e-4,
                                                   decode_s_per_token=0.02)}


def test_the_kept_residual_moves_with_what_it_was_computed_from() -> None:
    """Each input of the kept residual, moved alone, gives the fresh answer (a memo that
    ignored one would give the old one: checked, the values differ)."""
    co = _Coordinator()
    a, b = Distribution([10.0, 50.0, 400.0]), Distribution([20.0, 90.0, 900.0])
    call = _call(a, 5)
    first = remaining.remaining_s(co, call, "i", 0.0)
    steps: list[tuple[str, Any]] = [("attained_tokens", 60), ("output", b),
                                    ("max_tokens", 100), ("attained_tokens", 95)]
    seen = {first}
    for field, value in steps:
        setattr(call, field, value)
        got = remaining.remaining_s(co, call, "i", 0.0)
        want = float(co.time_models["i"].decode_s(
            expected_residual(_fresh(call.output), call.attained_tokens, call.max_tokens)))
        assert _bits(got) == _bits(want), field
        seen.add(got)
    assert len(seen) == len(steps) + 1  # every move changed the answer


def test_kept_residuals_are_fresh_ones_at_every_pricing_of_a_simulation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.sim.scenarios import small_scenario

    counts: Counter[str] = Counter()
    kept = remaining.remaining_s

    def checked(coordinator: Any, call: ScheduledCall, instance: str, now: float) -> float:
        memo = call.residual_memo
        hit = memo is not None and memo[0] is call.output and \
            memo[1] == call.attained_tokens and memo[2] == call.max_tokens
        got = kept(coordinator, call, instance, now)
        model = coordinator.time_models[instance]
        want = float(model.decode_s(expected_residual(
            _fresh(call.output), call.attained_tokens, call.max_tokens))) + \
            remaining.prefill_left_s(coordinator, call, instance, now)
        assert _bits(got) == _bits(want)
        counts["kept" if hit else "computed"] += 1
        return got

    monkeypatch.setattr(risk, "remaining_s", checked)
    scenario = small_scenario(True, False)  # two tenants: the hold prices co-runners
    scenario.run(scenario.simulation("flowsage"))
    assert counts["computed"] > 50
    assert counts["kept"] > 50  # the kept path ran


def test_a_residual_of_a_copied_prediction_is_the_same_float() -> None:
    """The reference above prices on a copy: a copy prices as the original does."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        d = Distribution(rng.uniform(0, 3000, n), rng.uniform(0.01, 1, n))
        for a in rng.integers(0, 3500, 5).tolist():
            assert _bits(expected_residual(d, a)) == _bits(expected_residual(_fresh(d), a))


def _settled_report_by_report(q: InstanceQueue) -> tuple[float, dict[str, int]]:
    """What ``settle_kv`` gave before (1342d94): each held report priced and reserved in
    turn (``reserve``'s rule written out on plain numbers, nothing moved)."""
    assert q.kv_at is not None
    total = float(q.book.kv_settled[q.index])
    reserved = {}
    for call, written in q._kv_held.items():
        r = call.kv_reserved
        for w in written:
            k = q.kv_at(call, w)
            if call in q.running and k > r:
                total += k - r
                r = k
        reserved[call.id] = r
    return total, reserved


@pytest.mark.parametrize("tenants,rate", [(False, 30.0), (True, 0.0), (False, 3.0)])
def test_one_reservation_per_call_is_the_report_by_report_settle(
        monkeypatch: pytest.MonkeyPatch, tenants: bool, rate: float) -> None:
    from tests.sim.scenarios import small_scenario

    counts: Counter[str] = Counter()
    settle = InstanceQueue.settle_kv

    def checked(self: InstanceQueue) -> None:
        if not self._kv_held:
            settle(self)
            return
        assert self.kv_at_most is not None  # the coordinator's one-reservation rule
        want_total, want = _settled_report_by_report(self)
        calls = list(self._kv_held)
        counts["reports"] += sum(len(w) for w in self._kv_held.values())
        counts["many"] += sum(len(w) > 1 for w in self._kv_held.values())
        settle(self)
        assert _bits(float(self.book.kv_settled[self.index])) == _bits(want_total)
        assert {c.id: c.kv_reserved for c in calls} == want
        counts["settles"] += 1

    monkeypatch.setattr(InstanceQueue, "settle_kv", checked)
    scenario = small_scenario(tenants, False, rate)
    scenario.run(scenario.simulation("flowsage"))
    assert counts["settles"] > 20 and counts["many"] > 20  # calls with several reports


def test_the_rebuilt_order_is_the_old_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """At every rebuild of seeded simulations (graphs that grew), the pass made on the old
    build and the pass made on the new one, from the same state, give the same paths,
    bounds, work left and kept order (the new one's state goes on)."""
    from agentflow.scheduler import paths
    from tests.sim.scenarios import small_scenario

    counts: Counter[str] = Counter()
    original = paths.WorkflowPaths._critical_paths

    def outputs(query: QueryState) -> tuple[Any, ...]:
        assert query.topo is not None
        return (tuple(query.path_cache.items()), query.path_lo, query.path_hi,
                query.work_left, query.paths_stamp,
                tuple((n, node.id, tuple(succ)) for n, node, succ in query.topo[1]))

    def both(self: Any, query: QueryState, now: float, coefs: Any = None,
             prompts: Any = None) -> None:
        assert query.run is not None
        if query.topo is not None and query.topo[0] == len(query.run.graph):
            original(self, query, now, coefs, prompts)
            return
        before = (query.topo, query.paths_stamp, query.paths_due)
        monkeypatch.setattr(paths, "_DICT_REBUILD", False)
        original(self, query, now, coefs, prompts)  # makes any prediction the pass needs
        old = outputs(query)
        query.topo, query.paths_stamp, query.paths_due = before
        monkeypatch.setattr(paths, "_DICT_REBUILD", True)
        original(self, query, now, coefs, prompts)
        assert outputs(query) == old
        counts["rebuilt"] += 1

    monkeypatch.setattr(paths.WorkflowPaths, "_critical_paths", both)
    for tenants in (False, True):
        scenario = small_scenario(tenants, False)
        scenario.run(scenario.simulation("flowsage"))
    assert counts["rebuilt"] > 100  # graphs grew and were ordered again
