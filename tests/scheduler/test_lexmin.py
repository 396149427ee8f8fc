"""``lexmin`` picks the row ``np.lexsort`` puts first, on ties, NaN, infinities and signed
zeros. (``LoadBook``'s retirement against one-by-one stops: ``test_loadbook``.)"""

from __future__ import annotations

import numpy as np
import pytest

from agentflow.scheduler import price_kernel
from agentflow.scheduler.policies.lexmin import lexmin


@pytest.fixture(params=["compiled", "numpy"])
def compiled(request):
    """Both ways ``lexmin`` decides two keys: ``price_kernel.lexmin2`` (where numba is
    installed) and its own numpy filter."""
    on = request.param == "compiled"
    if on and not price_kernel.AVAILABLE:
        pytest.skip("numba is not installed")
    previous = price_kernel.set_enabled(on) if price_kernel.AVAILABLE else False
    yield on
    if price_kernel.AVAILABLE:
        price_kernel.set_enabled(previous)


@pytest.mark.parametrize("seed", range(40))
def test_lexmin_is_the_first_row_of_lexsort(seed, compiled):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    pool = np.array([0.0, -0.0, 1.5, 2.0, np.inf, -np.inf, 1e-300] + ([np.nan] if seed % 5 == 0
                                                                      else []))
    price = rng.choice(pool, n) if seed % 2 else rng.integers(0, 4, n).astype(float)
    times = rng.choice(pool, n) if seed % 3 else rng.uniform(0, 1, n)
    names = rng.permutation(n)
    assert lexmin((names, price)) == int(np.lexsort((names, price))[0])
    assert lexmin((names, times, price)) == int(np.lexsort((names, times, price))[0])
    ties = rng.integers(0, 2, n)  # ties in every key: the first such row
    assert lexmin((ties, ties.astype(float))) == int(np.lexsort((ties, ties.astype(float)))[0])
