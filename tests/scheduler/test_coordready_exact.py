"""Stop 52 (#36) cuts to the coordinator's per-event work give the values the code they
replaced gave, bit for bit: each is checked here against that code, kept in the test.

- ``ExactColumnMeans`` keeps its blocks' share of the sums as it moves (``_tally``), not
  walked at every ``means``: the same means as the walk, through random joins, leaves,
  block values (some not finite), row values and counted sets.
- ``TenantShares.pairs_in_flight`` is ``len(active_pairs())``, kept as queries come and go.
- ``InstanceTimeModel._fit_prefill``'s sums are updated term by term, not in two loops: the
  same floats as the loops.
- ``LearnedLengthModel.predict``'s mixture after the selection is one compiled pass
  (``price_kernel.mixture``): the same atoms as numpy's steps.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from agentflow.scheduler import price_kernel
from agentflow.scheduler.call import QueryState
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.exact_mean import _SHIFT, ExactColumnMeans
from agentflow.scheduler.fairness import TenantShares
from agentflow.scheduler.lengths.learned import LearnedLengthModel
from agentflow.scheduler.time_model import RATIO_CEILING, RATIO_FLOOR, InstanceTimeModel


def _walked_means(m: ExactColumnMeans) -> tuple[float, ...]:
    """``ExactColumnMeans.means`` as it was (main 4534c02): every block walked per read."""
    use_all = m._n_counted == 0
    rows = [i for i in m._odd_rows if use_all or m._counted[i]]
    k = len(m._ints) if use_all else m._n_counted
    blocks = [(b, len(b.members) if use_all else b.n_counted)
              for b in m._blocks.values() if b.members]
    odd = any(not math.isfinite(x) for b, n in blocks if n for x in b.values)
    if rows or odd:
        picked = [m._row_values(i) for i in range(len(m._ints)) if use_all or m._counted[i]]
        return tuple(sum(v[j] for v in picked) / k for j in range(len(m._sums)))
    sums = list(m._all if use_all else m._sums)
    for block, n in blocks:
        for j, x in enumerate(block.ints):
            sums[j] += n * x
    return tuple(s / (k << _SHIFT) for s in sums)


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all((x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


def _value(rng: random.Random) -> float:
    r = rng.random()
    if r < 0.03:
        return math.inf
    if r < 0.05:
        return math.nan
    if r < 0.1:
        return 0.0
    return rng.uniform(1e-9, 3.0) * 10.0 ** rng.randint(-6, 3)


def test_kept_block_totals_give_the_walked_means() -> None:
    for seed in range(30):
        rng = random.Random(seed)
        n, cols = rng.randint(1, 40), 3
        m = ExactColumnMeans(n, cols)
        keys = [("g", b) for b in range(rng.randint(1, 5))]
        checked = 0
        for _ in range(400):
            op = rng.random()
            if op < 0.3:
                m.set_row(rng.randrange(n), [_value(rng) for _ in range(cols)])
            elif op < 0.55:
                m.join_block(rng.randrange(n), rng.choice(keys))
            elif op < 0.75:
                m.set_block(rng.choice(keys), [_value(rng) for _ in range(cols)])
            elif op < 0.85:
                m.set_counted([rng.random() < 0.7 for _ in range(n)])
            elif op < 0.9:
                m.set_counted([False] * n)
            got, want = m.means(), _walked_means(m)
            assert _same(got, want), (seed, got, want)
            checked += 1
        assert checked == 400


def test_the_kept_totals_fail_when_a_move_is_not_tallied() -> None:
    """The check above can fail: a block whose value moves without ``_tally`` reads wrong."""
    m = ExactColumnMeans(4, 1)
    for i in range(4):
        m.set_row(i, [1.0])
    m.join_block(0, "b")
    m.join_block(1, "b")
    m.set_block("b", [2.0])
    assert m.means() == _walked_means(m) == (1.5,)
    block = m._blocks["b"]
    block.values, block.ints = (4.0,), [4 << _SHIFT]  # moved behind the totals' back
    assert m.means() != _walked_means(m)


def test_pairs_in_flight_is_the_number_of_active_pairs() -> None:
    rng = random.Random(7)
    shares = TenantShares(quantum_s=1.0)
    live: list[QueryState] = []
    for k in range(2000):
        if live and rng.random() < 0.5:
            q = live.pop(rng.randrange(len(live)))
            shares.leave(q)
            if rng.random() < 0.1:
                shares.leave(q)  # a second leave is ignored by both counts
        else:
            q = QueryState(id=f"q{k}", arrival=0.0, deadline=None,
                           slo_class=rng.choice(["standard", "batch", None]),
                           tenant=rng.choice(["A", "B", "C", None]))
            shares.arrive(q, now=float(k))
            live.append(q)
        assert shares.pairs_in_flight() == len(shares.active_pairs())


def _looped_fit(m: InstanceTimeModel, y: float, own: float, ahead: float,
                co_runners: float) -> None:
    """``_fit_prefill``'s sums as main 4534c02 updated them (two loops), then its refit."""
    if not all(math.isfinite(v) for v in (y, own, ahead, co_runners)):
        return
    total = own + ahead + co_runners
    y = min(max(y, RATIO_FLOOR * total), RATIO_CEILING * total)
    keep = 1.0 - 1.0 / m.prefill_window
    x = (own, ahead, co_runners)
    w = 1.0 / total
    xx, xy = m._prefill_xx, m._prefill_xy
    for i in range(3):
        xy[i] = keep * xy[i] + w * y * x[i]
        for j in range(3):
            xx[i][j] = keep * xx[i][j] + w * x[i] * x[j]
    m._prefill_yy = keep * m._prefill_yy + w * y * y


def test_the_written_out_prefill_sums_are_the_loops_floats() -> None:
    rng = random.Random(3)
    a = InstanceTimeModel(overhead_s=0.01, prefill_s_per_token=1e-4, decode_s_per_token=0.02)
    b = InstanceTimeModel(overhead_s=0.01, prefill_s_per_token=1e-4, decode_s_per_token=0.02)
    for _ in range(3000):
        args = [rng.uniform(1e-4, 2.0) * 10.0 ** rng.randint(-3, 2) for _ in range(4)]
        if rng.random() < 0.2:
            args[rng.randrange(1, 4)] = 0.0
        if rng.random() < 0.01:
            args[rng.randrange(4)] = math.inf
        a._fit_prefill(*args)
        _looped_fit(b, *args)
        assert a._prefill_xy == b._prefill_xy and a._prefill_xx == b._prefill_xx
        assert a._prefill_yy == b._prefill_yy


def test_the_prefill_check_can_fail() -> None:
    """A regrouped product in the written-out sums would show: the sums are compared exactly,
    and regrouping changes floats on these inputs."""
    rng = random.Random(4)
    differs = False
    for _ in range(200):
        y, own, ahead, co = (rng.uniform(0.01, 3.0) for _ in range(4))
        total = own + ahead + co
        w = 1.0 / total
        differs |= (w * own) * ahead != w * (own * ahead)
    assert differs  # so regrouping ``w * x[i] * x[j]`` would change floats the test reads


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np.float64).tobytes()


@pytest.mark.skipif(not price_kernel.AVAILABLE, reason="numba is not installed")
def test_the_compiled_mixture_is_the_numpy_mixture_bit_for_bit() -> None:
    """``price_kernel.mixture`` (selection, mixture, stable sort, atoms in one pass) against
    ``LearnedLengthModel._mixture`` after numpy's fancy indexing, on random neighbour sets
    with many equal outputs (the stable order decides the weights' sums), with and without
    a selection, at several supports."""
    rng = np.random.default_rng(11)
    model = LearnedLengthModel(window=400)
    for i in range(400):
        model.observe("s", "", float(rng.integers(1, 12) if i % 2 else rng.integers(1, 900)),
                      int(rng.integers(10, 2000)))
    previous = price_kernel.set_enabled(True)
    try:
        for case in range(1500):
            n = int(rng.integers(1, 300))
            rows = np.sort(rng.choice(model._count, size=n, replace=False)).astype(np.int64)
            sims = rng.uniform(0.2, 1.0, size=n)
            if case % 3 == 0:
                sims = np.round(sims, 1)  # ties in similarity too
            top = None if n <= model.k or case % 7 == 0 else \
                rng.permutation(n)[:model.k].astype(np.int64)
            baseline = model.stage_distribution("s")
            model.max_support = int(rng.choice([1, 4, 32, 64]))
            fast = price_kernel.mixture(model._out, rows, sims, top, baseline.values,
                                        baseline.probs, model.prior_strength,
                                        model.max_support)
            assert fast is not None
            r, s_ = (rows, sims) if top is None else (rows[top], sims[top])
            ref = model._mixture(r, s_, baseline)
            got = Distribution._trusted(fast[0], fast[1]) if fast[2] else \
                Distribution(fast[0], fast[1])
            assert _bits(got.values) == _bits(ref.values), case
            assert _bits(got.probs) == _bits(ref.probs), case
            model.max_support = 32
    finally:
        price_kernel.set_enabled(previous)


def test_the_mixture_is_left_to_numpy_when_the_loops_are_off() -> None:
    previous = price_kernel.set_enabled(False)
    try:
        one = np.ones(1)
        assert price_kernel.mixture(one, np.zeros(1, dtype=np.int64), one, None, one, one,
                                    2.0, 32) is None
    finally:
        price_kernel.set_enabled(previous)


@pytest.mark.skipif(not price_kernel.AVAILABLE, reason="numba is not installed")
def test_the_compiled_baseline_is_the_numpy_baseline_bit_for_bit() -> None:
    """``price_kernel.baseline`` (a stage's outputs merged with its prior, then atoms)
    against ``_baseline``'s numpy merge, with prior atoms equal to outputs (their place
    among equal values decides the weights' sums), empty windows and several supports."""
    rng = np.random.default_rng(12)
    for case in range(1500):
        k = int(rng.integers(1, 20))  # a prior of odd weights, some atoms shared below
        prior = Distribution(np.unique(rng.integers(1, 60, size=k)).astype(float), None) \
            if case % 5 == 0 else None
        if prior is not None:
            prior = Distribution(prior.values, rng.uniform(0.1, 1.0, size=prior.values.size))
        model = LearnedLengthModel(window=600, max_support=int(rng.choice([1, 3, 32, 80])),
                                   priors=None if prior is None else {"evaluate": prior},
                                   stage_prior_weight=float(rng.choice([4.0, 3.3, 0.7])))
        prior = model.prior("evaluate")
        n = int(rng.integers(0, 500))
        pool = np.concatenate((prior.values, rng.integers(1, 60, size=20).astype(float)))
        for _ in range(n):
            model.observe("evaluate", "", float(rng.choice(pool)), 100)
        sid = model._stage_ids.get("evaluate")
        if sid is None:
            continue
        answers = []
        for on in (True, False):
            previous = price_kernel.set_enabled(on)
            try:
                model._baselines.clear()
                d = model._baseline("evaluate", sid)
            finally:
                price_kernel.set_enabled(previous)
            answers.append((_bits(d.values), _bits(d.probs)))
        assert answers[0] == answers[1], case


@pytest.mark.skipif(not price_kernel.AVAILABLE, reason="numba is not installed")
def test_the_window_s_sorted_outputs_move_as_numpy_moves_them() -> None:
    """``price_kernel.sorted_insert`` / ``sorted_remove`` (``observe``'s upkeep of each
    stage's sorted outputs) give numpy's arrays, loops on and off, through a random history
    with many equal values."""
    rng = np.random.default_rng(13)
    arrays = {on: np.zeros(0) for on in (True, False)}
    held: list[float] = []
    for _ in range(3000):
        remove = bool(held) and rng.random() < 0.45
        x = float(held.pop(int(rng.integers(0, len(held))))) if remove \
            else float(rng.integers(0, 40) if rng.random() < 0.7 else rng.uniform(0, 900))
        if not remove:
            held.append(x)
        for on in (True, False):
            previous = price_kernel.set_enabled(on)
            try:
                move = price_kernel.sorted_remove if remove else price_kernel.sorted_insert
                arrays[on] = move(arrays[on], x)
            finally:
                price_kernel.set_enabled(previous)
        assert _bits(arrays[True]) == _bits(arrays[False])
        assert _bits(arrays[True]) == _bits(np.sort(np.array(held, dtype=float)))
