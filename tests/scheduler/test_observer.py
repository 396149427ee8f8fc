"""Observer wrapping is explicit (``@observed`` on each event): the events observers see are
exactly ``Coordinator.EVENTS``, and an event that raises is still reported as finished."""

from __future__ import annotations

import inspect

import pytest

from agentflow.scheduler import Coordinator, QueryRejected
from tests.scheduler.utils import coordinator


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple] = []

    def event_started(self, event: str) -> None:
        self.lines.append(("start", event))

    def event_finished(self, event: str, decisions: list) -> None:
        self.lines.append(("end", event, len(decisions)))


def test_the_observed_methods_are_exactly_the_listed_events() -> None:
    wrapped = {name for name, fn in inspect.getmembers(Coordinator, inspect.isfunction)
               if hasattr(fn, "__wrapped__")}
    assert wrapped == set(Coordinator.EVENTS)
    # the wrapper keeps the event's signature and docstring for readers and tools
    assert "output_tokens" in inspect.signature(Coordinator.on_call_done).parameters
    assert Coordinator.on_call_failed.__doc__.startswith("A call failed")


def test_an_event_that_raises_is_reported_finished_with_no_decisions() -> None:
    c = coordinator("least_loaded+fcfs", {"s": 1}, max_active_queries=1)
    log = Log()
    c.add_observer(log)
    c.on_query_arrival("q1", deadline=None)
    with pytest.raises(QueryRejected, match="overloaded"):
        c.on_query_arrival("q2", deadline=None)
    assert log.lines == [("start", "on_query_arrival"), ("end", "on_query_arrival", 0),
                         ("start", "on_query_arrival"), ("end", "on_query_arrival", 0)]


def test_observing_does_not_change_the_decisions() -> None:
    watched, plain = (coordinator("least_loaded+fcfs", {"s": 1}) for _ in range(2))
    watched.add_observer(Log())
    for c in (watched, plain):
        c.on_query_arrival("q", deadline=None)
    (_, with_obs), (_, without) = (c.on_call_ready("q", stage="s", node_id="a", prompt_tokens=0)
                                   for c in (watched, plain))
    assert [(type(d).__name__, d.instance) for d in with_obs] == [
        (type(d).__name__, d.instance) for d in without] == [("StartCall", "fast")]
