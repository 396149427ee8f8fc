"""The load book's expiry wheel retires over-running calls exactly as the heap it replaced.

``HeapLoadBook`` is the load book as it was before the wheel (kept verbatim): one heap entry
per running call, popped one by one. The same operations through both leave bit-identical
sums and running-work vectors, through bursts of calls that fall due at once, calls that
stop before their finish (stale entries), calls restarted after a retire (reused tickets)
and non-finite finishes; and a coordinator on either book decides alike on the seeded event
replay of ``test_view_rows``, on the small mixed cluster and on one where hundreds of calls
fall due together.
"""

from __future__ import annotations

import heapq
import random

import numpy as np
import pytest

from agentflow.bench.scheduler.scheduler_overhead import workflow
from agentflow.scheduler import PRESETS, Coordinator, InstanceSpec, loadbook
from agentflow.scheduler.decisions import StartCall
from agentflow.scheduler.lengths.learned import LearnedLengthModel
from agentflow.scheduler.loadbook import ExpiryWheel, LoadBook
from agentflow.workflow import ManualClock
from tests.scheduler.test_view_rows import replay


@pytest.fixture(autouse=True, params=[0, loadbook.SMALL_READ, 10 ** 9],
                ids=["vector-reads", "small-reads", "scalar-reads"])
def _read_path(request, monkeypatch):
    """Every test on each way the wheel reads due tickets (``loadbook.SMALL_READ``): all
    by vector operations (0, the stop-51 code), ticket by ticket up to the default, and
    ticket by ticket however many fall due: the same sums and decisions each time."""
    monkeypatch.setattr(loadbook, "SMALL_READ", request.param)

# ------------------------------------------------------------------ the heap, as it was


class HeapLoadBook:
    # The KV totals are today's (held progress reports, ``InstanceQueue.note_progress``):
    # the heap against the wheel is what is compared here.
    kv_used = LoadBook.kv_used
    settle_kv = LoadBook.settle_kv

    def __init__(self, n: int):
        self.n_wait = np.zeros(n)
        self.wait_prompt = np.zeros(n)
        self.wait_output = np.zeros(n)
        self.finish_sum = np.zeros(n)
        self.finish_n = np.zeros(n)
        self.n_run = np.zeros(n)
        self.kv_settled = np.zeros(n)
        self.kv_pending = np.zeros(n)
        self.kv_folded = {}
        self.prefill_prompt = np.zeros(n)
        self._heap = []

    def start(self, index, call, finish, kv_tokens=0):
        self.n_run[index] += 1
        self.kv_settled[index] += kv_tokens
        call.expected_finish = finish
        heapq.heappush(self._heap, (finish, call.seq, index, call))
        self.finish_sum[index] += finish
        self.finish_n[index] += 1

    def finish(self, index, call, kv_tokens=0):
        self.n_run[index] -= 1
        self.kv_settled[index] = max(0.0, self.kv_settled[index] - kv_tokens)
        self.stop(index, call)

    def stop(self, index, call):
        if call.expected_finish is not None:
            self.finish_sum[index] -= call.expected_finish
            self.finish_n[index] -= 1
            if self.finish_n[index] == 0:
                self.finish_sum[index] = 0.0
            call.expected_finish = None

    def running(self, now):
        self.retire_due(now)
        return np.maximum(self.finish_sum - self.finish_n * now, 0.0)

    def retire_due(self, now):  # what the compiled price asks for (``LoadBook.retire_due``)
        heap = self._heap
        if heap and heap[0][0] <= now:
            self._retire(now)

    def _retire(self, now):
        heap = self._heap
        rows, finishes = [], []
        while heap and heap[0][0] <= now:
            finish, _, index, call = heapq.heappop(heap)
            if call.expected_finish == finish:
                call.expected_finish = None
                rows.append(index)
                finishes.append(finish)
        if not rows:
            return
        at = np.array(rows, dtype=np.intp)
        np.subtract.at(self.finish_sum, at, finishes)
        np.subtract.at(self.finish_n, at, 1.0)
        self.finish_sum[at[self.finish_n[at] == 0]] = 0.0


class HeapBookCoordinator(Coordinator):
    """The coordinator on the heap load book (set before any event, while all is zero)."""

    def __init__(self, instances, **kw):
        super().__init__(instances, **kw)
        self.loads = HeapLoadBook(len(instances))
        for q in self.queues.values():
            q.book = self.loads


class _Call:
    def __init__(self, seq):
        self.seq = seq
        self.expected_finish = None
        self.expiry_ticket = None


# ---------------------------------------------------------------------------- the tests


def _same(new: LoadBook, old: HeapLoadBook, now: float) -> int:
    """Both books agree at ``now``; how many calls that read retired."""
    counted = int(old.finish_n.sum())
    a, b = new.running(now), old.running(now)
    assert np.array_equal(a, b, equal_nan=True), (now, a, b)  # inf - inf: NaN in both
    assert np.array_equal(new.finish_sum, old.finish_sum, equal_nan=True)
    assert np.array_equal(new.finish_n, old.finish_n)
    return counted - int(old.finish_n.sum())


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf - inf, both books
@pytest.mark.parametrize("seed", range(12))
def test_the_wheel_leaves_the_sums_the_heap_leaves(seed):
    rng = random.Random(seed)
    n = rng.choice([1, 3, 7, 40])
    new, old = LoadBook(n), HeapLoadBook(n)
    new.expiry = ExpiryWheel(width=rng.choice([1 / 64, 0.5, 7.0]), capacity=4)  # grows
    now, seq = 0.0, 0
    running: list[tuple[int, _Call, _Call]] = []  # (row, call on new, call on old)
    most = 0  # the most calls retired by one read
    for _ in range(600):
        r = rng.random()
        if r < 0.45:  # a start; bursts of equal finishes; some long, some non-finite
            burst = rng.choice([1, 1, 1, 5, 60])
            finish = now + rng.choice([rng.uniform(0, 3), rng.uniform(0, 3) * 1e3, 0.0])
            if seed % 4 == 0 and rng.random() < 0.02:
                finish = rng.choice([float("inf"), -float("inf")])
            for _ in range(burst):
                i = rng.randrange(n)
                if running and rng.random() < 0.1:  # a stopped call started again
                    i, a, b = running.pop(rng.randrange(len(running)))
                    new.finish(i, a)
                    old.finish(i, b)
                else:
                    seq += 1
                    a, b = _Call(seq), _Call(seq)
                new.start(i, a, finish)
                old.start(i, b, finish)
                running.append((i, a, b))
        elif r < 0.75 and running:  # a call leaves (before or after its finish)
            i, a, b = running.pop(rng.randrange(len(running)))
            new.finish(i, a)
            old.finish(i, b)
        now += rng.choice([0.0, rng.uniform(0, 0.05), rng.uniform(0, 2)])
        most = max(most, _same(new, old, now))
    _same(new, old, now + 1e6)
    assert most >= 40  # bursts really fell due together


def test_a_stale_ticket_never_stops_the_call_it_was_given_to():
    book = LoadBook(2)
    first, second = _Call(1), _Call(2)
    book.start(0, first, 1.0)
    book.running(1.5)  # first over-ran: its ticket is free again
    book.start(1, second, 9.0)
    assert second.expiry_ticket == first.expiry_ticket  # reused
    book.finish(0, first)  # first's report comes late: nothing of second's is touched
    assert book.finish_n.tolist() == [0.0, 1.0] and book.finish_sum[1] == 9.0
    assert book.running(2.0).tolist() == [0.0, 7.0]


def test_a_bucket_width_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        ExpiryWheel(width=0.0)


BURST_SPECS = [InstanceSpec(f"{gpu.lower()}-{i}", gpu, "Llama-3.1-8B", max_inflight=2)
               for gpu in ("H100", "A100-80G", "L40S") for i in range(40)]


@pytest.mark.parametrize("policy", [*PRESETS, "least_loaded+edf"])
def test_every_decision_matches_the_heap_book(policy):
    new = replay(Coordinator, policy, seed=7)
    old = replay(HeapBookCoordinator, policy, seed=7)
    assert sum(1 for e in old if e[0] == "start") > 100
    assert new == old


def _burst_log(cls: type[Coordinator], policy: str, sizes: list[int] | None = None
               ) -> list[tuple]:
    """As ``bench scheduler_overhead`` drives a coordinator: every call of 60 queries ready
    at once (the 240 admitted at t = 0 share an expected finish per GPU kind), then rounds
    of one call ready and the oldest running one done, learning, as the clock moves."""
    clock = ManualClock(0.0)
    c = cls(BURST_SPECS, clock=clock, policy=policy, length_model=LearnedLengthModel())
    if sizes is not None:
        due = c.loads.expiry._due  # what ``LoadBook._retire`` reads

        def counted(now):
            tickets = due(now)
            sizes.append(len(tickets))
            return tickets
        c.loads.expiry._due = counted
    log: list[tuple] = []
    running: list = []

    def take(decisions):
        for d in decisions:
            assert isinstance(d, StartCall)
            running.append(d.call)
            log.append((d.call.id, d.instance, d.priority))

    for q in range(60):
        run = workflow(f"q{q}", 30.0 + q % 7)
        c.on_query_arrival(f"q{q}", deadline=30.0 + q % 7, key_text=f"question {q % 9}",
                           run=run)
        for n in run.graph:
            take(c.on_call_ready(f"q{q}", stage=run.node(n).stage, node_id=n,
                                 prompt_tokens=1500)[1])
    for i in range(300):
        clock.advance(0.05)
        q = f"q{(i * 7) % 60}"
        # a node of its own (not in the graph): two calls of one node would make the
        # critical path read whichever the set of calls yields last
        take(c.on_call_ready(q, stage="revise", node_id=f"{q}.r{i}", prompt_tokens=900)[1])
        take(c.on_call_done(running.pop(0), output_tokens=80, ttft_s=0.2, total_s=2.0))
    return log


@pytest.mark.parametrize("policy", ["flowsage", "earliest_finish+llf"])
def test_every_decision_matches_the_heap_book_when_hundreds_fall_due_at_once(policy):
    sizes: list[int] = []
    new = _burst_log(Coordinator, policy, sizes)
    old = _burst_log(HeapBookCoordinator, policy)
    assert len(old) > 400
    assert max(sizes) >= 40, sorted(sizes)[-5:]  # bursts really fell due together
    assert new == old


def test_a_few_tickets_of_one_instance_retire_in_the_vector_path_s_order(monkeypatch):
    """Several calls of one instance falling due in one small read subtract in (finish,
    seq) order, as ``np.subtract.at`` after the vector path's lexsort does: the sums are
    compared bit for bit with the vector path's on random finishes (fails if the few-ticket
    path subtracts in another order)."""
    sums = {}
    for small in (0, 10 ** 9):
        rng = random.Random(9)  # the same history for both
        monkeypatch.setattr(loadbook, "SMALL_READ", small)
        book, calls, out = LoadBook(3), [], []
        seq = 0
        for step in range(400):
            now = step * 0.05
            for _ in range(rng.randint(0, 6)):
                call = _Call(seq)
                seq += 1
                ends = now + rng.uniform(0.0, 0.3) * 10 ** rng.randint(-3, 1)
                book.start(rng.randrange(3), call, ends)
                calls.append(call)
            book.retire_due(now + 0.04)
            out.append(book.finish_sum.tobytes() + book.finish_n.tobytes())
        sums[small] = out
    assert sums[0] == sums[10 ** 9]
