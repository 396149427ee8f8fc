"""Gittins index: hand-computed cases, the over-run rule, the bucketed ranker, and a textbook
case where Gittins ordering beats shortest-mean-first on mean completion time.

Notation: G(a) = max over d > 0 of P(C <= a + d | C > a) / E[min(C, a + d) - a | C > a].
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest

from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.gittins import GittinsRanker, gittins_index, gittins_quantum


def test_two_point_uniform() -> None:
    c = Distribution([1, 10])  # 1 or 10, each w.p. 1/2
    # a = 0: d = 1  -> P(C <= 1) / E[min(C, 1)] = .5 / (.5*1 + .5*1) = .5
    #        d = 10 -> 1 / E[C] = 1 / (.5*1 + .5*10) = 1 / 5.5 ~ .18;  G(0) = .5, quantum 1
    assert gittins_index(c) == pytest.approx(0.5)
    assert gittins_quantum(c) == pytest.approx(1.0)
    # a = 1: only 10 remains, d = 9 -> 1 / 9
    assert gittins_index(c, 1.0) == pytest.approx(1 / 9)


def test_point_mass_is_srpt() -> None:
    four = Distribution.point(4)
    assert gittins_index(four) == pytest.approx(1 / 4)  # 1 / remaining size
    assert gittins_index(four, 3.0) == pytest.approx(1.0)  # 1 / (4 - 3)


def test_three_point() -> None:
    c = Distribution([2, 3, 10], [0.2, 0.5, 0.3])
    # a = 0: d = 2  -> .2 / E[min(C, 2)] = .2 / 2 = .1
    #        d = 3  -> .7 / E[min(C, 3)] = .7 / (.2*2 + .8*3) = .7 / 2.8 = .25
    #        d = 10 -> 1 / E[C] = 1 / (.4 + 1.5 + 3) = 1 / 4.9 ~ .204
    # the best quantum is the middle one: G(0) = .25 with d = 3
    assert gittins_index(c) == pytest.approx(0.25)
    assert gittins_quantum(c) == pytest.approx(3.0)
    # a = 2: given C > 2, P(3) = .5/.8 = 5/8, P(10) = 3/8
    #        d = 1 -> (5/8) / 1 = .625;  d = 8 -> 1 / (5/8*1 + 3/8*8) = 1 / 3.625 ~ .276
    assert gittins_index(c, 2.0) == pytest.approx(0.625)
    # a = 2.5: d = .5 -> (5/8) / .5 = 1.25;  d = 7.5 -> 1 / (5/8*.5 + 3/8*7.5) = 1/3.125 = .32
    assert gittins_index(c, 2.5) == pytest.approx(1.25)
    # a = 3: only 10 remains -> 1 / 7
    assert gittins_index(c, 3.0) == pytest.approx(1 / 7)


def test_over_run_rule() -> None:
    c = Distribution([2, 3, 10], [0.2, 0.5, 0.3])
    # no mass above a >= 10: residual taken as max(a, max support) -> G = 1 / max(a, 10)
    assert gittins_index(c, 10.0) == pytest.approx(1 / 10)
    assert gittins_index(c, 20.0) == pytest.approx(1 / 20)
    assert gittins_quantum(c, 20.0) == math.inf
    # finite for a zero-length prediction at zero attained
    assert math.isfinite(gittins_index(Distribution.point(0.0)))
    # never above the index the call had while within its prediction ...
    within = [gittins_index(c, a) for a in np.linspace(0, 9.99, 200)]
    over = [gittins_index(c, a) for a in np.linspace(10, 1000, 200)]
    assert max(over) <= min(within)
    # ... positive and non-increasing as the over-run grows (no starvation, no queue jumping)
    assert all(x > 0 for x in over) and all(x >= y for x, y in zip(over, over[1:]))
    # point mass 4 reached exactly: 1/4, the same as a fresh one
    assert gittins_index(Distribution.point(4), 4.0) == pytest.approx(1 / 4)
    with pytest.raises(ValueError):
        gittins_index(c, -1.0)


def _brute_force(dist: Distribution, a: float, grid: np.ndarray) -> float:
    """The definition evaluated directly on candidate quanta d (no vectorised tricks)."""
    above = dist.values > a
    p = dist.probs[above] / dist.probs[above].sum()
    v = dist.values[above]
    best = 0.0
    for d in grid:
        done = p[v <= a + d].sum()
        service = float(np.sum(p * (np.minimum(v, a + d) - a)))
        best = max(best, done / service)
    return best


def test_matches_the_definition_on_random_distributions() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        dist = Distribution(rng.integers(1, 200, size=8), rng.random(8))
        for a in (0.0, float(dist.quantile(0.3)), float(dist.quantile(0.7)) + 0.5):
            if dist.survival(a) == 0:
                continue
            # support points (where the max lives) plus a dense grid in between
            grid = np.concatenate((dist.values[dist.values > a] - a, np.linspace(0.01, 200, 400)))
            assert gittins_index(dist, a) == pytest.approx(_brute_force(dist, a, grid))


# ------------------------------------------------------------------ Gittins vs mean-first
Index = Callable[[Distribution, float], float]


def _mean_completion(jobs: list[Distribution], sizes: tuple[int, ...], index: Index) -> float:
    """One server, all jobs present at t = 0, time in unit steps: every unit of service goes to
    the unfinished job with the highest index (ties to the lower job number)."""
    attained = [0] * len(jobs)
    finished: list[float] = [math.nan] * len(jobs)
    t = 0
    while any(math.isnan(f) for f in finished):
        live = [i for i, f in enumerate(finished) if math.isnan(f)]
        j = max(live, key=lambda i: (index(jobs[i], float(attained[i])), -i))
        attained[j] += 1
        t += 1
        if attained[j] == sizes[j]:
            finished[j] = t
    return sum(finished) / len(finished)


def _expected_mean_completion(jobs: list[Distribution], index: Index) -> float:
    """Exact expectation over every combination of the jobs' sizes."""
    total = 0.0
    for combo in itertools.product(*[zip(d.values, d.probs) for d in jobs]):
        sizes = tuple(int(v) for v, _ in combo)
        prob = math.prod(p for _, p in combo)
        total += prob * _mean_completion(jobs, sizes, index)
    return total


def test_gittins_beats_shortest_mean_first_on_a_heavy_tail() -> None:
    heavy = Distribution([1, 100], [0.9, 0.1])  # mean .9 + 10 = 10.9
    certain = Distribution.point(5)
    jobs = [heavy, certain]

    # Shortest mean first: the certain job (mean 5) runs first, then the heavy one.
    #   completions 5 and 5 + C:  E[mean] = (5 + 5 + 10.9) / 2 = 10.45
    def by_mean(d: Distribution, a: float) -> float:
        return 1.0 / d.mean()

    # Gittins: G_heavy(0) = max(.9 / 1, 1 / 10.9) = .9 > G_certain(0) = 1/5, so the heavy job
    # gets one unit. If it was the short one (p = .9) it finishes at 1 and the certain one at
    # 6: sum 7. Otherwise G_heavy(1) = 1/99 < 1/5: the certain job runs to 6, the heavy one
    # then finishes at 6 + 99 = 105: sum 111.  E[mean] = (.9 * 7 + .1 * 111) / 2 = 17.4 / 2
    # = 8.7, about 17% below 10.45.
    assert gittins_index(heavy) == pytest.approx(0.9)
    assert gittins_index(heavy, 1.0) == pytest.approx(1 / 99)

    mean_first = _expected_mean_completion(jobs, by_mean)
    gittins = _expected_mean_completion(jobs, gittins_index)
    assert mean_first == pytest.approx(10.45)
    assert gittins == pytest.approx(8.7)
    assert gittins < mean_first


# ------------------------------------------------------------------ ranker
def test_ranker_buckets_are_geometric() -> None:
    r = GittinsRanker(base=1.0, ratio=2.0)
    # bucket 0 = [0, 1), 1 = [1, 2), 2 = [2, 4), 3 = [4, 8), ...
    assert [r.bucket_of(x) for x in (0, 0.99, 1, 1.99, 2, 3.99, 4, 8)] == [0, 0, 1, 1, 2, 2, 3, 4]
    assert r.bucket_of(2.0**40) == 41
    assert r.bucket_start(0) == 0 and r.bucket_start(3) == 4
    assert r.next_boundary(0.5) == 1 and r.next_boundary(5) == 8
    r10 = GittinsRanker(base=1000.0, ratio=1.5)
    assert r10.bucket_of(1500.0) == 2 and r10.bucket_start(2) == 1500.0


def test_ranker_caches_per_bucket_at_its_lower_edge() -> None:
    r = GittinsRanker(base=1.0, ratio=2.0)
    c = Distribution([1, 10])
    assert r.index(c, 0.5) == pytest.approx(0.5)  # bucket 0 -> G(0)
    assert r.index(c, 0.9) == pytest.approx(0.5)  # same bucket: cached
    assert (r.hits, r.misses) == (1, 1)
    assert r.index(c, 1.5) == pytest.approx(1 / 9)  # bucket 1 -> G(1)
    assert r.index(c, 3.0) == pytest.approx(1 / 8)  # bucket 2 -> G(2) = 1 / (10 - 2)
    other = Distribution([1, 10])  # equal content, different object: its own entries
    r.index(other, 0.0)
    assert r.misses == 4 and len(r) == 4
    r.forget(c)
    assert len(r) == 1
    r.clear()
    assert len(r) == 0


def test_ranker_with_a_stable_key_hits_across_rebuilt_distributions() -> None:
    # a caller that rebuilds an equal distribution per lookup keys by the call instead
    r = GittinsRanker(base=1.0, ratio=2.0)
    for _ in range(3):
        assert r.index(Distribution([1, 10]), 0.0, key="call-7") == pytest.approx(0.5)
    assert (r.hits, r.misses) == (2, 1)
    r.index(Distribution([1, 10]), 1.0, key="call-7")  # bucket 1: G(1) = 1/9, a new entry
    assert len(r) == 2
    r.forget(key="call-7")
    assert len(r) == 0


def test_ranker_cache_is_bounded() -> None:
    r = GittinsRanker(max_entries=3)
    dists = [Distribution.point(float(i + 1)) for i in range(10)]
    for d in dists:
        r.index(d)
    assert len(r) == 3
    r.forget(dists[0])  # already evicted: a no-op
    assert len(r) == 3
