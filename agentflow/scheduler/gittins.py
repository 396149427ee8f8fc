"""The Gittins index of a job with a known size distribution (SageSched's ordering rule).

For a job whose size C (here: its SageSched cost, or a time) has a distribution and that has
already received ``a`` units of service,

    G(a) = max over d > 0 of  P(C <= a + d | C > a) / E[min(C, a + d) - a | C > a]

is the best achievable "probability of finishing per unit of service invested" over any next
quantum d. Serving the highest index first minimises mean completion time on one server among
policies that do not know sizes, and it degrades gracefully to the classic rules: for a known
size it is SRPT, for a memoryless size it is indifferent, for heavy tails it favours jobs that
are likely about to finish (so a probably-short job with a long tail goes ahead of a job that is
certainly medium, unlike shortest-mean-first).

For a discrete distribution both numerator and denominator are piecewise in d and the ratio is
maximised at a support point, so it is enough to evaluate d = v - a for every atom v > a, which
is two cumulative sums on the (short) support.

Over-run rule (no mass above ``a``: the call has run past every length it was predicted to
possibly have): the remaining service is taken to be memoryless with mean equal to
``max(a, max support)``, i.e. "it has already run a; expect about as much again" (the mean
residual life of a Pareto tail grows like a). That gives ``G = 1 / max(a, max support)``:

* it never exceeds the index the same call had before over-running (for a < max support,
  G(a) >= 1 / (max support - a) >= 1 / max support), so an over-running call does not jump
  the queue over calls of its own kind that are still within their predictions;
* it is positive and only decays like 1/a, so the call still goes ahead of any call whose
  expected cost exceeds what it has already attained: it does not starve;
* it is non-increasing in ``a`` over the whole over-run region.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

from agentflow.scheduler.distribution import Distribution

# Floor for the over-run residual, so a zero-length prediction gives a large finite index.
_TINY = 1e-12


def _index_and_quantum(dist: Distribution, attained: float) -> tuple[float, float]:
    if attained < 0 or not math.isfinite(attained):
        raise ValueError(f"attained service must be finite and non-negative, got {attained}")
    values = dist.values
    start = int(np.searchsorted(values, attained, side="right"))
    if start >= values.size:
        return 1.0 / _overrun_residual(dist, attained), math.inf
    p = dist.probs[start:]
    r = values[start:] - attained  # candidate quanta d, all > 0
    # Unnormalised: the common factor P(C > a) cancels between numerator and denominator.
    done = np.cumsum(p)  # P(a < C <= a + d_k)
    beyond = np.cumsum(p[::-1])[::-1]  # P(C >= v_k); beyond[k+1] = P(C > a + d_k)
    beyond = np.append(beyond[1:], 0.0)
    service = np.cumsum(p * r) + beyond * r  # E[min(C, a + d_k) - a; C > a]
    ratios = done / service
    k = int(np.argmax(ratios))
    return float(ratios[k]), float(r[k])


def _overrun_residual(dist: Distribution, attained: float) -> float:
    """The over-run rule's expected remaining service: about as much again as attained."""
    return max(attained, float(dist.values[-1]), _TINY)


def expected_residual(dist: Distribution, attained: float = 0.0,
                      max_tokens: float | None = None) -> float:
    """``E[C - a | C > a]``: the service a job still needs, given that it has had ``a``;
    once past every size ``dist`` allows, the over-run rule's (module docstring). Why here:
    whoever prices a running job's remainder (preemption) must condition on its progress
    the way its index does, or a job past its mean looks finished while its tail is long.

    ``max_tokens``: the job's hard cap on its size (an LLM call's output limit), when it has
    one. The over-run rule's "about as much again" knows nothing of it, so a call 300 tokens
    into a 320-token cap would be priced 300 more; a call never writes past its cap, so the
    remainder is at most ``max_tokens - a`` (0 at the cap)."""
    if attained < 0 or not math.isfinite(attained):
        raise ValueError(f"attained service must be finite and non-negative, got {attained}")
    if max_tokens is not None and not max_tokens >= 0:
        raise ValueError(f"max_tokens must be non-negative, got {max_tokens}")
    if dist.survival(attained) <= 0:
        left = _overrun_residual(dist, attained)
    else:
        left = float(dist.conditional_above(attained).mean()) - attained
    if max_tokens is None:
        return left
    return max(0.0, min(left, float(max_tokens) - attained))


def gittins_index(dist: Distribution, attained: float = 0.0) -> float:
    """G(attained) for a job whose size follows ``dist``; higher = serve first. Finite and
    positive for every input (see the module docstring for the over-run rule)."""
    return _index_and_quantum(dist, attained)[0]


def gittins_quantum(dist: Distribution, attained: float = 0.0) -> float:
    """The d that attains the maximum in G(attained): how much more service the index is
    "betting" on before it should be looked at again (``inf`` once over-run)."""
    return _index_and_quantum(dist, attained)[1]


class GittinsRanker:
    """Cached Gittins indices on geometric buckets of attained service.

    SageSched re-ranks a running request only when its attained cost crosses a bucket boundary,
    not every token: bucket 0 is ``[0, base)``, bucket k >= 1 is
    ``[base * ratio**(k-1), base * ratio**k)``. The index of a call in bucket k is evaluated at
    the bucket's lower edge (so it is the same for every attained value inside the bucket and
    can be cached per (distribution, bucket)). Callers re-rank when ``bucket_of`` changes, or
    ask ``next_boundary`` for the attained value at which it will.

    Cache keys: by default the distribution's identity; the entry keeps a reference to the
    distribution, so an id is never reused while its entry lives. A caller that rebuilds an
    equal distribution on every lookup (e.g. a call's cost distribution recomputed from its
    output distribution) should pass a stable ``key`` (the call id) instead, or it gets no hits,
    and ``forget(key)`` when the call is done. The cache is a bounded LRU either way.
    """

    def __init__(self, base: float = 1.0, ratio: float = 2.0, max_entries: int = 8192):
        if base <= 0 or ratio <= 1:
            raise ValueError("need base > 0 and ratio > 1")
        self.base = float(base)
        self.ratio = float(ratio)
        self.max_entries = int(max_entries)
        self._log_ratio = math.log(self.ratio)
        # (owner, bucket) -> (distribution kept alive for identity keys or None, index)
        self._cache: OrderedDict[tuple[Hashable, int], tuple[Distribution | None, float]] = \
            OrderedDict()
        self._buckets: dict[Hashable, set[int]] = {}  # owner -> cached buckets, for forget()
        self.hits = 0
        self.misses = 0

    def bucket_of(self, attained: float) -> int:
        if attained < self.base:
            return 0
        k = int(math.floor(math.log(attained / self.base) / self._log_ratio)) + 1
        # Guard the floating-point log at exact boundaries.
        if attained < self.bucket_start(k):
            k -= 1
        elif attained >= self.bucket_start(k + 1):
            k += 1
        return k

    def bucket_start(self, bucket: int) -> float:
        if bucket < 0:
            raise ValueError("bucket must be non-negative")
        return 0.0 if bucket == 0 else self.base * self.ratio ** (bucket - 1)

    def next_boundary(self, attained: float) -> float:
        """The attained service at which the call moves to the next bucket (re-rank then)."""
        return self.bucket_start(self.bucket_of(attained) + 1)

    @staticmethod
    def _owner(dist: Distribution | None, key: Hashable | None) -> Hashable:
        return ("id", id(dist)) if key is None else ("key", key)

    def index(self, dist: Distribution, attained: float = 0.0, *,
              key: Hashable | None = None) -> float:
        """G at the lower edge of ``attained``'s bucket, cached per (owner, bucket) where the
        owner is ``key`` when given, else the distribution object itself."""
        bucket = self.bucket_of(attained)
        owner = self._owner(dist, key)
        hit = self._cache.get((owner, bucket))
        if hit is not None:  # an identity entry holds ``dist`` alive: its id cannot be stale
            self._cache.move_to_end((owner, bucket))
            self.hits += 1
            return hit[1]
        self.misses += 1
        value = gittins_index(dist, self.bucket_start(bucket))
        self._cache[(owner, bucket)] = (dist if key is None else None, value)
        self._buckets.setdefault(owner, set()).add(bucket)
        if len(self._cache) > self.max_entries:
            (old_owner, old_bucket), _ = self._cache.popitem(last=False)
            buckets = self._buckets.get(old_owner)
            if buckets is not None:
                buckets.discard(old_bucket)
                if not buckets:
                    del self._buckets[old_owner]
        return value

    def forget(self, dist: Distribution | None = None, *, key: Hashable | None = None) -> None:
        """Drop the entries of a distribution (or of a ``key``) whose call finished."""
        owner = self._owner(dist, key)
        for bucket in self._buckets.pop(owner, ()):
            self._cache.pop((owner, bucket), None)

    def clear(self) -> None:
        self._cache.clear()
        self._buckets.clear()

    def __len__(self) -> int:
        return len(self._cache)
