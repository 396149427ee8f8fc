"""Compiled loops (numba) for the hottest numeric paths, where numba is installed: the same
float operations, in the same order, as the numpy code they stand for. ``marginal_price``
(``ClusterView.marginal_price``: one loop over the instances), ``lexmin2`` (dispatch's pick
of the least price, ties to the least name rank), ``sorted_atoms``
(``Distribution._from_sorted_atoms``: merging, normalising and binning a distribution's
atoms — every length prediction and stage baseline builds one), and ``stage_rows`` /
``neighbours`` (``LearnedLengthModel.predict``'s window rows, prompt-length terms, filter
and selection key around numpy's ``np.exp`` and ``argpartition``, which stay numpy's),
``mixture`` (the chosen neighbours mixed with the stage baseline, stably sorted and made
atoms: the ~10 numpy steps after ``argpartition`` as one call) and ``baseline`` (a stage's
outputs merged with its prior's atoms, rebuilt at each observation of the stage).

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

``sorted_atoms`` writes out the orders numpy sums in: ``np.add.reduceat`` adds a run's
first weight to the pairwise sum of the rest, ``ndarray.sum`` is 0.0 plus the pairwise sum
(``_pairwise_sum``: blocks of 128 with eight running sums, halves above), ``cumsum`` and
``bincount`` add in order; ``test_price_kernel`` checks the sum against numpy's on thousands
of random arrays, so a numpy whose summation changed fails there first.

Without numba (it is optional) ``AVAILABLE`` is False and numpy computes everything; the
``AGENTFLOW_PRICE_KERNEL=0`` environment variable (or ``set_enabled(False)``) turns the
loops off to compare. The first use compiles the loop (~1-2 s) and caches the machine code
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


def _block_sum(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of ``a[lo:lo + n]`` for ``n <= 128`` (one block): under 8
    terms one by one from 0.0; else eight running sums over the terms in steps of 8,
    combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the leftover terms
    one by one."""
    if n < 8:
        res: float = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    stop = n - n % 8
    while i < stop:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


def _pairwise_sum(a: np.ndarray, lo: int, n: int) -> float:
    """numpy's pairwise sum of ``a[lo:lo + n]`` (``DOUBLE_pairwise_sum``): a block of at
    most 128 terms as ``_block_sum``; above, the two halves (the first a multiple of 8)
    summed so and added, left + right. Written with an explicit stack of halves, not
    recursion (numba's cache cannot load a recursive function back)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    depth = 64
    f_lo, f_n = np.empty(depth, dtype=np.int64), np.empty(depth, dtype=np.int64)
    f_stage, f_left = np.zeros(depth, dtype=np.int64), np.empty(depth)
    sp = 0
    f_lo[0], f_n[0], f_stage[0] = lo, n, 0
    while True:
        m = f_n[sp]
        if m > 128:  # a split node, first visit: its left half next
            f_stage[sp] = 1
            half = m // 2
            half -= half % 8
            f_lo[sp + 1], f_n[sp + 1], f_stage[sp + 1] = f_lo[sp], half, 0
            sp += 1
            continue
        result = _block_sum(a, f_lo[sp], m)
        sp -= 1
        while sp >= 0:  # hand the sum up: a left half waits for its right one
            if f_stage[sp] == 1:
                f_left[sp] = result
                f_stage[sp] = 2
                half = f_n[sp] // 2
                half -= half % 8
                f_lo[sp + 1], f_n[sp + 1], f_stage[sp + 1] = f_lo[sp] + half, f_n[sp] - half, 0
                sp += 1
                break
            result = f_left[sp] + result
            sp -= 1
        if sp < 0:
            return result


def _atoms_loop(v: np.ndarray, w: np.ndarray, max_support: int
                ) -> tuple[np.ndarray, np.ndarray, bool]:
    """``Distribution._from_sorted_atoms`` of atoms ``v`` (sorted, non-empty) with weights
    ``w``, numpy's operations in their order: equal values merged (``np.add.reduceat``: a
    run's first weight plus the pairwise sum of the rest), normalised by ``w.sum()`` (0.0
    plus the pairwise sum), and above ``max_support`` atoms binned (``_binned``: sequential
    ``cumsum``, ``bincount``'s in-order sums). (values, probs, ordered): ``ordered`` False
    when the binned means came out of strict order — then ``probs`` holds the masses and the
    caller builds the validating ``Distribution(values, masses)`` as ``_binned`` does."""
    n = v.shape[0]
    m = 1
    for i in range(1, n):
        if v[i] != v[i - 1]:
            m += 1
    if m < n:  # merge runs of equal values
        vv, ww = np.empty(m), np.empty(m)
        j, start = 0, 0
        for i in range(1, n + 1):
            if i == n or v[i] != v[i - 1]:
                vv[j] = v[start]
                ww[j] = w[start] + _pairwise_sum(w, start + 1, i - start - 1)
                j += 1
                start = i
    else:
        vv, ww = v.copy(), w
    total = 0.0 + _pairwise_sum(ww, 0, m)
    p = np.empty(m)
    for i in range(m):
        p[i] = ww[i] / total
    if m <= max_support:
        return vv, p, True
    cum = np.empty(m)
    acc = p[0]
    cum[0] = acc
    for i in range(1, m):
        acc = acc + p[i]
        cum[i] = acc
    cum[m - 1] = 1.0
    mass, moment = np.zeros(max_support), np.zeros(max_support)
    for i in range(m):
        slot = np.int64((cum[i] - 0.5 * p[i]) * max_support)
        if slot > max_support - 1:
            slot = max_support - 1
        mass[slot] += p[i]
        moment[slot] += p[i] * vv[i]
    k = 0
    for s in range(max_support):
        if mass[s] > 0:
            k += 1
    values, masses = np.empty(k), np.empty(k)
    j = 0
    lo, hi = vv[0], vv[m - 1]
    for s in range(max_support):
        if mass[s] > 0:
            values[j] = _minimum(_maximum(moment[s] / mass[s], lo), hi)
            masses[j] = mass[s]
            j += 1
    for i in range(1, k):
        if not values[i] > values[i - 1]:
            return values, masses, False
    total = 0.0 + _pairwise_sum(masses, 0, k)
    for i in range(k):
        masses[i] = masses[i] / total
    return values, masses, True


def _stage_rows_loop(stage: np.ndarray, count: int, sid: int, log_in: np.ndarray,
                     log_prompt: float, scale: float, with_factor: bool
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``LearnedLengthModel.predict``'s window rows of stage ``sid`` (``(stage[:count] ==
    sid).nonzero()[0]``) and, ``with_factor``, each row's prompt-length term before its
    ``np.exp`` (``|log_in[row] - log_prompt| * scale``, numpy's in-place steps in order; the
    exponential stays numpy's)."""
    n = 0
    for i in range(count):
        if stage[i] == sid:
            n += 1
    rows = np.empty(n, dtype=np.int64)
    factor = np.empty(n if with_factor else 0)
    j = 0
    for i in range(count):
        if stage[i] == sid:
            rows[j] = i
            if with_factor:
                factor[j] = abs(log_in[i] - log_prompt) * scale
            j += 1
    return rows, factor


def _neighbours_loop(rows: np.ndarray, sims: np.ndarray, fix_nan: bool, floor: float,
                     positive: bool, k: int, seq: np.ndarray, observed: int, recency: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``predict``'s neighbour filter after the similarities: NaN similarities (entries
    without a prompt length) count 1.0 (``fix_nan``), rows at or above ``floor`` (and above
    0, ``positive``) kept in order, and when more than ``k`` remain the negated selection
    key ``-((seq - observed) * recency + sim)`` for numpy's ``argpartition``."""
    n = sims.shape[0]
    if fix_nan:
        for i in range(n):
            if sims[i] != sims[i]:
                sims[i] = 1.0
    m = 0
    for i in range(n):
        x = sims[i]
        if x >= floor and (not positive or x > 0):
            m += 1
    kept_rows, kept = np.empty(m, dtype=np.int64), np.empty(m)
    j = 0
    for i in range(n):
        x = sims[i]
        if x >= floor and (not positive or x > 0):
            kept_rows[j] = rows[i]
            kept[j] = x
            j += 1
    key = np.empty(m if m > k else 0)
    if m > k:
        for i in range(m):
            t = (seq[kept_rows[i]] - observed) * recency
            t += kept[i]
            key[i] = -t
    return kept_rows, kept, key


def _mixture_loop(out: np.ndarray, rows: np.ndarray, sims: np.ndarray, top: np.ndarray,
                  use_top: bool, base_values: np.ndarray, base_probs: np.ndarray,
                  strength: float, max_support: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """``LearnedLengthModel._mixture`` after the selection, as ``_atoms_loop``'s (values,
    probs, ordered): the chosen neighbours (``rows[top]``, ``sims[top]``; all of them
    without ``use_top``) and their outputs ``out[row]``, then the baseline's atoms with
    weights ``probs * strength`` (numpy's elementwise multiply), in ``np.concatenate``'s
    order, stably sorted by value (a stable sort's permutation is the only one: numpy's
    ``argsort(kind="stable")`` gives the same), then merged, normalised and binned."""
    nb = top.shape[0] if use_top else rows.shape[0]
    nbase = base_values.shape[0]
    n = nb + nbase
    values, weights = np.empty(n), np.empty(n)
    for i in range(nb):
        j = top[i] if use_top else i
        values[i] = out[rows[j]]
        weights[i] = sims[j]
    for i in range(nbase):
        values[nb + i] = base_values[i]
        weights[nb + i] = base_probs[i] * strength
    order = np.argsort(values, kind="mergesort")
    v, w = np.empty(n), np.empty(n)
    for i in range(n):
        v[i] = values[order[i]]
        w[i] = weights[order[i]]
    atoms: tuple[np.ndarray, np.ndarray, bool] = _atoms(v, w, max_support)
    return atoms


def _baseline_loop(outs: np.ndarray, prior_values: np.ndarray, prior_probs: np.ndarray,
                   prior_weight: float, max_support: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """``LearnedLengthModel._baseline``'s atoms as ``_atoms_loop``'s (values, probs, ordered):
    the stage's sorted outputs (weight 1.0 each) and the prior's sorted, distinct atoms
    (weight ``probs * prior_weight``) merged, each prior atom after the outputs equal to it
    (its place ``searchsorted(side="right") + its index``, as numpy places it)."""
    n, k = outs.shape[0], prior_values.shape[0]
    values, weights = np.empty(n + k), np.empty(n + k)
    i = j = 0
    for pos in range(n + k):
        if j < k and (i >= n or outs[i] > prior_values[j]):
            values[pos] = prior_values[j]
            weights[pos] = prior_probs[j] * prior_weight
            j += 1
        else:
            values[pos] = outs[i]
            weights[pos] = 1.0
            i += 1
    atoms: tuple[np.ndarray, np.ndarray, bool] = _atoms(values, weights, max_support)
    return atoms


def _sorted_insert_loop(outs: np.ndarray, x: float) -> np.ndarray:
    """``np.concatenate((outs[:at], (x,), outs[at:]))`` at ``at = outs.searchsorted(x)``."""
    n = outs.shape[0]
    at = np.searchsorted(outs, x)
    out = np.empty(n + 1)
    out[:at] = outs[:at]
    out[at] = x
    out[at + 1:] = outs[at:]
    return out


def _sorted_remove_loop(outs: np.ndarray, x: float) -> np.ndarray:
    """``np.concatenate((outs[:at], outs[at + 1:]))`` at ``at = outs.searchsorted(x)``."""
    n = outs.shape[0]
    at = np.searchsorted(outs, x)
    out = np.empty(n - 1)
    out[:at] = outs[:at]
    out[at:] = outs[at + 1:]
    return out


if numba is not None:
    _maximum = numba.njit(cache=True, inline="always")(_maximum)
    _minimum = numba.njit(cache=True, inline="always")(_minimum)
    _compiled: Any = numba.njit(cache=True, nogil=True, error_model="numpy")(_price_loop)
    _lexmin2: Any = numba.njit(cache=True, nogil=True)(_lexmin2_loop)
    _block_sum = numba.njit(cache=True)(_block_sum)
    _pairwise_sum = numba.njit(cache=True)(_pairwise_sum)
    _atoms: Any = numba.njit(cache=True, nogil=True, error_model="numpy")(_atoms_loop)
    stage_rows: Any = numba.njit(cache=True, nogil=True)(_stage_rows_loop)
    neighbours: Any = numba.njit(cache=True, nogil=True)(_neighbours_loop)
    _mixture: Any = numba.njit(cache=True, nogil=True, error_model="numpy")(_mixture_loop)
    _baseline: Any = numba.njit(cache=True, nogil=True, error_model="numpy")(_baseline_loop)
    _sorted_insert: Any = numba.njit(cache=True, nogil=True)(_sorted_insert_loop)
    _sorted_remove: Any = numba.njit(cache=True, nogil=True)(_sorted_remove_loop)
else:  # pragma: no cover
    _compiled = _lexmin2 = _atoms = stage_rows = neighbours = _mixture = _baseline = None
    _sorted_insert = _sorted_remove = None

# the key types ``lexmin2`` runs compiled (name ranks, prices): one machine code each
_LEXMIN_TYPES = (np.dtype(np.int64), np.dtype(np.float64))

EMPTY = np.zeros(0)  # an absent optional input of the loop


def price_loop(*args: Any) -> int:
    """The compiled loop (``_price_loop``'s arguments)."""
    result: int = _compiled(*args)
    return result


def sorted_atoms(v: np.ndarray, w: np.ndarray, max_support: int
                 ) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """``_atoms_loop``'s (values, probs, ordered) of float64 atoms, or None where it does not
    decide (the loop is off, other dtypes, no atoms): then numpy builds them."""
    if not (_enabled and v.dtype == _F64 and w.dtype == _F64 and v.shape[0] > 0
            and _plain(v) and _plain(w)):
        return None
    result: tuple[np.ndarray, np.ndarray, bool] = _atoms(v, w, max_support)
    return result


_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)


def mixture(out: np.ndarray, rows: np.ndarray, sims: np.ndarray, top: np.ndarray | None,
            base_values: np.ndarray, base_probs: np.ndarray, strength: float,
            max_support: int) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """``_mixture_loop``'s (values, probs, ordered), or None where it does not decide (the
    loop is off, ``max_support < 1``): then numpy does. ``top``: the selected positions of
    ``rows``/``sims`` (None: all of them). The arrays are the predictor's own (its window's
    outputs, the kernel's rows and similarities, argpartition's positions, a distribution's
    read-only atoms), always of the types the loop is compiled and cached for; another
    type would compile once more, with the same arithmetic."""
    if not (_enabled and max_support >= 1):
        return None
    result: tuple[np.ndarray, np.ndarray, bool] = _mixture(
        out, rows, sims, _NO_TOP if top is None else top, top is not None, base_values,
        base_probs, strength, max_support)
    return result


_NO_TOP = np.zeros(0, dtype=np.int64)


def sorted_insert(outs: np.ndarray, x: float) -> np.ndarray:
    """A sorted float64 array with ``x`` inserted where ``searchsorted`` puts it (a new
    array): one compiled call, else numpy's ``concatenate``."""
    if _enabled and outs.dtype == _F64:
        inserted: np.ndarray = _sorted_insert(outs, x)
        return inserted
    at = int(outs.searchsorted(x))
    return np.concatenate((outs[:at], (x,), outs[at:]))


def sorted_remove(outs: np.ndarray, x: float) -> np.ndarray:
    """A sorted float64 array holding ``x`` without its first copy (a new array)."""
    if _enabled and outs.dtype == _F64:
        removed: np.ndarray = _sorted_remove(outs, x)
        return removed
    at = int(outs.searchsorted(x))
    return np.concatenate((outs[:at], outs[at + 1:]))


def baseline(outs: np.ndarray, prior_values: np.ndarray, prior_probs: np.ndarray,
             prior_weight: float, max_support: int) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """``_baseline_loop``'s (values, probs, ordered), or None where it does not decide (the
    loop is off, ``max_support < 1``, no atoms, an array of another dtype): then numpy does."""
    if not (_enabled and max_support >= 1 and outs.dtype == _F64
            and prior_values.dtype == _F64 and prior_probs.dtype == _F64
            and outs.shape[0] + prior_values.shape[0] > 0):
        return None
    result: tuple[np.ndarray, np.ndarray, bool] = _baseline(
        outs, prior_values, prior_probs, prior_weight, max_support)
    return result


def _plain(a: np.ndarray) -> bool:
    """C-contiguous and writable: the array type the loops are compiled (and cached) for,
    so an odd view or a read-only array goes to numpy instead of compiling mid-run."""
    flags = a.flags
    return bool(flags.c_contiguous and flags.writeable)


def lexmin2(first: np.ndarray, second: np.ndarray) -> int:
    """``policies.lexmin.lexmin((first, second))`` by one compiled pass (-1: not decided
    here — the loop is off, a key is not 1-D int64/float64, or holds a NaN)."""
    if not (_enabled and first.ndim == 1 and second.ndim == 1
            and first.dtype in _LEXMIN_TYPES and second.dtype in _LEXMIN_TYPES
            and _plain(first) and _plain(second)):
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
    sorted_atoms(np.array([1.0, 1.0, 2.0, 3.0]), np.ones(4), 2)
    rows, factor = stage_rows(np.zeros(2, dtype=np.int32), 2, 0, np.zeros(2), 0.0, -1.0, True)
    kept, sims, _ = neighbours(rows, factor, True, 0.2, False, 1, np.zeros(2, dtype=np.int64),
                               2, 1e-9)
    base_values, base_probs = np.array([1.0, 2.0]), np.array([0.5, 0.5])
    base_values.setflags(write=False)  # a Distribution's atoms are read-only
    base_probs.setflags(write=False)
    top = np.zeros(1, dtype=np.int64)
    for chosen in (top, None):
        mixture(np.ones(2), np.zeros(1, dtype=np.int64), np.ones(1), chosen, base_values,
                base_probs, 2.0, 32)
    for outs in (np.array([1.0, 3.0]), np.zeros(0)):  # a window's, and none yet
        baseline(outs, base_values, base_probs, 4.0, 32)
    sorted_remove(sorted_insert(np.zeros(0), 1.0), 1.0)
    ranks, prices = np.zeros(1, dtype=np.int64), np.zeros(1)
    for a in (ranks, prices):
        for b in (ranks, prices):
            lexmin2(a, b)


if _enabled:
    _warm()
