"""The fast paths of ``Distribution`` give the floats of the code they replace, bit for bit.

``clip`` used to build its result with the validating constructor (sort, merge, normalise);
``_from_sorted_atoms`` used to build a Distribution and compress it. The old forms are kept
here verbatim and compared on seeded distributions: atoms that hit the cap exactly, caps
below the first atom and between atoms, many atoms merged into one, uneven masses.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from agentflow.scheduler.distribution import Distribution


def _old_clip(d: Distribution, upper: float) -> Distribution:
    if upper >= d.values[-1]:
        return d
    return Distribution(np.minimum(d.values, upper), d.probs)


def _old_from_sorted_atoms(v: np.ndarray, w: np.ndarray, max_support: int) -> Distribution:
    if v.size > 1:
        new = np.empty(v.size, dtype=bool)
        new[0] = True
        np.not_equal(v[1:], v[:-1], out=new[1:])
        if not new.all():
            w = np.add.reduceat(w, np.flatnonzero(new))
            v = v[new]
    return Distribution._trusted(v, w / w.sum()).compress(max_support)


def _same(a: Distribution, b: Distribution) -> None:
    assert a.values.tobytes() == b.values.tobytes(), (a.values, b.values)
    assert a.probs.tobytes() == b.probs.tobytes(), (a.probs, b.probs)


def _random_distribution(rng: random.Random) -> Distribution:
    n = rng.choice([1, 2, 5, 16, 40, 64, 200])
    values = [float(rng.choice([rng.randint(1, 50), rng.randint(1, 2000),
                                rng.random() * 900])) for _ in range(n)]
    weights = [rng.random() ** 3 + 1e-9 for _ in range(n)]
    d = Distribution(values, weights)
    return d.compress(rng.choice([8, 32, 64])) if rng.random() < 0.5 else d


@pytest.mark.parametrize("seed", range(6))
def test_clip_is_the_validating_constructor_of_the_clipped_atoms(seed):
    rng = random.Random(seed)
    for _ in range(400):
        d = _random_distribution(rng)
        caps = [float(rng.choice(d.values.tolist())), d.values[0] / 2, d.values[0],
                rng.uniform(d.values[0], d.values[-1]), float(rng.randint(1, 3000)), 0.0]
        for cap in caps:
            _same(d.clip(cap), _old_clip(d, cap))


@pytest.mark.parametrize("seed", range(6))
def test_from_sorted_atoms_is_a_trusted_distribution_compressed(seed):
    rng = random.Random(100 + seed)
    for _ in range(400):
        n = rng.choice([1, 3, 31, 32, 33, 48, 500])
        v = np.sort(np.array([float(rng.randint(1, rng.choice([5, 60, 3000])))
                              for _ in range(n)]))
        w = np.array([rng.choice([1.0, 0.25, rng.random() + 1e-6]) for _ in range(n)])
        ms = rng.choice([1, 16, 32, 64])
        _same(Distribution._from_sorted_atoms(v.copy(), w.copy(), ms),
              _old_from_sorted_atoms(v.copy(), w.copy(), ms))


def test_clip_still_rejects_a_negative_cap():
    with pytest.raises(ValueError):
        Distribution([1.0, 5.0], [0.5, 0.5]).clip(-1.0)
