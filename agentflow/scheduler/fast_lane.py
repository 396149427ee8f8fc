"""The fast lane: on the cluster's fastest instance, a tenant that another present tenant
comes before runs at most a few calls at once.

Why: class rank and fair shares order the *waiting* calls, and the headroom gate keeps room
while a better band has queries in flight — but a flood fills every instance's batch in the
pauses between a light tenant's queries, and when the light tenant's next query comes its
calls co-run with that batch wherever they go: each co-runner lengthens every decode step
(on a mixture-of-experts model the first few co-runners most, as each wakes more experts),
and stopping them is dearer than letting them finish (their whole prompt and output again).
On the tenant grid's mixed-qwen fairness cell the light tenant's long candidate calls ran on
the L40S or A40 beside 8-15 flood calls in 12-17 s, against 7-10 s alone on the H200, and its
P95 stayed 1.49x its P95 alone over 6 seeds. Reacting only while it is in flight (a cap
applied from its arrival) reached 1.35x: what the flood started before is still running.

So the cap holds for as long as the protected tenant is *present* (``TenantShares.
present_pairs``: in flight, or silent for less than a few of its own mean gaps between
queries), on one instance only: the fastest (the lowest expected time for a reference call,
ties by name), where a protected call would run best. A tenant *outranked* by a present one
(a better class is present, or one of its rank more than a quantum behind it in virtual
time) starts a call there only while it runs fewer than ``FAST_LANE_CALLS``; an instance
running nothing still admits one. Every other instance serves it as before, and with nobody
to protect nothing is held, so classless and single-tenant runs are unchanged. It is the one
place the scheduler holds capacity back for someone not yet asking: what it costs is the
flood's latency, not its throughput.

Measured on the tenant grid (``agentflow bench tenant_cells --fast-lane 1|2|4|off``, 9 cells x
6 seeds, then ``agentflow bench tenant_ratios``): the cells within their targets went from 39
of 54 (off) to 47 / 46 / 44 (caps 1 / 2 / 4), the geometric mean of P95 over alone from
1.184 to 1.127 / 1.131 / 1.145, mixed-qwen fairness from 1.492 to 1.215 / 1.245 / 1.319, at
0.971 / 0.987 / 0.999x of the flooding tenant's throughput (worst cell 0.932 / 0.971 /
0.991x). 2 is the default: nearly all of 1's gain for less than half its throughput cost.
Only on a cluster of two or more instances: on one, the lane would be the whole cluster.
"""

from __future__ import annotations

import argparse
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.instance import InstanceQueue

FAST_LANE_CALLS = 2  # calls an outranked tenant may run at once on the fast lane
# The call the instances are compared on: a schema-linking-sized prompt and answer.
REFERENCE_PROMPT, REFERENCE_OUTPUT = 1000, 100


def fast_lane_instance(coordinator: Any) -> str | None:
    """The fastest instance by the coordinator's time models (ties: the first by name);
    None for a cluster of one instance."""
    models = coordinator.time_models
    if len(models) < 2:
        return None
    fastest: str = min(models, key=lambda name: (
        models[name].expected_s(REFERENCE_PROMPT, REFERENCE_OUTPUT), name))
    return fastest


def check_fast_lane(value: int | None) -> int | None:
    """The setting: calls an outranked tenant may run on the lane (>= 1), or None (off)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"fast_lane must be a whole number of calls >= 1, or null for off; "
                         f"got {value!r}")
    return value


def parse_fast_lane(value: str) -> int | None:
    """A command line's ``N|off`` (argparse ``type=``): ``check_fast_lane``'s setting."""
    if value == "off":
        return None
    try:
        return check_fast_lane(int(value))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of calls >= 1 or 'off', got {value!r}") from None


class FastLane:
    """The lane's admission test, for the headroom gate (``scheduler.classes``)."""

    def __init__(self, coordinator: Any, calls: int):
        self._coordinator = coordinator
        self.calls = calls

    @cached_property
    def instance(self) -> str | None:
        """Chosen once, on first use: the time models exist by then (built after the
        gate) and dispatch has not yet taught them anything a run would make it drift on."""
        return fast_lane_instance(self._coordinator)

    def holds(self, queue: InstanceQueue, call: ScheduledCall) -> bool:
        """Whether ``call`` must wait: ``queue`` is the lane, its tenant is outranked by a
        present tenant, and already runs ``calls`` calls there."""
        if queue.name != self.instance:
            return False
        shares = self._coordinator.fairness
        key = shares.key(call.query)
        mine = sum(1 for c in queue.running if shares.key(c.query) == key)
        return mine >= self.calls and shares.outranked(key, self._coordinator.clock.now())
