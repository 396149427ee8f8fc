"""Every instance's load in a few arrays (``LoadBook``), and the timing wheel that stops
counting running calls once they are past their expected finish (``ExpiryWheel``).

Why a wheel and not a heap: calls admitted together with the same expected time over-run
together — on a 4,096-instance fleet, 400 to 700 of them in one decision — and a heap pays a
Python ``heappop`` (a dozen tuple comparisons) for each: about a millisecond in that one
decision, the whole p99. The wheel files each running call by its expected finish in a
bucket of ``width`` seconds and keeps one heap entry per bucket (keyed by the earliest
finish in it), so a decision pops the few buckets that are due and retires their calls in a
handful of numpy operations over index arrays. The sums move exactly as one ``stop`` per
over-run call, in heap order, would move them (same floats: an instance retiring several
calls subtracts them in (finish, sequence) order, as the heap popped them), so no decision
changes.
"""

from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall

# Seconds of expected finish per bucket: small enough that the bucket holding ``now``
# (re-read while its calls fall due) stays small at thousands of calls/s, large enough that
# a bucket's one heap entry is shared by many calls. The clock is in seconds everywhere.
BUCKET_S = 1.0 / 64
# Reads of at most this many tickets go ticket by ticket in Python (``ExpiryWheel._due``,
# ``LoadBook._retire``): a decision retires ~0.7 calls on average (a 500-query run on
# 1,024 instances: 2,813 tickets in 4,135 reads), where ~20 numpy calls on arrays of one
# cost ~40 µs a read; larger reads (hundreds fall due together) stay vector operations.
# The same float operations in the same order either way (tests run both).
SMALL_READ = 64


class ExpiryWheel:
    """Running calls' expected finishes, by ticket. ``add`` files one and returns its
    ticket; ``cancel`` forgets it (the call stopped first); ``due(now)`` returns, once
    each, the tickets that are past their finish and still filed.

    A ticket's finish, sequence and instance row live in arrays indexed by ticket, so a
    bucket is only an array of tickets (grown by doubling); a ticket is reused once its
    bucket has been read (a cancelled one stays in its bucket until then, marked dead), and
    a call's ticket is told apart from a later holder's by the call's sequence number."""

    def __init__(self, width: float = BUCKET_S, capacity: int = 256):
        if not width > 0:
            raise ValueError(f"bucket width must be positive seconds, not {width!r}")
        self.width = width
        self.finish = np.zeros(capacity)
        self.seq = np.zeros(capacity, dtype=np.int64)
        self.row = np.zeros(capacity, dtype=np.intp)
        self.live = np.zeros(capacity, dtype=bool)
        # free tickets as a stack: ``_free[:_n_free]`` (popped from the end)
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.intp)
        self._n_free = capacity
        self._buckets: dict[int, list[Any]] = {}  # bucket -> [tickets array, how many filed]
        self._least: dict[int, float] = {}  # bucket -> its earliest finish
        self._heap: list[tuple[float, int]] = []  # (earliest finish, bucket); stale allowed

    def next_due(self) -> float:
        """The earliest finish filed (inf: none); what ``due`` compares with ``now``."""
        heap, least = self._heap, self._least
        while heap and least.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # a bucket read since, or one whose least went down
        return heap[0][0] if heap else math.inf

    def add(self, finish: float, seq: int, row: int) -> int:
        if not self._n_free:
            self._grow()
        self._n_free -= 1
        ticket = int(self._free[self._n_free])
        self.finish[ticket] = finish
        self.seq[ticket] = seq
        self.row[ticket] = row
        self.live[ticket] = True
        if not math.isfinite(finish):  # never due (inf, NaN) or due at once (-inf)
            if finish != -math.inf:
                return ticket
            key = -1 << 62
        else:
            key = math.floor(finish / self.width)
        bucket = self._buckets.get(key)
        if bucket is None:
            tickets = np.empty(8, dtype=np.intp)
            tickets[0] = ticket
            self._buckets[key] = [tickets, 1]
        else:
            tickets, n = bucket
            if n == len(tickets):
                tickets = bucket[0] = np.concatenate([tickets, np.empty(n, dtype=np.intp)])
            tickets[n] = ticket
            bucket[1] = n + 1
            if finish >= self._least[key]:
                return ticket
        self._least[key] = finish
        heapq.heappush(self._heap, (finish, key))
        return ticket

    def cancel(self, ticket: int, seq: int) -> bool:
        """Forget ``ticket``, filed for the call with sequence number ``seq``; False if it
        was already due or cancelled (then the ticket may be another call's by now, which
        its ``seq`` tells apart: a call's tickets are only ever its own)."""
        if not self.live[ticket] or self.seq[ticket] != seq:
            return False
        self.live[ticket] = False
        finish = self.finish[ticket]
        if not math.isfinite(finish) and finish != -math.inf:
            self._release(np.array([ticket], dtype=np.intp))  # in no bucket: free now
        return True

    def due(self, now: float) -> np.ndarray:
        """Tickets past their finish at ``now`` (finish <= now) and not cancelled, each
        once, in no particular order; they are no longer filed."""
        tickets = self._due(now)
        if isinstance(tickets, list):
            return np.array(tickets, dtype=np.intp)
        return tickets

    def _due(self, now: float) -> np.ndarray | list[int]:
        """``due``'s tickets: a list when at most ``SMALL_READ`` are read (each bucket of at
        most that many split ticket by ticket: the same tickets, in the same order, with
        the same rest left filed), else an array (``_due_vector``'s tail)."""
        heap, least, buckets = self._heap, self._least, self._buckets
        finish = self.finish
        read: list[int] = []
        while heap and heap[0][0] <= now:
            first, key = heapq.heappop(heap)
            if least.get(key) != first:
                continue  # stale entry: the bucket was read, or has an earlier one
            tickets, n = buckets.pop(key)
            del least[key]
            if n > SMALL_READ:  # many: as ``_due_vector`` splits a bucket
                tickets = tickets[:n]
                ends = finish[tickets]
                on_time = ends <= now
                if not on_time.all():
                    rest_a = tickets[~on_time]
                    buckets[key] = [rest_a, len(rest_a)]
                    least[key] = later = float(ends[~on_time].min())
                    heapq.heappush(heap, (later, key))
                    tickets = tickets[on_time]
                read += tickets.tolist()
                continue
            rest: list[int] = []
            for t in tickets[:n].tolist():
                (read if finish.item(t) <= now else rest).append(t)
            if rest:  # the bucket holding ``now``: the rest stay filed
                buckets[key] = [np.array(rest, dtype=np.intp), len(rest)]
                least[key] = later = min(finish.item(t) for t in rest)
                heapq.heappush(heap, (later, key))
        if len(read) > SMALL_READ:
            many = np.array(read, dtype=np.intp)
            self._release(many)
            alive: np.ndarray = many[self.live[many]]
            self.live[alive] = False
            return alive
        if read:
            self._release(read)
        live = self.live
        few = [t for t in read if live.item(t)]  # cancelled ones were only waiting
        for t in few:
            live[t] = False
        return few

    def _due_vector(self, now: float) -> np.ndarray:
        """``due`` by vector operations on each bucket read."""
        heap, least, buckets = self._heap, self._least, self._buckets
        read: list[np.ndarray] = []
        while heap and heap[0][0] <= now:
            first, key = heapq.heappop(heap)
            if least.get(key) != first:
                continue  # stale entry: the bucket was read, or has an earlier one
            tickets, n = buckets.pop(key)
            tickets = tickets[:n]
            del least[key]
            finish = self.finish[tickets]
            on_time = finish <= now
            if not on_time.all():  # the bucket holding ``now``: the rest stay filed
                rest = tickets[~on_time]
                buckets[key] = [rest, len(rest)]
                least[key] = later = float(finish[~on_time].min())
                heapq.heappush(heap, (later, key))
                tickets = tickets[on_time]
            read.append(tickets)
        if not read:
            return np.zeros(0, dtype=np.intp)
        tickets = read[0] if len(read) == 1 else np.concatenate(read)
        self._release(tickets)
        alive: np.ndarray = tickets[self.live[tickets]]  # cancelled ones were only waiting
        self.live[alive] = False
        return alive

    def _release(self, tickets: np.ndarray | list[int]) -> None:
        while self._n_free + len(tickets) > len(self._free):
            self._free = np.concatenate([self._free, np.empty(len(self._free), np.intp)])
        self._free[self._n_free:self._n_free + len(tickets)] = tickets
        self._n_free += len(tickets)

    def _grow(self) -> None:
        n = len(self.finish)
        self.finish = np.concatenate([self.finish, np.zeros(n)])
        self.seq = np.concatenate([self.seq, np.zeros(n, dtype=np.int64)])
        self.row = np.concatenate([self.row, np.zeros(n, dtype=np.intp)])
        self.live = np.concatenate([self.live, np.zeros(n, dtype=bool)])
        self._release(np.arange(2 * n - 1, n - 1, -1, dtype=np.intp))


class LoadBook:
    """Every instance's load in a few arrays, so a dispatch over 64 instances is a handful of
    vector operations instead of 64 scans: waiting calls and their token totals (with a
    time model linear in tokens they give the queue's expected work), and the running calls'
    expected finish times (estimated at admission). The work left on running calls is
    ``sum(f) - n * now`` over calls not yet past their expected finish; the ``ExpiryWheel``
    retires the over-running ones (the clock never goes back, so an over-run stays one, and
    it counts 0 as before), in one vector update per decision whatever their number.

    KV tokens held per instance (``kv_used``) may lag the progress reports: a report that
    grows a running call's reservation is kept by its instance's queue and priced only when
    something reads that instance's KV (``InstanceQueue.note_progress``). ``kv_used`` settles
    every instance first, so any reader gets the value eager reservations give;
    ``kv_settled`` is the array as it stands, with ``kv_pending`` (an upper bound on what
    the held reports may add, per instance) and ``kv_folded`` (the instances holding
    reports, each with its settle function) beside it, for a reader that settles only
    where the answer could change (``ClusterView._kv_room``)."""

    def __init__(self, n: int):
        self.n_wait = np.zeros(n)
        self.wait_prompt = np.zeros(n)
        self.wait_output = np.zeros(n)
        self.finish_sum = np.zeros(n)
        self.finish_n = np.zeros(n)
        self.n_run = np.zeros(n)
        self.kv_settled = np.zeros(n)
        self.kv_pending = np.zeros(n)  # whole tokens: sums of them are exact
        self.kv_folded: dict[int, Any] = {}  # instance index -> its settle function
        self.prefill_prompt = np.zeros(n)  # prompt tokens admitted but not yet prefilled
        self.expiry = ExpiryWheel()
        self._marks = np.zeros(n, dtype=np.intp)  # scratch for ``_repeats``

    @property
    def kv_used(self) -> np.ndarray:
        """KV tokens held per instance, every held progress report priced first (the array
        is the book's own: callers read it, never write it)."""
        if self.kv_folded:
            self.settle_kv()
        return self.kv_settled

    def settle_kv(self, rows: Any = None) -> None:
        """Price the progress reports held on instances ``rows`` (all when None)."""
        folded = self.kv_folded
        for i in (list(folded) if rows is None else rows):
            settle = folded.get(int(i))
            if settle is not None:
                settle()

    def start(self, index: int, call: ScheduledCall, finish: float, kv_tokens: int = 0
              ) -> None:
        self.n_run[index] += 1
        self.kv_settled[index] += kv_tokens
        call.expected_finish = finish
        call.expiry_ticket = self.expiry.add(finish, call.seq, index)
        self.finish_sum[index] += finish
        self.finish_n[index] += 1

    def finish(self, index: int, call: ScheduledCall, kv_tokens: int = 0) -> None:
        """An admitted call left the instance (done, failed, cancelled)."""
        self.n_run[index] -= 1
        self.kv_settled[index] = max(0.0, self.kv_settled[index] - kv_tokens)
        self.stop(index, call)

    def stop(self, index: int, call: ScheduledCall) -> None:
        """Stop counting ``call``'s expected remainder (it finished, or over-ran)."""
        ticket = call.expiry_ticket
        if ticket is None:
            return
        call.expiry_ticket = None
        if self.expiry.cancel(ticket, call.seq):
            assert call.expected_finish is not None  # set with the ticket
            self.finish_sum[index] -= call.expected_finish
            self.finish_n[index] -= 1
            if self.finish_n[index] == 0:
                self.finish_sum[index] = 0.0  # no drift once the instance is idle

    def running(self, now: float) -> np.ndarray:
        self.retire_due(now)
        return np.maximum(self.finish_sum - self.finish_n * now, 0.0)

    def retire_due(self, now: float) -> None:
        """Stop counting the calls past their expected finish at ``now``: what ``running``
        does first, for a reader that computes the remainders itself (the compiled price,
        ``scheduler.price_kernel``)."""
        if self.expiry.next_due() <= now:
            self._retire(now)

    def _retire(self, now: float) -> None:
        """Stop counting every call past its expected finish, as ``stop`` one by one would,
        in one vector update: calls started together over-run together (hundreds at once
        on a large fleet), and one ``stop`` each was a millisecond in one decision.
        ``np.subtract.at`` subtracts in the order given, so the sums are the same floats."""
        wheel = self.expiry
        tickets = wheel._due(now)
        if not len(tickets):
            return
        if isinstance(tickets, list):  # a few: ticket by ticket, the same operations
            self._retire_few(tickets)
            return
        at = wheel.row[tickets]
        if len(at) > 1 and self._repeats(at):  # an instance retires several:
            # in heap order, (finish, seq) (one live ticket per call, so no ties)
            order = np.lexsort((wheel.seq[tickets], wheel.finish[tickets]))
            tickets, at = tickets[order], at[order]
            np.subtract.at(self.finish_sum, at, wheel.finish[tickets])
            np.subtract.at(self.finish_n, at, 1.0)
        else:  # one per instance: the order cannot matter
            self.finish_sum[at] -= wheel.finish[tickets]
            self.finish_n[at] -= 1.0
        self.finish_sum[at[self.finish_n[at] == 0]] = 0.0  # no drift once it is idle

    def _retire_few(self, tickets: list[int]) -> None:
        """``_retire``'s update for a few tickets, one by one: in (finish, seq) order where
        an instance retires several (as the vector path orders them: ``np.subtract.at``
        subtracts in its index order), else in any order (one per instance); then the idle
        instances' sums set to 0, as the vector path does after all its subtractions."""
        wheel = self.expiry
        finish, row = wheel.finish, wheel.row
        rows = [row.item(t) for t in tickets]
        if len(set(rows)) < len(rows):
            seq = wheel.seq
            tickets = sorted(tickets, key=lambda t: (finish.item(t), seq.item(t)))
            rows = [row.item(t) for t in tickets]
        finish_sum, finish_n = self.finish_sum, self.finish_n
        for t, r in zip(tickets, rows):
            finish_sum[r] = finish_sum.item(r) - finish.item(t)
            finish_n[r] = finish_n.item(r) - 1.0
        for r in rows:
            if finish_n.item(r) == 0:
                finish_sum[r] = 0.0

    def _repeats(self, rows: np.ndarray) -> bool:
        """Whether a row occurs twice in ``rows``, in O(len(rows)): each row's last position
        written into a scratch array reads back as its own only if it occurs once."""
        marks, order = self._marks, np.arange(len(rows))
        marks[rows] = order
        return not bool((marks[rows] == order).all())
