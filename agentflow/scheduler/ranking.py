"""Queue keys that move with time, ranked in O(log n) per decision.

Every queue policy describes a waiting call's rank as a short, time-ordered list of
``Segment``s: from ``segment.start`` on, the call sits in ``tier`` with value
``a - s * now`` (smaller runs first; ties go to the older call). Keys are computed when
something happens to the call's query (a call becomes ready, starts, finishes, crosses an
attained-service bucket) — never per decision — so between those events a key is a fixed
line in time, and a tier change (e.g. "at risk from t = D - path") is a known instant.

That shape covers every policy here: FCFS, EDF and Gittins are flat lines (``s = 0``); LLF's
laxity ``D - now - R`` has slope 1 for every call; HexGen-Flow's ``budget - t =
share * (D - now) - t`` has a per-call slope ``share``; flowsage switches tier at known times.

``KineticTournament`` keeps the minimum of many lines at the current time: a tournament tree
whose internal nodes hold the winner of their subtree and the earliest time at which that
winner could change (the crossing of the two children's lines, or a child's own expiry).
Asking for the minimum at a later time re-plays only the expired matches; inserting or
removing a call invalidates one root-to-leaf path. ``key_at`` evaluates a key the same way
for the O(n) reference scan (``InstanceQueue.reference_peek``) so both agree exactly.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

_INF = math.inf


class Segment(NamedTuple):
    start: float  # the segment applies from this time on (-inf for the first)
    tier: int  # lower tiers run first
    a: float
    s: float = 0.0  # value(now) = a - s * now


Key = tuple[Segment, ...]


def flat(tier: int, value: float) -> Key:
    return (Segment(-_INF, tier, float(value), 0.0),)


def segment_at(key: Key, now: float) -> Segment:
    """The segment in force at ``now`` (the last one that has started)."""
    current = key[0]
    for seg in key[1:]:
        if seg.start <= now:
            current = seg
        else:
            break
    return current


def key_at(key: Key, now: float) -> tuple[int, float]:
    seg = segment_at(key, now)
    return seg.tier, seg.a - seg.s * now


def next_switch(key: Key, now: float) -> float | None:
    """When the key next changes segment after ``now`` (None: never)."""
    for seg in key[1:]:
        if seg.start > now:
            return seg.start
    return None


class KineticTournament:
    """Minimum of lines ``a - s * t`` (ties: smaller ``seq``) at a non-decreasing time ``t``."""

    __slots__ = ("_a", "_cap", "_exp", "_free", "_item", "_s", "_seq", "_win", "n")

    def __init__(self, capacity: int = 16):
        cap = 1
        while cap < capacity:
            cap *= 2
        self._cap = cap
        self._a: list[float] = [0.0] * cap
        self._s: list[float] = [0.0] * cap
        self._seq: list[int] = [0] * cap
        self._item: list[Any] = [None] * cap
        self._win: list[int] = [-1] * (2 * cap)  # winning slot per node, -1: empty subtree
        self._exp: list[float] = [_INF] * (2 * cap)  # node valid while query time < exp
        self._free = list(range(cap - 1, -1, -1))
        self.n = 0

    def __len__(self) -> int:
        return self.n

    # ------------------------------------------------------------------------------ updates
    def insert(self, item: Any, a: float, s: float, seq: int) -> int:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._a[slot], self._s[slot], self._seq[slot], self._item[slot] = a, s, seq, item
        self.n += 1
        node = self._cap + slot
        self._win[node] = slot
        self._invalidate(node >> 1)
        return slot

    def update(self, slot: int, a: float, s: float, seq: int) -> None:
        """Move ``slot``'s line (its item stays): what ``remove`` then ``insert`` would
        give, since the winner at a time depends only on the lines held, without freeing
        and taking a slot and invalidating two paths."""
        self._a[slot], self._s[slot], self._seq[slot] = a, s, seq
        self._invalidate((self._cap + slot) >> 1)

    def remove(self, slot: int) -> None:
        self._item[slot] = None
        self._free.append(slot)
        self.n -= 1
        node = self._cap + slot
        self._win[node] = -1
        self._invalidate(node >> 1)

    def peek(self, now: float) -> Any:
        """The item with the smallest value at ``now`` (None when empty)."""
        if self.n == 0:
            return None
        if self._exp[1] <= now:
            self._refresh(1, now)
        return self._item[self._win[1]]

    # ----------------------------------------------------------------------------- internals
    def _invalidate(self, node: int) -> None:
        # A node is invalidated only with all its ancestors (here, or by ``_grow``), and a
        # refresh re-plays every invalid node under the root: so the walk can stop at the
        # first node already invalid, its ancestors are too.
        exp = self._exp
        while node >= 1 and exp[node] != -_INF:
            exp[node] = -_INF
            node >>= 1

    def _refresh(self, node: int, now: float) -> None:
        exp = self._exp
        left, right = 2 * node, 2 * node + 1
        if left < self._cap:  # internal children: bring them up to date first
            if exp[left] <= now:
                self._refresh(left, now)
            if exp[right] <= now:
                self._refresh(right, now)
        win = self._win
        wl, wr = win[left], win[right]
        if wl < 0 or wr < 0:
            w = wl if wr < 0 else wr
            win[node] = w
            exp[node] = (exp[left] if wr < 0 else exp[right]) if w >= 0 else _INF
            return
        a, s, seq = self._a, self._s, self._seq
        vl = a[wl] - s[wl] * now
        vr = a[wr] - s[wr] * now
        if vl < vr or (vl == vr and seq[wl] < seq[wr]):
            w, lo = wl, wr
        else:
            w, lo = wr, wl
        win[node] = w
        own = _INF
        ds = s[lo] - s[w]
        if ds != 0.0:
            cross = (a[lo] - a[w]) / ds
            margin = 1e-9 * (abs(a[lo]) + abs(a[w]) + (abs(s[lo]) + abs(s[w])) * abs(cross)
                             ) / abs(ds) + 1e-12
            if ds > 0:  # the loser falls faster: it overtakes at ``cross``
                own = cross - margin
            elif cross + margin > now:  # lines crossed just now: re-check while float-close
                own = now
            if own <= now:
                own = math.nextafter(now, _INF)
        e = min(own, exp[left], exp[right])
        exp[node] = e

    def _grow(self) -> None:
        """Double the leaves; slots keep their numbers, every match is re-played."""
        old, cap = self._cap, self._cap * 2
        pad = [0.0] * old
        self._a += pad
        self._s += pad
        self._seq += [0] * old
        self._item += [None] * old
        self._free = list(range(cap - 1, old - 1, -1)) + self._free
        win = [-1] * (2 * cap)
        for slot in range(old):
            if self._item[slot] is not None:
                win[cap + slot] = slot
        self._win = win
        self._exp = [-_INF] * cap + [_INF] * cap
        self._cap = cap
