"""One instance's local queue: waiting calls in policy order, admitted up to capacity.

Every policy gives each waiting call a key (``ranking.Segment`` list) when something happens
to the call's query; ``InstanceQueue`` keeps one ``KineticTournament`` per tier plus a timer
heap of tier switches, so choosing the next call costs O(log n) amortised whatever the policy,
including the ones whose keys move with time (llf, urgency, flowsage). ``reference_peek``
is the plain O(n) scan over the same keys, kept so tests can check that both always pick the
same call.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from agentflow.scheduler.call import CallState, ScheduledCall
from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.loadbook import LoadBook
from agentflow.scheduler.policies.base import QueuePolicy, SchedulerView
from agentflow.scheduler.ranking import (
    Key,
    KineticTournament,
    key_at,
    next_switch,
    segment_at,
)

if TYPE_CHECKING:
    from agentflow.scheduler.classes import ClassLoad


class InstanceQueue:
    """Waiting and running calls of one instance."""

    def __init__(self, spec: InstanceSpec, policy: QueuePolicy, book: LoadBook | None = None,
                 index: int = 0):
        self.spec = spec
        self.book = book if book is not None else LoadBook(1)
        self.index = index
        self.policy = policy
        self.up = True
        self.waiting: set[ScheduledCall] = set()
        self.running: set[ScheduledCall] = set()
        self._tiers: dict[int, KineticTournament] = {}
        self._tier_order: list[int] = []
        # (switch, seq, version, push number, entry): the push number breaks the tie of a
        # query's entry dropped and re-made by a retry (same seq, version and switch), which
        # would otherwise compare two entries
        self._timers: list[tuple[float, int, int, int, _Entry]] = []
        self._timer_pushes = itertools.count()
        # ranked entries: one per waiting call, or one per query for per-query policies
        self._entries: dict[object, _Entry] = {}
        # placed entries whose key moved since: re-placed at the next pick (``_rank``)
        self._stale: dict[_Entry, None] = {}
        self._now = float("-inf")  # latest decision time seen (for re-placing entries)
        self._admitted = 0
        # admissions made while two or more calls waited here: the ones where the queue
        # policy had a choice to make (issue 38: 18 of 2,460 under marginal_delay)
        self.admitted_with_choice = 0
        self._pending_prefill: set[ScheduledCall] = set()
        # prompt tokens of admitted calls that have since been prefilled here (their first
        # token, or a normal finish without one): a running count, read as differences
        # (``prefilled_since_first_token``); a call stopped, failed or cancelled before its
        # first token adds nothing, as its prompt did not (all) run
        self.prefilled_tokens = 0.0
        self.check_reference = False  # tests: assert the fast pick equals the O(n) scan
        # (queue, best waiting call, its KV tokens) -> may it start now; None: capacity only
        self.gate: Callable[[InstanceQueue, ScheduledCall, int], bool] | None = None
        self.class_load: ClassLoad | None = None  # under class ranking
        # Progress reports that may grow a running call's KV reservation, held until
        # something reads this instance's KV (``note_progress``): call -> the output tokens
        # each report said it had written; each held call's share of ``book.kv_pending``.
        self._kv_held: dict[ScheduledCall, list[int]] = {}
        self._kv_bound: dict[ScheduledCall, list[int]] = {}
        # (call, output tokens written) -> KV tokens it may hold: the coordinator's rule
        self.kv_at: Callable[[ScheduledCall, int], int] | None = None
        # (call, its held reports' token counts) -> the most ``kv_at`` gives over them
        # (``settle_kv``; None: each report priced through ``kv_at``)
        self.kv_at_most: Callable[[ScheduledCall, list[int]], int] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kv_tokens_in_use(self) -> int:
        """KV-cache tokens the admitted calls may hold (kept in the shared ``LoadBook``),
        the held progress reports priced first (``note_progress``)."""
        if self._kv_held:
            self.settle_kv()
        return int(self.book.kv_settled[self.index])

    # ------------------------------------------------------------------------------ waiting
    def enqueue(self, call: ScheduledCall, now: float, view: SchedulerView) -> None:
        call.instance = self.name
        call.state = CallState.WAITING
        self.waiting.add(call)
        self._account(call, +1)
        owner = call.query if self.policy.per_query else call
        entry = self._entries.get(owner)
        if entry is None:
            entry = self._entries[owner] = _Entry(owner)
            heapq.heappush(entry.calls, (call.seq, call))
            entry.live = 1
            self._rank(entry, call, now, view)
        else:
            heapq.heappush(entry.calls, (call.seq, call))
            entry.live += 1
            call.rank_key = entry.key
            if call.seq < entry.seq:  # a retried older call: the tie-break seq moves
                self._place(entry, now)

    def rekey(self, call: ScheduledCall, now: float, view: SchedulerView,
              key: Key | None = None) -> None:
        """Recompute the key of a waiting call (its query changed) and re-place it; for
        per-query policies this re-keys the query's whole entry once (``key``: already
        computed by the caller for the query)."""
        if call not in self.waiting:
            return
        entry = self._entries[call.query if self.policy.per_query else call]
        self._rank(entry, call, now, view, key)

    def rekey_query(self, call: ScheduledCall, now: float, key: Key) -> None:
        """``rekey`` for a per-query policy, with the query's key already computed: the
        same steps without the calls through ``rekey`` and ``_rank`` (the coordinator makes
        one per instance the query waits on at each of its events: ~20 on a large fleet)."""
        if call not in self.waiting:
            return
        entry = self._entries[call.query]
        if key == entry.key and entry.slot is not None:
            return  # unchanged: nothing to move
        entry.key = key
        for _, c in entry.calls:  # the reference scan reads each call's key
            c.rank_key = key
        if entry.slot is None:
            self._place(entry, now)
        else:
            self._stale[entry] = None  # re-placed at the next pick (see ``_rank``)

    def remove(self, call: ScheduledCall) -> None:
        """Forget a waiting call (cancelled, moved or admitted)."""
        if call not in self.waiting:
            return
        self.waiting.discard(call)
        self._account(call, -1)
        owner = call.query if self.policy.per_query else call
        entry = self._entries[owner]
        entry.live -= 1
        if entry.live == 0:
            self._unplace(entry)
            self._stale.pop(entry, None)
            del self._entries[owner]
            return
        calls = entry.calls
        if calls[0][1] is call:
            heapq.heappop(calls)
            while calls[0][1] not in self.waiting or calls[0][1].instance != self.name:
                heapq.heappop(calls)
            self._place(entry, self._now)

    def peek(self, now: float) -> ScheduledCall | None:
        """The call the policy runs next, in O(log n) amortised."""
        self._now = max(self._now, now)
        if self._stale:
            for entry in self._stale:
                if entry.slot is not None:  # not left meanwhile
                    self._place(entry, now)
            self._stale.clear()
        self._fire_timers(now)
        for tier in self._tier_order:
            t = self._tiers[tier]
            if t.n:
                call: ScheduledCall = t.peek(now).calls[0][1]
                if self.check_reference:
                    ref = self.reference_peek(now)
                    assert ref is call, (f"fast pick {call.id} != reference "
                                         f"{ref.id if ref else None} at {now}")
                return call
        return None

    def reference_peek(self, now: float) -> ScheduledCall | None:
        """The same choice by an O(n) scan over the same keys."""
        if not self.waiting:
            return None
        return min(self.waiting, key=lambda c: (*key_at(c.rank_key, now), c.seq))

    def ordered_waiting(self, now: float, view: SchedulerView | None = None
                        ) -> list[ScheduledCall]:
        """Waiting calls in the order they would be admitted now (inspection and tests)."""
        return sorted(self.waiting, key=lambda c: (*key_at(c.rank_key, now), c.seq))

    # ------------------------------------------------------------------------------ running
    def admit(self, now: float, view: SchedulerView,
              kv_tokens: Callable[[ScheduledCall], int]) -> list[ScheduledCall]:
        """Start waiting calls in queue order while capacity allows; each gets its admission
        number as the backend priority (vLLM: lower runs earlier)."""
        started: list[ScheduledCall] = []
        pending_limit = self.spec.max_pending_prefill
        while self.up and self.waiting and len(self.running) < self.spec.max_inflight:
            if pending_limit is not None and len(self._pending_prefill) >= pending_limit:
                break  # admit more once an admitted call produces its first token
            call = self.peek(now)
            assert call is not None  # waiting is not empty
            need = kv_tokens(call)
            budget = self.spec.kv_token_budget
            if budget is not None and self.running and self.kv_tokens_in_use + need > budget:
                break  # wait for memory; an empty instance always admits one call
            if self.gate is not None and self.running and not self.gate(self, call, need):
                break  # room kept for a higher class (scheduler.classes.headroom_gate)
            if len(self.waiting) > 1:
                self.admitted_with_choice += 1
            self.remove(call)
            call.state = CallState.RUNNING
            call.started_at = now
            call.priority = self._admitted
            call.co_runners_at_start = len(self.running)
            call.prefill_ahead_at_start = float(self.book.prefill_prompt[self.index])
            call.prefilled_mark = None  # this run's first token sets it
            self._admitted += 1
            self.running.add(call)
            if self.class_load is not None:
                self.class_load.running(self.index, call, +1)
            if call.attained_tokens == 0:
                self._pending_prefill.add(call)
                self.book.prefill_prompt[self.index] += call.tokens_on(self.name)
            call.kv_reserved = need
            self.book.start(self.index, call, now + view.expected_s(call, self.name), need)
            started.append(call)
        return started

    def first_token(self, call: ScheduledCall) -> None:
        self._prefilled(call)
        call.prefilled_mark = self.prefilled_tokens

    def prefilled_since_first_token(self, call: ScheduledCall) -> float | None:
        """Prompt tokens of other calls whose prefill *completed* here while ``call`` decoded
        (None: it has not reported a first token): what stalled its decode steps with their
        chunks. A prompt is counted whole when its first token comes, so one whose first
        chunks ran before ``call``'s first token is counted in full (an over-count bounded by
        one prompt per co-runner admitted before it)."""
        if call.prefilled_mark is None:
            return None
        return self.prefilled_tokens - call.prefilled_mark

    def _prefilled(self, call: ScheduledCall, ran: bool = True) -> None:
        if call in self._pending_prefill:
            self._pending_prefill.discard(call)
            self.book.prefill_prompt[self.index] -= call.tokens_on(self.name)
            if ran:
                self.prefilled_tokens += call.tokens_on(self.name)

    def pending_prefill(self) -> int:
        """Admitted calls that have not produced a token yet."""
        return len(self._pending_prefill)

    def reserve(self, call: ScheduledCall, kv_tokens: int) -> None:
        """A running call may need more KV than it was admitted with (it has written past the
        length it was expected to stay under): hold that much for it from now on, so no new
        call is admitted into memory it will take."""
        if call in self.running and kv_tokens > call.kv_reserved:
            self.book.kv_settled[self.index] += kv_tokens - call.kv_reserved
            call.kv_reserved = kv_tokens

    def note_progress(self, call: ScheduledCall, written: int) -> None:
        """A running call reported ``written`` output tokens at a bucket boundary: it may
        need more KV than it holds (``reserve``). The report is held, not priced: the
        reservation is computed only when something reads this instance's KV
        (``kv_tokens_in_use``, ``LoadBook.kv_used``, the dispatch room test where the held
        reports could change its answer), and a call that finishes with reports still held
        never prices them.

        Why exact: a reservation only moves this instance's KV total, in whole tokens (exact
        float sums), and its call's own ``kv_reserved``. Settled, the held reports are
        priced in their order with each report's own token count (``kv_at``: the rule that
        reads ``attained_tokens``), so every reader gets what pricing each report as it came
        gives. A call that leaves with reports held gives back what it holds by the
        reports priced so far: what eager reservations would have added, and then taken
        back with it, cancels to the token. Why: a call reports ~5 times (1, 2, 4, ...
        tokens), each reservation a quantile of its prediction (~8 µs), and most calls
        finish before anything reads their instance's KV (the sim's 1,024-instance fleet).

        ``book.kv_pending`` holds an upper bound on what the held reports may add (a
        reservation is at most the prompt plus the prediction's largest length or twice
        what was written), for a reader that settles only instances where it matters."""
        held = self._kv_held.get(call)
        if held is None:
            if call not in self.running:
                return  # ``reserve`` would do nothing
            held = self._kv_held[call] = []
            self.book.kv_folded[self.index] = self.settle_kv
            tokens = call.tokens_on(self.name)
            bound = self._kv_bound[call] = [
                0, tokens, tokens + math.ceil(call.output.values.item(-1))]
        else:
            bound = self._kv_bound[call]
        held.append(written)
        # [what its held reports may add, its prompt, prompt + the largest predicted length];
        # its reports come in growing token counts, so the bound only grows
        grow = max(bound[2], bound[1] + math.ceil(2 * written)) - call.kv_reserved
        if grow > bound[0]:
            self.book.kv_pending[self.index] += grow - bound[0]
            bound[0] = grow

    def settle_kv(self) -> None:
        """Price the held progress reports (``note_progress``), each call's in order."""
        held, kv_at = self._kv_held, self.kv_at
        if held:
            most = self.kv_at_most
            if most is not None:
                # One reservation per call, at the most its reports ask: ``reserve`` only
                # raises ``kv_reserved`` to what it is given, adding the rise to the
                # instance's total, so a sequence of reservations ends at their maximum
                # having added (maximum - start) in whole tokens, whose float sums are
                # exact in any grouping (< 2**53): the same total and ``kv_reserved`` as
                # reserving report by report (a settle holds ~3 reports a call at 1,500
                # queries on hetero-1024).
                for call, written in held.items():
                    self.reserve(call, most(call, written))
            else:
                assert kv_at is not None  # set by the coordinator that holds reports
                for call, written in held.items():
                    for w in written:
                        self.reserve(call, kv_at(call, w))
            held.clear()
        self._none_held()

    def finish(self, call: ScheduledCall, completed: bool = False) -> None:
        """``call`` leaves the instance; ``completed``: it ran to its end (so its prompt was
        prefilled even if no first token was reported), else it was stopped, failed or
        cancelled (a prompt still pending did not run)."""
        if self._kv_held and self._kv_held.pop(call, None) is not None:
            self._drop_held(call)
        if call in self.running:
            self.running.discard(call)
            if self.class_load is not None:
                self.class_load.running(self.index, call, -1)
            self._prefilled(call, ran=completed)
            self.book.finish(self.index, call, call.kv_reserved)

    # ---------------------------------------------------------------------------- internals
    def _drop_held(self, call: ScheduledCall) -> None:
        """``call`` leaves with progress reports held: they are never priced (see
        ``note_progress``), and its share of the pending bound goes with it."""
        grow = self._kv_bound.pop(call)[0]
        if not self._kv_held:
            self._none_held()
        elif grow:
            self.book.kv_pending[self.index] -= grow

    def _none_held(self) -> None:
        """No progress report is held here any more: no bound, nothing for a reader to settle."""
        self._kv_bound.clear()
        self.book.kv_pending[self.index] = 0.0
        self.book.kv_folded.pop(self.index, None)

    def _rank(self, entry: _Entry, call: ScheduledCall, now: float,
              view: SchedulerView, key: Key | None = None) -> None:
        if key is None:
            key = self.policy.rank(call, now, view)
        if key == entry.key and entry.slot is not None:
            return  # unchanged: nothing to move
        entry.key = key
        if self.policy.per_query:
            for _, c in entry.calls:  # the reference scan reads each call's key
                c.rank_key = entry.key
        else:
            call.rank_key = entry.key
        if entry.slot is None:
            self._place(entry, now)
        else:
            # Re-placed at the next pick, not now. Why: a query's event re-keys its entries
            # on every instance where it has calls waiting (20 on a large fleet), while an
            # instance picks about once per call it finishes, so most re-keys would be
            # overwritten before any pick reads them. The tournament's winner depends only
            # on the lines it holds at the pick (ties go to the smaller seq), and a key
            # placed at the pick sits in the segment it would have reached by then through
            # its timers, so the pick is the same.
            self._stale[entry] = None

    def _place(self, entry: _Entry, now: float) -> None:
        seg = segment_at(entry.key, now)
        entry.seq = entry.calls[0][0]
        if entry.slot is not None and entry.slot[0] == seg.tier:  # same tier: move its line
            self._tiers[seg.tier].update(entry.slot[1], seg.a, seg.s, entry.seq)
        else:
            self._unplace(entry)
            tournament = self._tiers.get(seg.tier)
            if tournament is None:
                tournament = self._tiers[seg.tier] = KineticTournament()
                self._tier_order = sorted(self._tiers)
            entry.slot = (seg.tier, tournament.insert(entry, seg.a, seg.s, entry.seq))
        entry.version += 1
        switch = next_switch(entry.key, now)
        if switch is not None:
            heapq.heappush(self._timers, (switch, entry.seq, entry.version,
                                          next(self._timer_pushes), entry))

    def _unplace(self, entry: _Entry) -> None:
        if entry.slot is not None:
            tier, slot = entry.slot
            self._tiers[tier].remove(slot)
            entry.slot = None

    def _fire_timers(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, version, _, entry = heapq.heappop(timers)
            if version == entry.version and entry.slot is not None:
                self._place(entry, now)

    def _account(self, call: ScheduledCall, sign: int) -> None:
        book, i = self.book, self.index
        book.n_wait[i] += sign
        book.wait_prompt[i] += sign * call.tokens_on(self.name)
        book.wait_output[i] += sign * call.mean_output
        if self.class_load is not None:
            self.class_load.account(i, call, sign, call.tokens_on(self.name))


class _Entry:
    """What the tournament ranks: one call, or all of one query's waiting calls here (then
    they share the query's key and leave in ``seq`` order, ties going to the oldest)."""

    __slots__ = ("calls", "key", "live", "owner", "seq", "slot", "version")

    def __init__(self, owner: object):
        self.owner = owner
        self.calls: list[tuple[int, ScheduledCall]] = []  # heap by seq (lazy removals)
        self.live = 0
        self.key: Key = ()
        self.seq = 0
        self.slot: tuple[int, int] | None = None
        self.version = 0
