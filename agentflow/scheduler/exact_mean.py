"""Means of per-instance columns that stay exact when one row changes.

Why: the coordinator prices a query's future stages at the cluster-mean time model
(``ClusterView._mean_coefs``), and a finished call changes one instance's coefficients. A
float running sum would drift with every such change, and summing the column again costs
O(instances) at every finish (three 1,024-float sums were most of a decision's fleet-sized
cost). Every float is a multiple of 2**-1074, so each value is kept as that exact integer
multiple: the column's sum is an exact integer, one row's change is one integer subtraction
and addition, and the mean is the exact sum divided by the count, rounded once (Python's
integer true division rounds correctly). The result depends only on the values, never on
the order they were added or changed in.

Blocks: rows that always hold one shared value (the untried instances of a GPU kind, priced
by their peers' measurements: ``ClusterView._borrowed``) can be kept as one block, whose
value is set once for all of them; the block counts once per member in the sum, so moving
it costs the same for 1,000 members as for one, and the means are the ones the rows would
give one by one. The blocks' share of the sums (every block's count times its exact
value, over all rows and over the counted ones) is kept as those integers too, moved when a
block's value or membership moves, so ``means`` does not walk the blocks at every read (it
runs once per learn: each finished call moves one row).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

_SHIFT = 1074  # 2**-1074: the smallest positive float, a divisor of every finite float


def exact_int(x: float) -> int:
    """``x * 2**1074`` as an exact integer (``x`` finite)."""
    num, den = x.as_integer_ratio()
    return num << (_SHIFT + 1 - den.bit_length())


@dataclass
class _Block:
    """Rows sharing one value: their count (all, and counted) and the value as floats and
    exact integers."""

    values: tuple[float, ...]
    ints: list[int]
    members: set[int] = field(default_factory=set)
    n_counted: int = 0
    odd: bool = False  # a value is not finite


class ExactColumnMeans:
    """Per-row values of a few columns, and the exact mean of each over the counted rows
    (all rows when none is counted)."""

    def __init__(self, n_rows: int, n_columns: int):
        self._values = [[0.0] * n_columns for _ in range(n_rows)]
        self._ints = [[0] * n_columns for _ in range(n_rows)]
        self._counted = [True] * n_rows
        self._n_counted = n_rows
        self._sums = [0] * n_columns  # over the counted rows
        self._all = [0] * n_columns  # over every row
        # rows whose value is not finite, per column (then the mean is a plain float sum)
        self._odd = [0] * n_columns
        self._odd_rows: set[int] = set()
        self._blocks: dict[Hashable, _Block] = {}
        self._block_of: list[Hashable | None] = [None] * n_rows
        # the blocks' share: sum over blocks of (members, counted members) x exact value,
        # and how many blocks with (counted) members hold a value that is not finite
        self._block_all = [0] * n_columns
        self._block_counted = [0] * n_columns
        self._odd_blocks = [0, 0]

    def set_row(self, i: int, values: Sequence[float]) -> None:
        """Row ``i`` now holds ``values`` (one per column); it leaves its block if in one."""
        if self._block_of[i] is not None:
            self._leave_block(i)
        old_odd = i in self._odd_rows
        ints = self._ints[i]
        counted = self._counted[i]
        odd = False
        for j, x in enumerate(values):
            x = float(x)
            new = exact_int(x) if math.isfinite(x) else 0
            odd = odd or not math.isfinite(x)
            delta = new - ints[j]
            ints[j] = new
            self._all[j] += delta
            if counted:
                self._sums[j] += delta
            self._values[i][j] = x
        if odd != old_odd:
            (self._odd_rows.add if odd else self._odd_rows.discard)(i)

    def join_block(self, i: int, key: Hashable) -> None:
        """Row ``i`` holds the value of block ``key`` (``set_block``) from now on, until
        ``set_row`` gives it a value of its own."""
        if self._block_of[i] == key:
            return
        self.set_row(i, [0.0] * len(self._sums))  # its own value out of the sums
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = _Block((0.0,) * len(self._sums), [0] * len(self._sums))
        self._tally(block, -1)
        block.members.add(i)
        block.n_counted += self._counted[i]
        self._tally(block, +1)
        self._block_of[i] = key

    def _leave_block(self, i: int) -> None:
        block = self._blocks[self._block_of[i]]
        self._tally(block, -1)
        block.members.discard(i)
        block.n_counted -= self._counted[i]
        self._tally(block, +1)
        self._block_of[i] = None

    def _tally(self, block: _Block, sign: int) -> None:
        """Add (``sign`` +1) or take out (-1) ``block``'s share of the kept block totals."""
        n_all, n_counted = sign * len(block.members), sign * block.n_counted
        if n_all:
            every, counted = self._block_all, self._block_counted
            for j, x in enumerate(block.ints):
                every[j] += n_all * x
                counted[j] += n_counted * x
            if block.odd:
                self._odd_blocks[0] += sign
                if n_counted:
                    self._odd_blocks[1] += sign

    def set_block(self, key: Hashable, values: Sequence[float]) -> None:
        """Every row of block ``key`` now holds ``values``: O(columns), whatever its size."""
        values = tuple(float(x) for x in values)
        ints = [exact_int(x) if math.isfinite(x) else 0 for x in values]
        odd = not all(math.isfinite(x) for x in values)
        block = self._blocks.get(key)
        if block is None:
            self._blocks[key] = _Block(values, ints, odd=odd)
        else:
            self._tally(block, -1)
            block.values, block.ints, block.odd = values, ints, odd
            self._tally(block, +1)

    def set_counted(self, counted: Sequence[bool]) -> None:
        """Which rows the mean is over (the up instances); O(rows), for rare changes."""
        self._counted = [bool(c) for c in counted]
        self._n_counted = sum(self._counted)
        n_columns = len(self._sums)
        self._sums = [sum(row[j] for row, c in zip(self._ints, self._counted) if c)
                      for j in range(n_columns)]
        self._block_all, self._block_counted = [0] * n_columns, [0] * n_columns
        self._odd_blocks = [0, 0]
        for block in self._blocks.values():
            block.n_counted = sum(self._counted[i] for i in block.members)
            self._tally(block, +1)

    def _row_values(self, i: int) -> tuple[float, ...] | list[float]:
        key = self._block_of[i]
        return self._values[i] if key is None else self._blocks[key].values

    def means(self) -> tuple[float, ...]:
        """The mean of every column over the counted rows (all rows when none is)."""
        use_all = self._n_counted == 0
        rows = bool(self._odd_rows) and any(use_all or self._counted[i] for i in self._odd_rows)
        k = len(self._ints) if use_all else self._n_counted
        odd = self._odd_blocks[0 if use_all else 1] > 0
        if rows or odd:  # an infinite or NaN value: the float sum says what the mean is
            picked = [self._row_values(i) for i in range(len(self._ints))
                      if use_all or self._counted[i]]
            return tuple(sum(v[j] for v in picked) / k for j in range(len(self._sums)))
        # exact integers: the rows' sums plus the blocks' (``_tally``), in any order
        sums = self._all if use_all else self._sums
        blocks = self._block_all if use_all else self._block_counted
        den = k << _SHIFT
        return tuple((s + b) / den for s, b in zip(sums, blocks))
