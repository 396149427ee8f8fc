"""Progress reports held until their instance's KV is read (``InstanceQueue.note_progress``)
change no decision: whole simulations with the reports held and with every report priced
as it comes make the same decisions, in the same order, at the same times, and give the
same records to the last float — under KV pressure (the dispatch room test settles the
instances where held reports could change its answer, admissions settle their instance),
with two tenants and preemption (victims are chosen by the KV they hold), and with an
instance that goes down (its calls fail and leave with reports held).

The eager variant is the code before the fold: ``reserve(call, _kv_tokens(call))`` at the
report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from agentflow.scheduler.instance import InstanceQueue
from agentflow.scheduler.loadbook import LoadBook
from agentflow.sim.cluster import load_cluster
from agentflow.sim.driver import Simulation
from agentflow.sim.experiment import build_workload
from tests.sim.scenarios import record_rows, small_scenario
from tests.sim.test_driver import small_trace


@contextmanager
def folding(eager: bool) -> Iterator[Counter[str]]:
    """Count held reports, the ones priced when read and the ones dropped at a finish;
    ``eager``: price every report as it comes (the code before the fold)."""
    seen: Counter[str] = Counter()
    note, settle, finish = InstanceQueue.note_progress, InstanceQueue.settle_kv, \
        InstanceQueue.finish
    book_settle = LoadBook.settle_kv

    def _note(self: InstanceQueue, call: Any, written: int) -> None:
        if eager:
            assert self.kv_at is not None
            self.reserve(call, self.kv_at(call, written))
            return
        seen["held"] += 1
        note(self, call, written)

    def _settle(self: InstanceQueue) -> None:
        seen["priced when read"] += sum(len(w) for w in self._kv_held.values())
        settle(self)

    def _finish(self: InstanceQueue, call: Any, completed: bool = False) -> None:
        seen["dropped at a finish"] += len(self._kv_held.get(call, ()))
        finish(self, call, completed)

    def _book_settle(self: LoadBook, rows: Any = None) -> None:
        seen["dispatch settled" if rows is not None else "all settled"] += 1
        book_settle(self, rows)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(InstanceQueue, "note_progress", _note)
        mp.setattr(InstanceQueue, "settle_kv", _settle)
        mp.setattr(InstanceQueue, "finish", _finish)
        mp.setattr(LoadBook, "settle_kv", _book_settle)
        yield seen


def _run(policy: str, eager: bool, tenants: bool, faults: bool, rate: float
         ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], Counter[str]]:
    scenario = small_scenario(tenants, faults, rate)
    decisions: list[tuple[Any, ...]] = []
    with folding(eager) as seen:
        sim = scenario.simulation(policy)
        apply = sim._apply

        def _apply(ds: Any) -> None:
            ds = list(ds)
            now = sim.clock.now()
            decisions.extend((now, type(d).__name__, d.call.id, getattr(d, "instance", None),
                              getattr(d, "priority", None)) for d in ds)
            apply(ds)

        sim._apply = _apply  # type: ignore[method-assign]
        result = scenario.run(sim)
        kv = sim.coordinator.loads.kv_used.tolist()  # settled: what any reader sees
    return record_rows(result) + [("kv", kv)], decisions, seen


@pytest.mark.parametrize("policy,tenants,faults,rate", [
    ("flowsage", False, False, 3.0), ("flowsage", False, False, 30.0),
    ("flowsage", True, False, 0.0), ("flowsage", False, True, 3.0),
    ("hexgen-flow", False, True, 30.0)])
def test_held_reports_make_the_decisions_of_eager_ones(policy: str, tenants: bool,
                                                      faults: bool, rate: float) -> None:
    eager, eager_decisions, none = _run(policy, True, tenants, faults, rate)
    held, held_decisions, seen = _run(policy, False, tenants, faults, rate)
    assert none["held"] == 0
    assert seen["held"] > 50 and seen["dropped at a finish"] > 0  # the path under test ran
    assert held_decisions == eager_decisions
    assert held == eager


def test_held_reports_are_priced_where_they_are_read() -> None:
    """Admissions into a full instance, the headroom gate, preemption and the dispatch room
    test read KV that held reports move: each of those settles exactly, not only the drop at
    a finish."""
    seen = Counter[str]()
    for tenants, rate in ((False, 30.0), (True, 0.0)):
        seen += _run("flowsage", False, tenants, False, rate)[2]
    assert seen["priced when read"] > 0
    assert seen["dispatch settled"] > 0


def test_a_fork_holds_its_own_reports() -> None:
    """A fork (what the alpha tuner replays forecasts on) copies the held reports with the
    queues: its settle functions are its own queues', so pricing them in the fork leaves the
    live run's held, and both price them to the same KV."""
    cluster = load_cluster("paper-4gpu")
    wl = build_workload(small_trace(), cluster, n=60, rate=30.0, seed=2)
    sim = Simulation(cluster, "hexgen-flow")
    checked = []

    def probe(s: Simulation) -> None:
        live = s.coordinator
        if not live.loads.kv_folded:
            return
        fork = s.fork().coordinator
        assert all(settle.__self__ is fork.queues[settle.__self__.name]
                   for settle in fork.loads.kv_folded.values())
        assert all(q.kv_at.__self__ is fork for q in fork.queues.values())
        held = len(live.loads.kv_folded)
        forked = fork.loads.kv_used.tolist()
        assert len(live.loads.kv_folded) == held  # the live run's reports still held
        assert forked == live.loads.kv_used.tolist()
        checked.append(held)

    for i in range(1, 40):
        sim.schedule_hook(0.5 * i, probe)
    sim.run(wl.queries, wl.arrivals, wl.deadlines(2.0), wl.idle_latency_s)
    assert len(checked) > 5
