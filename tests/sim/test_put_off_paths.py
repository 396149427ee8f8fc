"""A progress report's critical-path pass, put off until something reads the paths
(``WorkflowPaths._defer_paths``), changes no result: whole simulations with it and with
every pass made eagerly give the same records to the last float — under load (calls wait,
so some passes cannot be put off), with tool steps (the driver settles a put-off pass
before it moves a run itself), two tenants with preemption (victims are priced from other
queries' paths between their events) and an instance that goes down (its calls are
re-dispatched, ranked from paths a report put off)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from agentflow.scheduler.paths import WorkflowPaths
from tests.sim.scenarios import record_rows, small_scenario


@contextmanager
def counting(eager: bool) -> Iterator[Counter[str]]:
    """Count put-off passes and the ones made when read; ``eager``: put none off."""
    seen: Counter[str] = Counter()
    defer, settle = WorkflowPaths._defer_paths, WorkflowPaths._settle

    def _defer(self, query, now, stamp):  # type: ignore[no-untyped-def]
        if eager:
            return False
        out = defer(self, query, now, stamp)
        seen["put off"] += out
        return out

    def _settle(self, query):  # type: ignore[no-untyped-def]
        seen["made when read"] += query.paths_due is not None
        settle(self, query)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(WorkflowPaths, "_defer_paths", _defer)
        mp.setattr(WorkflowPaths, "_settle", _settle)
        yield seen


def _records(policy: str, eager: bool, tenants: bool, faults: bool
             ) -> tuple[list[tuple], Counter[str]]:
    scenario = small_scenario(tenants, faults)
    with counting(eager) as seen:
        result = scenario.run(scenario.simulation(policy))
    return record_rows(result), seen


@pytest.mark.parametrize("policy,tenants,faults", [
    ("flowsage", False, False), ("flowsage", True, False), ("flowsage", False, True),
    ("hexgen-flow", False, True), ("llf", True, False)])
def test_put_off_passes_give_the_records_of_eager_ones(policy: str, tenants: bool,
                                                       faults: bool) -> None:
    eager, none = _records(policy, True, tenants, faults)
    lazy, seen = _records(policy, False, tenants, faults)
    assert none["put off"] == 0
    assert seen["put off"] > 50  # the path under test ran
    assert lazy == eager
    assert all(row[1] in ("done", "failed", "rejected") for row in lazy[:-1])


def test_some_put_off_pass_is_read_before_the_next_event() -> None:
    """Tool steps, preemption and re-dispatch read paths a report put off: the exact
    materialisation is exercised, not only the overwrite by the next event's pass."""
    made = Counter[str]()
    for tenants, faults in ((False, True), (True, False)):
        made += _records("flowsage", False, tenants, faults)[1]
    assert made["made when read"] > 0
