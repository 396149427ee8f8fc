"""Decisions are the same as before the per-decision work was cut (lazy re-placement of
re-keyed queue entries, lines moved in place in the kinetic tournament, invalidation walks
that stop early).

``ReferenceCoordinator`` runs every instance queue as it was (``ReferenceQueue``: a re-key
re-places its entry at once, by removing it and inserting it again; ``ReferenceTournament``:
every invalidation walks to the root), kept here verbatim. Seeded event sequences go through
both and every decision must be the same: the replay of ``test_view_rows`` for every preset
(arrivals with classes and tenants, progress, failures, instances down and up, cancels),
its peer-group cluster, and the benchmark's own workload on a 64-instance fleet, where one
query's event re-keys its calls on a dozen instances. The fast queue is also checked against
its O(n) reference scan at every pick.
"""

from __future__ import annotations

import heapq

import pytest

from agentflow.bench.scheduler import scheduler_overhead
from agentflow.scheduler import PRESETS, Coordinator
from agentflow.scheduler.instance import InstanceQueue
from agentflow.scheduler.ranking import KineticTournament, next_switch, segment_at
from tests.scheduler.test_view_rows import PEER_SPECS, replay

_INF = float("inf")

# ------------------------------------------------------------------ the queue, as it was


class ReferenceTournament(KineticTournament):
    __slots__ = ()

    def _invalidate(self, node):
        exp = self._exp
        while node >= 1:
            exp[node] = -_INF
            node >>= 1


class ReferenceQueue(InstanceQueue):
    def peek(self, now):
        self._now = max(self._now, now)
        self._fire_timers(now)
        for tier in self._tier_order:
            t = self._tiers[tier]
            if t.n:
                call = t.peek(now).calls[0][1]
                if self.check_reference:
                    ref = self.reference_peek(now)
                    assert ref is call, (f"fast pick {call.id} != reference "
                                         f"{ref.id if ref else None} at {now}")
                return call
        return None

    def _rank(self, entry, call, now, view, key=None):
        if key is None:
            key = self.policy.rank(call, now, view)
        if key == entry.key and entry.slot is not None:
            return
        entry.key = key
        if self.policy.per_query:
            for _, c in entry.calls:
                c.rank_key = entry.key
        else:
            call.rank_key = entry.key
        self._place(entry, now)

    def _place(self, entry, now):
        self._unplace(entry)
        seg = segment_at(entry.key, now)
        tournament = self._tiers.get(seg.tier)
        if tournament is None:
            tournament = self._tiers[seg.tier] = ReferenceTournament()
            self._tier_order = sorted(self._tiers)
        entry.seq = entry.calls[0][0]
        entry.slot = (seg.tier, tournament.insert(entry, seg.a, seg.s, entry.seq))
        entry.version += 1
        switch = next_switch(entry.key, now)
        if switch is not None:
            heapq.heappush(self._timers, (switch, entry.seq, entry.version, entry))


class ReferenceCoordinator(Coordinator):
    def __init__(self, instances, **kw):
        super().__init__(instances, **kw)
        for q in self.queues.values():  # before any event: nothing is queued yet
            q.__class__ = ReferenceQueue


def _checked(c: Coordinator) -> None:
    for q in c.queues.values():
        q.check_reference = True


# ---------------------------------------------------------------------------- the tests


def _compare(new: list, old: list) -> None:
    for i, (a, b) in enumerate(zip(new, old)):
        assert a == b, f"event {i}: {a} != {b} (before: {old[max(0, i - 3):i]})"
    assert len(new) == len(old)


@pytest.mark.parametrize("policy", [*PRESETS, "least_loaded+edf", "earliest_finish+llf"])
def test_every_decision_matches_the_eager_queue(policy):
    new = replay(Coordinator, policy, seed=7, check=_checked)
    old = replay(ReferenceCoordinator, policy, seed=7)
    assert sum(1 for e in old if e[0] == "start") > 100
    _compare(new, old)


@pytest.mark.parametrize("policy", ["flowsage", "hexgen-flow", "sagesched"])
def test_every_decision_matches_the_eager_queue_on_peer_groups(policy):
    new = replay(Coordinator, policy, seed=11, specs=PEER_SPECS, check=_checked)
    old = replay(ReferenceCoordinator, policy, seed=11, specs=PEER_SPECS)
    assert sum(1 for e in old if e[0] == "start") > 100
    _compare(new, old)


@pytest.mark.parametrize("policy", ["flowsage", "earliest_finish+llf", "vllm"])
def test_the_benchmark_decides_alike(policy, monkeypatch):
    """The benchmark's rounds on 64 instances: 1,000 calls waiting, each round a call ready
    and one finished (learning), so every event re-keys a query on many instances."""
    logs = {}
    for name, cls in (("new", Coordinator), ("old", ReferenceCoordinator)):
        monkeypatch.setattr(scheduler_overhead, "Coordinator", cls)
        log: list[tuple[str, str, int]] = []
        scheduler_overhead.measure(policy, 1000, 150, "hetero-64", log=log)
        logs[name] = log
    assert len(logs["old"]) >= 150
    _compare(logs["new"], logs["old"])
