"""The event loop collects garbage less often (``driver._fewer_collections``) and leaves the
collector as it found it: thresholds back, its own freeze undone, a freeze made by someone
else (a server that froze its heap before forking) left in place."""

from __future__ import annotations

import gc

import pytest

from agentflow.sim import driver
from agentflow.sim.driver import GC_YOUNG_THRESHOLD, _fewer_collections


@pytest.fixture(autouse=True)
def _collector_as_found():
    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)


def test_thresholds_rise_inside_and_come_back() -> None:
    gc.set_threshold(700, 10, 10)
    with _fewer_collections():
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0  # what existed at the start is out of the walks
        with _fewer_collections():  # nested (a forked simulation drained by a hook)
            assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0


def test_a_freeze_made_elsewhere_is_left_alone() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with _fewer_collections():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_a_drain_runs_inside_it(monkeypatch) -> None:
    seen = []

    def drained(self) -> None:
        seen.append(gc.get_threshold()[0])

    monkeypatch.setattr(driver.Simulation, "_drain", drained)
    sim = object.__new__(driver.Simulation)
    gc.set_threshold(700, 10, 10)
    sim.drain()
    assert seen == [GC_YOUNG_THRESHOLD] and gc.get_threshold()[0] == 700


def test_drains_overlapping_in_threads_restore_what_the_first_found() -> None:
    """A leaves before B: the thresholds stay raised until B leaves too, then come back to
    what A found (B alone would have found A's raised ones and put those back)."""
    import threading

    gc.set_threshold(700, 10, 10)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a() -> None:
        with _fewer_collections():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b() -> None:
        a_in.wait(5)
        with _fewer_collections():
            b_in.set()
            a_out.wait(5)
            seen["after_a"] = gc.get_threshold()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen["after_a"] == (GC_YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (700, 10, 10) and gc.get_freeze_count() == 0
