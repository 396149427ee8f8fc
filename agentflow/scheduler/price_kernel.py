"""``ClusterView.marginal_price`` as one compiled loop over the instances (numba), where numba
is installed: the same float operations, in the same order, on each instance.

Why: the fused numpy price is ~45 vector operations over every instance per dispatch, and
numpy's cost here is per operation, not per element (a multiply is ~1 µs on 1,024 floats,
~3 µs on 4,096, mostly call overhead and memory traffic between operations): ~60-80 µs of
every simulated call on a 1,024-instance fleet, the largest single piece of a decision. One
loop reads each instance's inputs once and writes its price and co-runners, a few µs.

Why it is the same floats: every operation of the numpy price is elementwise (no sum
across instances), so instance ``i``'s price is the same sequence of IEEE double operations
on the same inputs whether numpy runs it over an array or the loop runs it on scalars.
numba compiles without fast-math (no reassociation, no fused multiply-add contraction), and
``np.maximum`` / ``np.minimum`` are written out with their own rule for equal operands and
NaN (``_maximum``, ``_minimum``: on a tie they return the second operand, so ``-0.0`` and
``0.0`` come out as numpy gives them). ``tests/scheduler/test_price_kernel.py`` compares the
loop with the numpy price bit for bit at every dispatch of seeded replays (classes,
tenants, KV budgets with held progress reports, failures, per-instance prompt lengths).

Side effects stay in Python, in the numpy price's order: the expiry wheel retires the
over-run calls before the running remainders are read, and held progress reports are
settled only on the instances where they could change the KV room test (the loop reports
whether any such instance exists; the caller settles those and runs the loop again without
the check, as ``ClusterView._kv_fits`` re-tests after settling).

Without numba (it is optional) ``AVAILABLE`` is False and the view prices with numpy; the
``AGENTFLOW_PRICE_KERNEL=0`` environment variable (or ``set_enabled(False)``) turns the
loop off to compare. The first use compiles the loop (~1-2 s) and caches the machine code
beside this file (``cache=True``), so later processes load it in milliseconds.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

try:  # optional: the view prices with numpy without it
    import numba
except ImportError:  # pragma: no cover - exercised where numba is absent
    numba = None  # type: ignore[assignment]

AVAILABLE = numba is not None
_enabled = AVAILABLE and os.environ.get("AGENTFLOW_PRICE_KERNEL", "1") != "0"


def enabled() -> bool:
    """Whether ``ClusterView.marginal_price`` runs the compiled loop."""
    return _enabled


def set_enabled(on: bool) -> bool:
    """Turn the loop on or off (tests compare both); returns the previous setting. On
    without numba raises: there is nothing to run."""
    global _enabled
    if on and not AVAILABLE:
        raise RuntimeError("the price kernel needs numba, which is not installed")
    previous, _enabled = _enabled, bool(on)
    return previous


def _maximum(a: float, b: float) -> float:
    """``np.maximum`` of two doubles: NaN if either is, else the greater, the second on a
    tie (numpy gives ``np.maximum(-0.0, 0.0) == 0.0`` and ``np.maximum(0.0, -0.0) == -0.0``)."""
    return a if (a > b or a != a) else b


def _minimum(a: float, b: float) -> float:
    """``np.minimum`` of two doubles, by the same rule as ``_maximum``."""
    return a if (a < b or a != a) else b


def _price_loop(n_wait: np.ndarray, wait_prompt: np.ndarray, wait_output: np.ndarray,
                oh: np.ndarray, pf: np.ndarray, df: np.ndarray, behind: np.ndarray,
                prefill_prompt: np.ndarray, prompt_v: np.ndarray, prompt_s: float,
                need_v: np.ndarray, need_s: float, check_kv: bool, folded: bool,
                kv: np.ndarray, kv_pending: np.ndarray, budget: np.ndarray,
                n_run: np.ndarray, max_inflight: np.ndarray, finish_sum: np.ndarray,
                finish_n: np.ndarray, now: float, out: float, rate: np.ndarray,
                shielded: bool, slope: np.ndarray, seen: np.ndarray, solo_df: np.ndarray,
                peers: np.ndarray, price: np.ndarray, co: np.ndarray) -> int:
    """``ClusterView.marginal_price``'s numpy expressions, per instance, in their order.
    An empty ``behind`` / ``prompt_v`` / ``need_v`` / ``peers``: that input is absent (no
    worse-band work, one prompt length, one KV need, no class load). Returns 1 without
    pricing when ``folded`` and some instance's held progress reports could change its KV
    room test (then the caller settles them and calls again with ``folded`` False)."""
    n = n_wait.shape[0]
    has_behind = behind.shape[0] > 0
    has_prompt = prompt_v.shape[0] > 0
    has_need = need_v.shape[0] > 0
    has_peers = peers.shape[0] > 0
    if check_kv and folded:  # ``_kv_fits``: is any instance unsure without its reports?
        for i in range(n):
            need = need_v[i] if has_need else need_s
            if kv[i] + need <= budget[i]:
                top = kv[i] + kv_pending[i]
                top += need
                if top > budget[i]:
                    return 1
    for i in range(n):
        pfi, dfi = pf[i], df[i]
        # wait: queued work (less worse bands), prompts not yet prefilled, the stall
        w = n_wait[i] * oh[i]
        w += wait_prompt[i] * pfi
        w += wait_output[i] * dfi
        if has_behind:
            w -= behind[i]
        w += prefill_prompt[i] * pfi
        r = n_run[i]
        room = r < max_inflight[i]
        if check_kv:
            need = need_v[i] if has_need else need_s
            room = room and (r == 0.0 or kv[i] + need <= budget[i])
        stall = _maximum(finish_sum[i] - finish_n[i] * now, 0.0)
        stall /= _maximum(r, 1.0)
        if room:
            stall = 0.0
        w += stall
        # its own time, corrected to its co-runners, floored at its solo time
        p = prompt_v[i] if has_prompt else prompt_s
        prefill = p * pfi
        own = oh[i] + prefill
        own += out * dfi
        rt = rate[i]
        if shielded:
            own += out * (rt - dfi)
        solo = own + out * (_minimum(rt, solo_df[i]) - rt)
        slots = max_inflight[i] - 1.0
        c = _minimum(r, slots)
        d = out * slope[i]
        own += d * (c - seen[i])
        own = _maximum(own, solo)
        prefill += d
        prefill *= _minimum(peers[i], slots) if has_peers else c
        w += own
        w += prefill
        price[i] = w
        co[i] = c
    return 0


def _lexmin2_loop(first: np.ndarray, second: np.ndarray) -> int:
    """``np.lexsort((first, second))[0]`` for NaN-free keys: the least ``second``, then the
    least ``first``, then the first position (``-0.0`` ties ``0.0``, as ``==`` says). -1 when
    a key holds a NaN (or the keys are empty): then ``lexmin``'s numpy path decides."""
    n = second.shape[0]
    best = -1
    for i in range(n):
        s, f = second[i], first[i]
        if s != s or f != f:
            return -1
        if best < 0:
            best = i
            continue
        b = second[best]
        if s < b or (s == b and f < first[best]):
            best = i
    return best


if numba is not None:
    _maximum = numba.njit(cache=True, inline="always")(_maximum)
    _minimum = numba.njit(cache=True, inline="always")(_minimum)
    _compiled: Any = numba.njit(cache=True, nogil=True, error_model="numpy")(_price_loop)
    _lexmin2: Any = numba.njit(cache=True, nogil=True)(_lexmin2_loop)
else:  # pragma: no cover
    _compiled = _lexmin2 = None

# the key types ``lexmin2`` runs compiled (name ranks, prices): one machine code each
_LEXMIN_TYPES = (np.dtype(np.int64), np.dtype(np.float64))

EMPTY = np.zeros(0)  # an absent optional input of the loop


def price_loop(*args: Any) -> int:
    """The compiled loop (``_price_loop``'s arguments)."""
    result: int = _compiled(*args)
    return result


def lexmin2(first: np.ndarray, second: np.ndarray) -> int:
    """``policies.lexmin.lexmin((first, second))`` by one compiled pass (-1: not decided
    here — the loop is off, a key is not 1-D int64/float64, or holds a NaN)."""
    if not (_enabled and first.ndim == 1 and second.ndim == 1
            and first.dtype in _LEXMIN_TYPES and second.dtype in _LEXMIN_TYPES):
        return -1
    result: int = _lexmin2(first, second)
    return result


def _warm() -> None:
    """Load the compiled loop now (from its cache, else compiling it): its first call costs
    ~0.3 s (numba's code generator starting, the cached machine code loaded), paid here at
    import rather than inside the first decision a coordinator makes."""
    one, none = np.zeros(1), EMPTY
    price_loop(one, one, one, one, one, one, none, one, none, 0.0, none, 0.0, False, False,
               one, one, one, one, one, one, one, 0.0, 0.0, one, False, one, one, one, none,
               np.empty(1), np.empty(1))
    ranks, prices = np.zeros(1, dtype=np.int64), np.zeros(1)
    for a in (ranks, prices):
        for b in (ranks, prices):
            lexmin2(a, b)


if _enabled:
    _warm()
