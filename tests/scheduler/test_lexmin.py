"""``lexmin`` picks the row ``np.lexsort`` puts first, on ties, NaN, infinities and signed
zeros; ``LoadBook``'s batched retirement leaves the sums one-by-one ``stop`` leaves."""

from __future__ import annotations

import heapq
import random

import numpy as np
import pytest

from agentflow.scheduler.instance import LoadBook
from agentflow.scheduler.policies.lexmin import lexmin


@pytest.mark.parametrize("seed", range(40))
def test_lexmin_is_the_first_row_of_lexsort(seed):
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


class _Call:
    def __init__(self, seq):
        self.seq = seq
        self.expected_finish = None


def _stop_one_by_one(book: LoadBook, now: float) -> None:
    heap = book._heap
    while heap and heap[0][0] <= now:
        finish, _, index, call = heapq.heappop(heap)
        if call.expected_finish == finish:
            book.stop(index, call)


def test_batched_retirement_gives_the_sums_of_one_by_one_stops():
    rng = random.Random(2)
    books = LoadBook(7), LoadBook(7)
    calls = [[], []]
    for seq in range(400):
        i, finish = rng.randrange(7), rng.uniform(0, 10) * rng.choice([1, 1e-3, 1e3])
        for book, made in zip(books, calls):
            call = _Call(seq)
            book.start(i, call, finish)
            made.append((i, call))
            if seq % 9 == 0:  # finished before its expected finish: stopped, entry stale
                book.finish(i, call)
    for now in (0.5, 3.0, 3.0, 7.5, 5e3):
        _stop_one_by_one(books[1], now)
        run = books[0].running(now)
        assert np.array_equal(books[0].finish_sum, books[1].finish_sum)
        assert np.array_equal(books[0].finish_n, books[1].finish_n)
        assert np.array_equal(run, np.maximum(books[1].finish_sum
                                              - books[1].finish_n * now, 0.0))
