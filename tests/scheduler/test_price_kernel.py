"""The compiled price (``scheduler.price_kernel``) is numpy's fused price bit for bit.

At every ``marginal_price`` of seeded replays the loop and ``_marginal_price_numpy`` are
both run and their prices, co-runners and name ranks compared bit for bit: the replays of
``test_view_rows`` (classes and tenants, so worse-band work behind, shielded calls and
peers counts; KV budgets; failures, so prices on a subset of instances), the benchmark's
fleet without KV budgets, per-instance prompt lengths. Whole simulations under KV
pressure with progress reports held (the loop reports instances whose held reports could
change the room test; the view settles those and prices again) make the same decisions and
records with the loop as without it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from agentflow.bench.scheduler import scheduler_overhead
from agentflow.scheduler import Coordinator, price_kernel
from agentflow.scheduler.view import ClusterView
from tests.scheduler.test_view_rows import PEER_SPECS, SPECS, replay

pytestmark = pytest.mark.skipif(not price_kernel.AVAILABLE, reason="numba is not installed")


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(np.asarray(a, dtype=float)).tobytes()


@pytest.fixture
def both(monkeypatch):
    """At every ``marginal_price``: the loop first (so its own settling of held reports
    runs), then numpy on the state it left (settled reports price as held ones would), both
    answers compared bit for bit. Yields the number of candidates of each comparison."""
    seen: list[int] = []

    def price(self, call, instances, now):
        fast = self._marginal_price_loop(call, instances, now)
        ref = self._marginal_price_numpy(call, instances, now)
        for a, b in zip(fast, ref):
            assert _bits(a) == _bits(b), (call.id, len(instances))
        seen.append(len(instances))
        return fast

    monkeypatch.setattr(ClusterView, "marginal_price", price)
    return seen


@pytest.mark.parametrize("policy", ["flowsage", "oracle", "marginal_delay+fcfs",
                                    "cache_aware+edf"])
@pytest.mark.parametrize("specs", ["plain", "peers"])
def test_the_loop_prices_numpy_s_floats(policy, specs, both):
    replay(Coordinator, policy, seed=13, specs=SPECS if specs == "plain" else PEER_SPECS)
    assert len(both) > 100 and min(both) < max(both)  # some on a subset


def test_the_loop_on_the_benchmark_s_fleet(both):
    """64 instances without KV budgets (the room test skips KV), learning at every finish."""
    scheduler_overhead.measure("flowsage", 1000, 60, "hetero-64")
    assert len(both) > 1000


def test_the_loop_with_per_instance_prompt_lengths(both):
    from agentflow.workflow import ManualClock

    c = Coordinator(SPECS, clock=ManualClock(0.0), policy="flowsage")
    c.on_query_arrival("q", deadline=30.0)
    for k in range(12):
        c.clock.advance(0.1)
        c.on_call_ready("q", stage="generate_candidate", node_id=f"n{k}", prompt_tokens=900,
                        prompt_tokens_by_instance={s.name: 700 + 97 * i + k
                                                   for i, s in enumerate(SPECS)})
    assert len(both) == 12


@pytest.mark.parametrize("tenants,faults,rate", [(False, False, 30.0), (True, False, 0.0),
                                                 (False, True, 3.0)])
def test_whole_simulations_decide_alike_with_the_loop(tenants, faults, rate, monkeypatch):
    """KV pressure on paper-4gpu with held progress reports (``tests/sim/test_kv_fold``'s
    runs): every decision, its time and priority, and every record, loop on and off; the
    loop's settle-and-price-again path must have run."""
    from tests.sim.test_kv_fold import _run

    unsure = []
    loop = price_kernel.price_loop

    def counted(*args):
        result = loop(*args)
        unsure.append(result)
        return result

    monkeypatch.setattr(price_kernel, "price_loop", counted)
    previous = price_kernel.set_enabled(True)
    try:
        fast, fast_decisions, _ = _run("flowsage", False, tenants, faults, rate)
        price_kernel.set_enabled(False)
        ref, ref_decisions, _ = _run("flowsage", False, tenants, faults, rate)
    finally:
        price_kernel.set_enabled(previous)
    assert len(unsure) > 50
    assert fast_decisions == ref_decisions
    assert fast == ref
    if not tenants:
        assert any(unsure)  # some dispatch settled held reports before pricing


def test_max_and_min_follow_numpy_on_ties_and_nan():
    """``np.maximum`` / ``np.minimum`` on equal operands give the second (signed zeros), and
    NaN if either is NaN: the compiled helpers must too."""
    cases = [(-0.0, 0.0), (0.0, -0.0), (math.nan, 1.0), (1.0, math.nan), (2.0, 1.0),
             (1.0, 2.0), (-math.inf, math.inf)]
    for a, b in cases:
        for ours, ref in ((price_kernel._maximum, np.maximum), (price_kernel._minimum,
                                                                  np.minimum)):
            got, want = ours(a, b), float(ref(np.array([a]), np.array([b]))[0])
            assert _bits(np.array([got])) == _bits(np.array([want])), (ours, a, b)
