"""``Simulation._feed_arrivals``: a run's arrivals wait outside the event heap and go in one at
a time, so the heap holds what is in flight, not the whole run. The same events must come
out in the same order as with every arrival pushed at the start (``_ARRIVALS_IN_HEAP``):
compared pop by pop (time, sequence number, kind), record by record, over the shared
scenarios (waiting calls, two tenants with preemption, an instance down and up), arrivals
given out of order and several at one instant, and a fork taken mid-run."""

from __future__ import annotations

import heapq
from typing import Any

import pytest

from agentflow.sim import driver as D
from agentflow.sim.driver import Simulation
from tests.sim.scenarios import record_rows, small_scenario


def _replay(monkeypatch: pytest.MonkeyPatch, in_heap: bool, policy: str, *, tenants: bool,
            faults: bool, shuffle: bool = False, fork_at: float | None = None
            ) -> tuple[list[Any], list[tuple[float, int, str]], int]:
    """Records, every pop of the event heap, and the heap's size at the first pop."""
    sc = small_scenario(tenants=tenants, faults=faults)
    wl = sc.workload
    queries, arrivals = list(wl.queries), list(wl.arrivals)
    slo, idle = wl.deadlines(2.0), list(wl.idle_latency_s)
    tenant_of, class_of = wl.tenants, wl.classes
    if shuffle:  # out of order, and three queries at each of a few instants
        order = list(range(len(queries)))[::-1]
        order = order[1::2] + order[0::2]
        queries = [queries[i] for i in order]
        slo, idle = [slo[i] for i in order], [idle[i] for i in order]
        arrivals = [arrivals[i] for i in order]
        for i in range(0, len(arrivals) - 2, 7):
            arrivals[i + 1] = arrivals[i + 2] = arrivals[i]
        tenant_of = None if tenant_of is None else [tenant_of[i] for i in order]
        class_of = None if class_of is None else [class_of[i] for i in order]
    monkeypatch.setattr(D, "_ARRIVALS_IN_HEAP", in_heap)
    sim = Simulation(sc.cluster, policy, faults=sc.faults)
    pops: list[tuple[float, int, str]] = []
    first: list[int] = []
    real_pop = heapq.heappop

    def pop(h: list) -> Any:
        if h is sim._heap:
            if not first:
                first.append(len(h))
            e = real_pop(h)
            pops.append(e[:3])
            return e
        return real_pop(h)

    monkeypatch.setattr(heapq, "heappop", pop)
    if fork_at is not None:
        sim.schedule_hook(fork_at, lambda s: s.fork().drain())
    result = sim.run(queries, arrivals, slo, idle, tenants=tenant_of, classes=class_of)
    monkeypatch.setattr(heapq, "heappop", real_pop)
    return record_rows(result), pops, first[0]


@pytest.mark.parametrize("policy,tenants,faults,shuffle", [
    ("flowsage", False, False, False),
    ("flowsage", False, True, True),
    ("flowsage", True, False, False),
    ("hexgen-flow", False, True, False),
    ("llf", True, True, True),
])
def test_fed_arrivals_pop_the_same_events_in_the_same_order(
        monkeypatch: pytest.MonkeyPatch, policy: str, tenants: bool, faults: bool,
        shuffle: bool) -> None:
    rows_all, pops_all, size_all = _replay(monkeypatch, True, policy, tenants=tenants,
                                           faults=faults, shuffle=shuffle)
    rows_fed, pops_fed, size_fed = _replay(monkeypatch, False, policy, tenants=tenants,
                                           faults=faults, shuffle=shuffle)
    assert pops_fed == pops_all
    assert rows_fed == rows_all
    n_faults = 2 if faults else 0
    n = sum(1 for p in pops_all if p[2] == "arrival")
    assert size_all == n + n_faults  # before: the whole run in the heap at the first pop
    assert size_fed == 1 + n_faults  # fed: one arrival


def test_a_fork_mid_run_leaves_the_fed_arrivals_to_the_live_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fork gets no pending arrival (as before) and the live run goes on unchanged."""
    plain = _replay(monkeypatch, False, "hexgen-flow", tenants=False, faults=False)
    forked_all = _replay(monkeypatch, True, "hexgen-flow", tenants=False, faults=False,
                         fork_at=4.0)
    forked_fed = _replay(monkeypatch, False, "hexgen-flow", tenants=False, faults=False,
                         fork_at=4.0)
    assert forked_fed[0] == forked_all[0]
    assert forked_fed[0][:-1] == plain[0][:-1]  # records as without the fork (events: +1 hook)
    # the same pops but the hook's (the hook, pushed first, took sequence number 0)
    assert [(t, k) for t, _, k in forked_fed[1] if k != "hook"] == [(t, k) for t, _, k in plain[1]]
