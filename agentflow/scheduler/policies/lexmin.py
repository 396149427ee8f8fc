"""The first position of ``np.lexsort(keys)`` without sorting.

Why: dispatch policies pick the instance with the least price, ties to the least name rank —
``np.lexsort((names, price))[0]``. Sorting all 4,096 candidates to read one was a tenth of a
decision at fleet size; filtering by each key's minimum, the primary key first, is O(n) in a
few vector operations and returns the same position (``np.lexsort`` is stable: among rows
equal in every key, the first). A NaN in a key keeps the sort, which orders NaN last.
"""

from __future__ import annotations

import numpy as np

from agentflow.scheduler import price_kernel


def lexmin(keys: tuple[np.ndarray, ...]) -> int:
    """``int(np.lexsort(keys)[0])``: the row least by the last key, then the one before it...
    Two keys (every dispatch's names and price) go through one compiled pass where numba is
    installed (``price_kernel.lexmin2``: the same row for NaN-free keys; else this code)."""
    if len(keys) == 2:
        row = price_kernel.lexmin2(keys[0], keys[1])
        if row >= 0:
            return row
    rows: np.ndarray | None = None
    for key in reversed(keys):
        values = key if rows is None else key[rows]
        least = values.min()
        if least != least:  # NaN: the sort's order of it
            return int(np.lexsort(keys)[0])
        hits = np.flatnonzero(values == least)
        rows = hits if rows is None else rows[hits]
        if len(rows) == 1:
            return int(rows[0])
    assert rows is not None, "lexmin needs at least one key"
    return int(rows[0])
