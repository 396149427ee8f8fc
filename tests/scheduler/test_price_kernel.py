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


# ------------------------------------------- a distribution's atoms: merged, normalised, binned


def test_the_pairwise_sum_is_numpy_s():
    """``_pairwise_sum`` against ``ndarray.sum`` (0.0 plus it) and ``np.add.reduceat`` (a
    run's first term plus it) on random arrays of 1 to 5,000 terms over ten decades: the
    orders ``sorted_atoms`` relies on."""
    rng = np.random.default_rng(3)
    for _ in range(1500):
        n = int(rng.integers(1, 5000))
        a = rng.random(n) * 10.0 ** rng.uniform(-5, 5, n)
        lo = int(rng.integers(0, min(n, 3)))
        assert float(a[lo:].sum()) == 0.0 + price_kernel._pairwise_sum(a, lo, n - lo)
        assert float(np.add.reduceat(a, [lo])[0]) == a[lo] + price_kernel._pairwise_sum(
            a, lo + 1, n - lo - 1)


def _atoms_case(rng, t):
    n = int(rng.integers(1, 1200))
    kind = t % 5
    if kind == 0:  # short outputs: long runs of equal values
        v = np.sort(rng.integers(1, 60, n).astype(float))
    elif kind == 1:
        v = np.sort(rng.integers(1, 3000, n).astype(float))
    elif kind == 2:
        v = np.sort(rng.random(n) * 1000)
    elif kind == 3:
        v = np.sort(np.round(rng.lognormal(4, 1.5, n)))
    else:  # values a few ulps apart: binned means that collide (the validating fallback)
        v = np.sort(1.0 + rng.integers(0, 40, n) * np.finfo(float).eps)
    w = (rng.random(n) * 10.0 ** rng.uniform(-3, 3, n) if t % 3
         else np.where(rng.random(n) < 0.9, 1.0, rng.random(n)))  # window outputs and a prior
    return v, w, int(rng.choice([1, 2, 8, 16, 32, 64]))


def test_sorted_atoms_are_numpy_s_bit_for_bit():
    from agentflow.scheduler.distribution import Distribution

    rng = np.random.default_rng(4)
    previous = price_kernel.set_enabled(True)
    fallbacks = 0
    try:
        for t in range(2500):
            v, w, ms = _atoms_case(rng, t)
            price_kernel.set_enabled(True)
            fast = Distribution._from_sorted_atoms(v.copy(), w.copy(), ms)
            got = price_kernel.sorted_atoms(v.copy(), w.copy(), ms)
            assert got is not None
            fallbacks += not got[2]
            price_kernel.set_enabled(False)
            ref = Distribution._from_sorted_atoms(v.copy(), w.copy(), ms)
            assert _bits(fast.values) == _bits(ref.values), (t, ms)
            assert _bits(fast.probs) == _bits(ref.probs), (t, ms)
    finally:
        price_kernel.set_enabled(previous)
    assert fallbacks > 0  # the out-of-order binned means were met too


def test_predictions_are_the_same_with_the_loop():
    """A learned length model's predictions and stage baselines (the callers on the hot
    path: the atoms, the window rows and the neighbour filter), loop on and off, on one
    seeded history with and without key texts and prompt lengths."""
    from agentflow.scheduler.lengths.learned import LearnedLengthModel

    rng = np.random.default_rng(5)
    stages = ["evaluate", "revise", "generate_candidate_llama-agent", "unknown"]
    models = {on: LearnedLengthModel(window=300) for on in (True, False)}
    previous = price_kernel.set_enabled(True)
    try:
        for i in range(900):
            stage = stages[int(rng.integers(0, len(stages)))]
            key = "" if i % 3 else f"question {int(rng.integers(0, 40))}"
            # some without a prompt length: NaN terms in the window, counted as 1.0
            prompt = None if i % 5 == 0 else int(rng.integers(50, 4000))
            out = float(np.round(rng.lognormal(4, 1.2)))
            cap = None if i % 4 else 200
            answers = []
            for on, m in models.items():
                price_kernel.set_enabled(on)
                d = m.predict(stage, key, prompt, max_tokens=cap)
                answers.append((_bits(d.values), _bits(d.probs)))
                m.observe(stage, key, out, prompt)
            assert answers[0] == answers[1], i
    finally:
        price_kernel.set_enabled(previous)
