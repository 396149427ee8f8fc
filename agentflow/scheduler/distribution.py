"""Discrete distributions over non-negative reals: the currency of the scheduler.

Output lengths, call times, KV-cache costs and remaining workflow costs are all carried as
``Distribution`` objects, because the scheduler ranks and dispatches by *what might happen*
(SageSched), not by a single guess. They are small (at most ``max_support`` atoms, 64 by
default) so every operation is a handful of vectorised numpy calls on short arrays: these run
inside the scheduler's hot path.

Compression (``from_samples`` with more distinct values than ``max_support``, and after
``add``) is quantile binning: atoms are sorted, the cumulative mass is cut into ``max_support``
equal-probability slices, each atom goes to the slice holding the midpoint of its own mass, and
each slice becomes one atom at the probability-weighted mean of its members carrying their
total mass. Hence:

* the mean is exact (up to floating-point rounding): a weighted mean of weighted means;
* the support stays inside ``[min, max]`` of the input and the atoms stay sorted (slices are
  contiguous ranges of sorted values);
* every quantile moves by at most one slice, i.e. by at most ``1 / max_support`` in
  probability; the variance shrinks by the within-slice variance (it can only go down).

An atom holding at least ``2 / max_support`` of the mass keeps its own atom, exactly (no
other atom's mass midpoint can fall into the slice of its own midpoint), so dominant point
masses (a stage that almost always writes 22 tokens) survive compression unmoved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import overload

import numpy as np

from agentflow.scheduler import price_kernel

ArrayLike = float | int | Sequence[float] | np.ndarray

DEFAULT_MAX_SUPPORT = 64
# Values within this relative distance are treated as equal when validating the support order.
_NEG_TOL = 1e-9


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class Distribution:
    """An immutable discrete distribution: sorted, distinct ``values`` >= 0 with ``probs`` > 0
    summing to 1.

    Equality and hashing are by identity, so a distribution can key a cache (the Gittins ranker
    relies on that); compare contents with ``np.allclose`` on ``values``/``probs``.
    """

    __slots__ = ("values", "probs", "_cum", "_tail", "_cq", "_mean")

    values: np.ndarray
    probs: np.ndarray

    def __init__(self, values: ArrayLike, probs: ArrayLike | None = None):
        """Validating constructor: sorts, merges equal values, drops zero-probability atoms and
        normalises. Negative values are rejected (lengths, times and costs are never negative;
        a negative value means a caller's bug, e.g. a shift with the wrong sign)."""
        v = np.atleast_1d(np.asarray(values, dtype=np.float64)).ravel()
        if probs is None:
            p = np.full(v.shape, 1.0)
        else:
            p = np.atleast_1d(np.asarray(probs, dtype=np.float64)).ravel()
        if v.size == 0 or v.shape != p.shape:
            raise ValueError(f"need matching non-empty values and probs, got {v.shape}, {p.shape}")
        if not (np.all(np.isfinite(v)) and np.all(np.isfinite(p))):
            raise ValueError("values and probs must be finite")
        if np.any(p < 0):
            raise ValueError("probabilities must be non-negative")
        if np.any(v < -_NEG_TOL * max(1.0, float(np.max(np.abs(v))))):
            raise ValueError(f"support must be non-negative, got min {float(v.min())}")
        v = np.maximum(v, 0.0)
        keep = p > 0
        if not np.any(keep):
            raise ValueError("total probability must be positive")
        v, p = v[keep], p[keep]
        uniq, inv = np.unique(v, return_inverse=True)
        merged = np.bincount(inv, weights=p, minlength=uniq.size)
        self._set(uniq, merged / merged.sum())

    def _set(self, values: np.ndarray, probs: np.ndarray) -> None:
        self.values = _readonly(values)
        self.probs = _readonly(probs)
        self._cum: np.ndarray | None = None
        self._tail: np.ndarray | None = None
        self._cq: dict[tuple[int, float], float] | None = None  # conditional_quantile's
        self._mean: float | None = None  # ``mean``'s (immutable atoms: the same float)

    @classmethod
    def _trusted(cls, values: np.ndarray, probs: np.ndarray) -> Distribution:
        """Skip validation: for internal results already sorted, distinct and normalised."""
        d = cls.__new__(cls)
        d._set(values, probs)
        return d

    @classmethod
    def _from_atoms(cls, values: np.ndarray, weights: np.ndarray,
                    max_support: int) -> Distribution:
        """Internal fast path for finite, non-negative atoms with positive weights (sums,
        mixtures, the predictor's neighbour sets): sort, merge equal values, compress. A few
        numpy calls instead of the validating constructor's dozen, for the hot path."""
        order = values.argsort(kind="stable")  # np.argsort's method, without its wrapper
        return cls._from_sorted_atoms(values[order], weights[order], max_support)

    @classmethod
    def _from_sorted_atoms(cls, v: np.ndarray, w: np.ndarray,
                           max_support: int) -> Distribution:
        """``_from_atoms`` for atoms already sorted by value (what its stable sort gives).
        By one compiled pass where numba is installed (``price_kernel.sorted_atoms``: the
        same floats — numpy's reduceat, sum, cumsum and bincount orders written out)."""
        if max_support >= 1:
            fast = price_kernel.sorted_atoms(v, w, max_support)
            if fast is not None:
                values, probs, ordered = fast
                if ordered:
                    return cls._trusted(values, probs)
                return Distribution(values, probs)  # as ``_binned`` falls back
        if v.size > 1:
            new = np.empty(v.size, dtype=bool)
            new[0] = True
            np.not_equal(v[1:], v[:-1], out=new[1:])
            if not new.all():
                w = np.add.reduceat(w, new.nonzero()[0])
                v = v[new]
        if max_support < 1:
            raise ValueError("max_support must be at least 1")
        p = w / w.sum()
        if v.size <= max_support:
            return cls._trusted(v, p)
        # ``_trusted(v, p).compress(max_support)`` without the Distribution in between
        cum = p.cumsum()
        cum[-1] = 1.0
        return _binned(v, p, cum, max_support)

    # ---------------------------------------------------------------- constructors
    @classmethod
    def point(cls, x: float) -> Distribution:
        """A certain value (a known length, a finished call's remaining cost of zero)."""
        x = float(x)
        if not np.isfinite(x) or x < 0:
            raise ValueError(f"point mass must be finite and non-negative, got {x}")
        return cls._trusted(np.array([x]), np.array([1.0]))

    @classmethod
    def from_samples(cls, samples: ArrayLike, weights: ArrayLike | None = None,
                     max_support: int = DEFAULT_MAX_SUPPORT) -> Distribution:
        """The (weighted) empirical distribution of ``samples``, compressed to at most
        ``max_support`` atoms by quantile binning (mean exact; see the module docstring)."""
        d = cls(samples, weights)
        return d.compress(max_support)

    def compress(self, max_support: int = DEFAULT_MAX_SUPPORT) -> Distribution:
        """At most ``max_support`` atoms by equal-probability quantile binning, mean kept."""
        if max_support < 1:
            raise ValueError("max_support must be at least 1")
        n = self.values.size
        if n <= max_support:
            return self
        return _binned(self.values, self.probs, self._cdf_array(), max_support)

    # ---------------------------------------------------------------- summaries
    def __len__(self) -> int:
        return int(self.values.size)

    def __repr__(self) -> str:
        return (f"Distribution(n={self.values.size}, mean={self.mean():.4g}, "
                f"p50={self.quantile(0.5):.4g}, p90={self.quantile(0.9):.4g}, "
                f"max={self.max():.4g})")

    def mean(self) -> float:
        """E[X]; kept after the first call: a call's prediction is averaged by its call, its
        length summary and the paths pass, each reading the same float."""
        m = self._mean
        if m is None:
            m = self._mean = float(self.values @ self.probs)
        return m

    def variance(self) -> float:
        m = self.mean()
        return float(((self.values - m) ** 2) @ self.probs)

    def std(self) -> float:
        return float(np.sqrt(self.variance()))

    def min(self) -> float:
        return float(self.values[0])

    def max(self) -> float:
        return float(self.values[-1])

    def _cdf_array(self) -> np.ndarray:
        """P(X <= values[i]), last entry exactly 1."""
        if self._cum is None:
            cum = self.probs.cumsum()  # np.cumsum's method: the same sums, no wrapper
            cum[-1] = 1.0
            self._cum = _readonly(cum)
        return self._cum

    def _tail_array(self) -> np.ndarray:
        """P(X >= values[i]) as suffix sums (exact for tiny tails, unlike 1 - cdf), plus a
        trailing 0 so ``_tail_array()[searchsorted(values, x, 'right')]`` is P(X > x)."""
        if self._tail is None:
            tail = np.empty(self.values.size + 1)
            tail[:-1] = self.probs[::-1].cumsum()[::-1]
            tail[-1] = 0.0
            self._tail = _readonly(tail)
        return self._tail

    @overload
    def cdf(self, x: float) -> float: ...
    @overload
    def cdf(self, x: np.ndarray) -> np.ndarray: ...

    def cdf(self, x: float | np.ndarray) -> float | np.ndarray:
        """P(X <= x)."""
        idx = np.searchsorted(self.values, x, side="right")
        out = np.concatenate(([0.0], self._cdf_array()))[idx]
        return float(out) if np.ndim(out) == 0 else out

    @overload
    def survival(self, x: float) -> float: ...
    @overload
    def survival(self, x: np.ndarray) -> np.ndarray: ...

    def survival(self, x: float | np.ndarray) -> float | np.ndarray:
        """P(X > x)."""
        tx = type(x)  # exact types first: isinstance with a union is the slower test
        if tx is float or tx is int or isinstance(x, float | int):  # the per-event path
            tail = self._tail
            if tail is None:
                tail = self._tail_array()
            p: float = tail.item(self.values.searchsorted(x, side="right"))  # Python float
            return p
        out = self._tail_array()[np.searchsorted(self.values, x, side="right")]
        return float(out) if np.ndim(out) == 0 else out

    @overload
    def quantile(self, q: float) -> float: ...
    @overload
    def quantile(self, q: np.ndarray) -> np.ndarray: ...

    def quantile(self, q: float | np.ndarray) -> float | np.ndarray:
        """The smallest support value v with P(X <= v) >= q (the lower quantile), q in [0, 1]."""
        if isinstance(q, float | int):  # one level: the same search without array wrappers
            if not 0 <= q <= 1:
                raise ValueError("quantile level must be in [0, 1]")
            i = int(self._cdf_array().searchsorted(float(q) - 1e-12, side="left"))
            v: float = self.values.item(min(i, self.values.size - 1))  # a Python float
            return v
        qa = np.asarray(q, dtype=np.float64)
        if np.any((qa < 0) | (qa > 1)):
            raise ValueError("quantile level must be in [0, 1]")
        # A tiny slack so q = 0.3 hits an atom whose cumulative mass is 0.30000000000000004.
        idx = np.searchsorted(self._cdf_array(), qa - 1e-12, side="left")
        out = self.values[np.minimum(idx, self.values.size - 1)]
        return float(out) if np.ndim(out) == 0 else out

    # ---------------------------------------------------------------- transforms
    def map(self, fn: Callable[[np.ndarray], np.ndarray | float]) -> Distribution:
        """The distribution of ``fn(X)``: ``fn`` is called once on the whole support array
        (so write it vectorised: tokens -> seconds, tokens -> cost). A non-decreasing ``fn``
        takes the fast path; any other ``fn`` still works (the result is re-sorted/merged)."""
        out = np.asarray(fn(self.values), dtype=np.float64)
        if out.shape != self.values.shape:
            out = np.array([float(fn(v)) for v in self.values])  # scalar-only fn
        diffs = np.diff(out)
        if out[0] >= 0 and np.all(np.isfinite(out)) and np.all(diffs > 0):
            return Distribution._trusted(out, self.probs)
        return Distribution(out, self.probs)

    def scale(self, c: float) -> Distribution:
        """``c * X`` for c >= 0 (tokens -> seconds at a fixed per-token time)."""
        if c < 0:
            raise ValueError("scale factor must be non-negative")
        if c == 0:
            return Distribution.point(0.0)
        return Distribution._trusted(self.values * c, self.probs)

    def shift(self, c: float) -> Distribution:
        """``X + c`` (a fixed prefill time, a known extra cost); the result must stay >= 0."""
        if c >= 0:
            return Distribution._trusted(self.values + c, self.probs)
        return Distribution(self.values + c, self.probs)

    def add(self, other: Distribution, max_support: int = DEFAULT_MAX_SUPPORT) -> Distribution:
        """``X + Y`` for independent X, Y: the exact convolution of the two atom sets (at most
        ``len(X) * len(Y)`` atoms, one outer sum) compressed back to ``max_support`` atoms, so
        the mean of the sum is the sum of the means."""
        if self.values.size == 1:
            return other.shift(float(self.values[0])).compress(max_support)
        if other.values.size == 1:
            return self.shift(float(other.values[0])).compress(max_support)
        v = (self.values[:, None] + other.values[None, :]).ravel()
        p = (self.probs[:, None] * other.probs[None, :]).ravel()
        return Distribution._from_atoms(v, p, max_support)

    @staticmethod
    def sum_all(dists: Iterable[Distribution],
                max_support: int = DEFAULT_MAX_SUPPORT) -> Distribution:
        """Sum of independent variables (a query's remaining stages); 0 for no terms."""
        total: Distribution | None = None
        for d in dists:
            total = d.compress(max_support) if total is None else total.add(d, max_support)
        return total if total is not None else Distribution.point(0.0)

    def mixture(self, other: Distribution, weight: float,
                max_support: int = DEFAULT_MAX_SUPPORT) -> Distribution:
        """``(1 - weight) * self + weight * other`` as a mixture (not a sum): blending a
        prediction with a prior."""
        if not 0 <= weight <= 1:
            raise ValueError("mixture weight must be in [0, 1]")
        if weight in (0, 1):
            return (other if weight == 1 else self).compress(max_support)
        v = np.concatenate((self.values, other.values))
        p = np.concatenate((self.probs * (1 - weight), other.probs * weight))
        return Distribution._from_atoms(v, p, max_support)

    def conditional_above(self, a: float) -> Distribution:
        """The distribution of X given X > a (what remains possible once ``a`` was attained).
        Raises ValueError when P(X > a) = 0: the caller must decide what an over-run means."""
        start = int(self.values.searchsorted(a, side="right"))
        if start >= self.values.size:
            raise ValueError(f"no probability mass above {a} (max {self.max()})")
        p = self.probs[start:]
        return Distribution._trusted(self.values[start:], p / p.sum())

    def conditional_quantile(self, a: float, q: float) -> float:
        """``conditional_above(a).quantile(q)`` without building the conditional
        distribution (the same arithmetic, so the same float): what the scheduler reads
        at every progress report of a running call (``ClusterView._output_reserve``)."""
        return self.conditional_quantile_from(int(self.values.searchsorted(a, side="right")),
                                              q, a)

    def quantile_above(self, a: float, q: float) -> float | None:
        """``conditional_quantile(a, q)`` when ``survival(a) > 0``, else None: one search
        of ``values`` for both (the survival test reads the tail at the index the
        conditional quantile starts from), the same floats as the two calls. What the
        scheduler's KV reserve asks at every priced progress report."""
        start = int(self.values.searchsorted(a, side="right"))
        tail = self._tail
        if tail is None:
            tail = self._tail_array()
        if tail.item(start) > 0:
            return self.conditional_quantile_from(start, q, a)
        return None

    def conditional_quantile_from(self, start: int, q: float, a: float | None = None
                                  ) -> float:
        """``conditional_quantile`` for an ``a`` whose ``values.searchsorted(a, "right")``
        the caller has made (``start``). ``a``: for the error message."""
        # The answer depends on ``a`` only through ``start``: a call's reports at 1, 2, 4,
        # ... tokens mostly fall below its distribution's first atoms, so most repeat one
        # computation; kept per (start, q) on this immutable distribution (a kept answer
        # passed both checks below when it was made).
        cache = self._cq
        if cache is None:
            cache = self._cq = {}
        key = (start, float(q))
        hit = cache.get(key)
        if hit is not None:
            return hit
        if start >= self.values.size:
            raise ValueError(f"no probability mass above {a} (max {self.max()})")
        if not 0 <= q <= 1:
            raise ValueError("quantile level must be in [0, 1]")
        p = self.probs[start:]
        # method forms, and add.reduce for p.sum(): the same operations without numpy's
        # Python-level wrappers (this runs at every progress report)
        cum = (p / _add_reduce(p)).cumsum()
        cum[-1] = 1.0
        i = int(cum.searchsorted(float(q) - 1e-12, side="left"))
        out: float = self.values.item(start + min(i, cum.size - 1))
        cache[key] = out
        return out

    def clip(self, upper: float) -> Distribution:
        """``min(X, upper)``: a call cannot produce more than its ``max_tokens``."""
        if upper >= self.values[-1]:
            return self
        v, p = self.values, self.probs
        if not (math.isfinite(upper) and upper >= 0):  # the validating constructor says why
            return Distribution(np.minimum(v, upper), p)
        # ``Distribution(np.minimum(v, upper), p)`` without its checks, sort and merge: the
        # atoms below ``upper`` as they are, the rest merged into one at ``upper`` with their
        # mass summed in order (as the constructor's bincount sums it), then normalised the
        # way it normalises: the same floats (every prediction with a cap is clipped).
        k = int(v.searchsorted(upper, side="left"))
        values = np.empty(k + 1)
        values[:k] = v[:k]
        values[k] = upper
        merged = np.empty(k + 1)
        merged[:k] = p[:k]
        merged[k] = np.add.accumulate(p[k:])[-1]
        return Distribution._trusted(values, merged / merged.sum())

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` independent draws by inverse-CDF lookup."""
        u = rng.random(n)
        idx = np.searchsorted(self._cdf_array(), u, side="right")
        return self.values[np.minimum(idx, self.values.size - 1)]


_add_reduce = np.add.reduce  # what ndarray.sum() runs for a 1-D array


# -------------------------------------------------------------------- SageSched cost model
@overload
def kv_cost(input_tokens: float, output_tokens: float) -> float: ...
@overload
def kv_cost(input_tokens: float | np.ndarray, output_tokens: np.ndarray) -> np.ndarray: ...
@overload
def kv_cost(input_tokens: np.ndarray, output_tokens: float | np.ndarray) -> np.ndarray: ...
def kv_cost(input_tokens: float | np.ndarray,
            output_tokens: float | np.ndarray) -> float | np.ndarray:
    """SageSched's cost of a call: ``O^2 / 2 + I * O``, the area under the KV-cache footprint
    (I + t tokens at decode step t) over the O decode steps. It charges both compute time and
    memory held, so a long output on a long prompt is expensive twice over."""
    o = np.asarray(output_tokens, dtype=np.float64)
    out = o * o / 2.0 + np.asarray(input_tokens, dtype=np.float64) * o
    return float(out) if np.ndim(out) == 0 else out


def cost_distribution(input_tokens: float, output_dist: Distribution) -> Distribution:
    """The cost distribution of a call with a known prompt and an uncertain output length
    (monotone in O for O >= 0, so atoms keep their order and probabilities)."""
    if input_tokens < 0:
        raise ValueError("input_tokens must be non-negative")
    i = float(input_tokens)
    return output_dist.map(lambda o: o * o / 2.0 + i * o)


def _binned(v: np.ndarray, p: np.ndarray, cum: np.ndarray, max_support: int) -> Distribution:
    """``compress`` of the atoms ``v`` (sorted, distinct) with probabilities ``p`` and
    cumulative ``cum`` (``_cdf_array``'s), more of them than ``max_support``: quantile
    binning, as the module docstring says. ``_from_sorted_atoms`` calls it on arrays it has
    just made, so no Distribution is built only to be compressed."""
    mid = cum - 0.5 * p  # midpoint of each atom's probability mass
    slot = np.minimum((mid * max_support).astype(np.int64), max_support - 1)
    mass = np.bincount(slot, weights=p, minlength=max_support)
    moment = np.bincount(slot, weights=p * v, minlength=max_support)
    used = mass > 0
    mass, moment = mass[used], moment[used]
    values = moment / mass
    # Rounding can put a slice mean a hair outside its members' range; keep order strict.
    # (maximum then minimum: ``np.clip`` on finite floats, without its Python wrapper)
    np.minimum(np.maximum(values, v[0], out=values), v[-1], out=values)
    if values.size > 1 and not (values[1:] > values[:-1]).all():
        return Distribution(values, mass)
    return Distribution._trusted(values, mass / mass.sum())
