"""Distribution: constructors, summaries, transforms, sums, compression; SageSched's cost.
Expected values are worked out by hand in the comments."""

from __future__ import annotations

import numpy as np
import pytest

from agentflow.scheduler.distribution import Distribution, cost_distribution, kv_cost


def test_constructor_sorts_merges_and_normalises() -> None:
    d = Distribution([3, 1, 3, 2], [1, 1, 1, 0])  # the 2 has no mass; the two 3s merge
    assert d.values.tolist() == [1.0, 3.0]
    assert d.probs.tolist() == pytest.approx([1 / 3, 2 / 3])
    with pytest.raises(ValueError):
        d.values[0] = 5.0  # immutable
    with pytest.raises(ValueError):
        Distribution([-1.0, 2.0])
    with pytest.raises(ValueError):
        Distribution([1.0, 2.0], [0.0, 0.0])
    with pytest.raises(ValueError):
        Distribution([])


def test_point() -> None:
    d = Distribution.point(4)
    assert d.mean() == 4 and d.variance() == 0
    assert d.quantile(0.0) == d.quantile(1.0) == 4
    assert d.cdf(3.9) == 0 and d.cdf(4) == 1 and d.survival(4) == 0
    with pytest.raises(ValueError):
        Distribution.point(-1)


def test_summaries_on_a_small_sample() -> None:
    # samples 1, 2, 2, 3 -> P(1) = .25, P(2) = .5, P(3) = .25; mean 2, variance .5
    d = Distribution.from_samples([1, 2, 2, 3])
    assert d.values.tolist() == [1, 2, 3]
    assert d.probs.tolist() == [0.25, 0.5, 0.25]
    assert d.mean() == 2 and d.variance() == pytest.approx(0.5)
    # lower quantile: smallest v with P(X <= v) >= q; CDF is .25 at 1, .75 at 2, 1 at 3
    assert d.quantile(0.25) == 1 and d.quantile(0.26) == 2
    assert d.quantile(0.75) == 2 and d.quantile(0.76) == 3
    assert d.quantile(np.array([0.1, 0.5, 0.9])).tolist() == [1, 2, 3]
    assert d.cdf(0.5) == 0 and d.cdf(2) == 0.75 and d.cdf(2.5) == 0.75 and d.cdf(3) == 1
    assert d.survival(2) == 0.25 and d.survival(0) == 1 and d.survival(3) == 0
    assert d.cdf(np.array([1, 2])).tolist() == [0.25, 0.75]
    assert d.min() == 1 and d.max() == 3 and len(d) == 3


def test_weighted_samples() -> None:
    # 10 with weight 3, 20 with weight 1 -> P(10) = .75; mean 12.5
    d = Distribution.from_samples([10, 20], weights=[3, 1])
    assert d.probs.tolist() == [0.75, 0.25] and d.mean() == 12.5


def test_compression_is_quantile_binning_with_exact_mean() -> None:
    # 1..1000 equally likely into 10 slices of 100 consecutive integers: atoms at
    # (1+100)/2 = 50.5, 150.5, ..., 950.5, each with probability .1; mean (1+1000)/2 = 500.5
    d = Distribution.from_samples(np.arange(1, 1001), max_support=10)
    assert d.values.tolist() == pytest.approx([50.5 + 100 * i for i in range(10)])
    assert d.probs.tolist() == pytest.approx([0.1] * 10)
    assert d.mean() == pytest.approx(500.5, rel=1e-12)


def test_compression_keeps_a_dominant_atom_exactly() -> None:
    # 22 with mass .9 and 1..10 with .01 each; 8 slices of .125. The atom at 22 holds >= 2/8
    # of the mass so it stays at exactly 22 with exactly .9; the median is 22.
    values = np.concatenate(([22.0], np.arange(1.0, 11.0)))
    weights = np.concatenate(([0.9], np.full(10, 0.01)))
    d = Distribution.from_samples(values, weights, max_support=8)
    assert len(d) <= 8
    assert 22.0 in d.values.tolist()
    assert d.probs[d.values.tolist().index(22.0)] == pytest.approx(0.9)
    assert d.quantile(0.5) == 22.0
    assert d.mean() == pytest.approx(0.9 * 22 + 0.01 * 55)


def test_map_scale_shift_clip() -> None:
    d = Distribution([10, 20], [0.5, 0.5])
    secs = d.map(lambda t: 0.5 + 0.02 * t)  # 10 tok -> 0.7 s, 20 tok -> 0.9 s
    assert secs.values.tolist() == pytest.approx([0.7, 0.9]) and secs.probs.tolist() == [.5, .5]
    # a non-monotone map still works: [1, 2, 3] -> (x - 2)^2 = [1, 0, 1] -> P(0)=1/3, P(1)=2/3
    sq = Distribution([1, 2, 3]).map(lambda x: (x - 2) ** 2)
    assert sq.values.tolist() == [0, 1] and sq.probs.tolist() == pytest.approx([1 / 3, 2 / 3])
    assert d.scale(3).values.tolist() == [30, 60]
    assert d.scale(0).values.tolist() == [0]
    assert d.shift(5).values.tolist() == [15, 25]
    assert d.shift(-10).values.tolist() == [0, 10]
    with pytest.raises(ValueError):
        d.shift(-11)  # would make lengths negative
    assert d.clip(15).values.tolist() == [10, 15]
    assert d.clip(100) is d


def test_add_is_convolution() -> None:
    coin = Distribution([0, 1])
    two = coin.add(coin)  # 0: 1/4, 1: 1/2, 2: 1/4
    assert two.values.tolist() == [0, 1, 2] and two.probs.tolist() == [0.25, 0.5, 0.25]
    # point + anything is a shift
    assert Distribution.point(5).add(coin).values.tolist() == [5, 6]
    # sum of 20 independent uniform{0..9}: mean 20 * 4.5 = 90, exact through compression;
    # variance 20 * 8.25 = 165 before compression, at most that after (it can only shrink)
    digits = Distribution(np.arange(10))
    s = Distribution.sum_all([digits] * 20, max_support=64)
    assert len(s) <= 64
    assert s.mean() == pytest.approx(90, rel=1e-12)
    assert 150 < s.variance() <= 165 + 1e-9
    assert Distribution.sum_all([]).values.tolist() == [0]
    assert Distribution.sum_all([Distribution.point(1), Distribution.point(2)]).values.tolist() \
        == [3]


def test_mixture() -> None:
    # .75 * point(10) + .25 * point(30): mean 15
    m = Distribution.point(10).mixture(Distribution.point(30), 0.25)
    assert m.values.tolist() == [10, 30] and m.probs.tolist() == [0.75, 0.25]


def test_conditional_above() -> None:
    d = Distribution([1, 10, 20], [0.5, 0.25, 0.25])
    # given X > 1: 10 and 20 with .25/.5 = .5 each
    c = d.conditional_above(1)
    assert c.values.tolist() == [10, 20] and c.probs.tolist() == [0.5, 0.5]
    assert d.conditional_above(0.5).probs.tolist() == [0.5, 0.25, 0.25]
    with pytest.raises(ValueError):
        d.conditional_above(20)


def test_sample_is_reproducible_and_matches_probabilities() -> None:
    d = Distribution([1, 5], [0.2, 0.8])
    a = d.sample(np.random.default_rng(7), 20_000)
    b = d.sample(np.random.default_rng(7), 20_000)
    assert np.array_equal(a, b)
    assert set(np.unique(a).tolist()) == {1.0, 5.0}
    assert np.mean(a == 1) == pytest.approx(0.2, abs=0.02)


def test_kv_cost_and_cost_distribution() -> None:
    # I = 100, O = 10: 10^2 / 2 + 100 * 10 = 50 + 1000 = 1050
    assert kv_cost(100, 10) == 1050
    assert kv_cost(np.array([0, 100]), np.array([4, 0])).tolist() == [8, 0]
    # O in {10, 20} at I = 100: {1050, 200 + 2000 = 2200}, same probabilities
    c = cost_distribution(100, Distribution([10, 20], [0.3, 0.7]))
    assert c.values.tolist() == [1050, 2200] and c.probs.tolist() == [0.3, 0.7]


def test_scalar_paths_give_the_floats_the_array_paths_give() -> None:
    """The per-event scalar paths (one quantile level, one survival point, the conditional
    quantile without building the conditional distribution) are the same arithmetic."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        d = Distribution(rng.integers(1, 600, size=n).astype(float), rng.random(n) + 1e-3)
        for q in (0.0, 0.1, 0.3, 0.9, 1.0):
            assert d.quantile(q) == float(d.quantile(np.array([q]))[0])
        for a in (0.0, float(d.values[0]), float(d.values[len(d.values) // 2]),
                  float(d.values[-1]) - 0.5):
            assert d.survival(a) == float(d.survival(np.array([a]))[0])
            if d.survival(a) > 0:
                assert d.conditional_quantile(a, 0.9) == d.conditional_above(a).quantile(0.9)
    with pytest.raises(ValueError, match="no probability mass"):
        Distribution.point(3.0).conditional_quantile(3.0, 0.9)


def test_quantile_above_is_the_survival_test_then_the_conditional_quantile() -> None:
    """``quantile_above`` (one search for both, what the KV reserve reads per report) gives
    ``conditional_quantile`` where ``survival > 0`` and None where no mass is above."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        d = Distribution(rng.integers(1, 600, size=n).astype(float), rng.random(n) + 1e-3)
        for a in (0, 1, int(d.values[0]), int(d.values[len(d.values) // 2]),
                  int(d.values[-1]) - 1, int(d.values[-1]), int(d.values[-1]) + 7):
            for q in (0.5, 0.9):
                got = d.quantile_above(a, q)
                if d.survival(a) > 0:
                    assert got == d.conditional_quantile(a, q)
                else:
                    assert got is None
    with pytest.raises(ValueError, match="quantile level"):
        Distribution.point(3.0).quantile(1.5)
