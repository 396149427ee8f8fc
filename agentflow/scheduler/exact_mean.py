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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_SHIFT = 1074  # 2**-1074: the smallest positive float, a divisor of every finite float


def exact_int(x: float) -> int:
    """``x * 2**1074`` as an exact integer (``x`` finite)."""
    num, den = x.as_integer_ratio()
    return num << (_SHIFT + 1 - den.bit_length())


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

    def set_row(self, i: int, values: Sequence[float]) -> None:
        """Row ``i`` now holds ``values`` (one per column)."""
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

    def set_counted(self, counted: Sequence[bool]) -> None:
        """Which rows the mean is over (the up instances); O(rows), for rare changes."""
        self._counted = [bool(c) for c in counted]
        self._n_counted = sum(self._counted)
        n_columns = len(self._sums)
        self._sums = [sum(row[j] for row, c in zip(self._ints, self._counted) if c)
                      for j in range(n_columns)]

    def means(self) -> tuple[float, ...]:
        """The mean of every column over the counted rows (all rows when none is)."""
        use_all = self._n_counted == 0
        rows = [i for i in self._odd_rows if use_all or self._counted[i]]
        k = len(self._ints) if use_all else self._n_counted
        if rows:  # an infinite or NaN value: the float sum says what the mean is
            picked = [v for v, c in zip(self._values, self._counted) if use_all or c]
            return tuple(sum(v[j] for v in picked) / k for j in range(len(self._sums)))
        sums = self._all if use_all else self._sums
        return tuple(s / (k << _SHIFT) for s in sums)
