"""Lost queries (issue 38): a query whose probability of meeting its deadline has fallen to
at most ``LOST_MEET`` gets no capacity that a query still savable could use — in the queue
(``FlowSageQueue(lost_meet=...)``: ranked behind every savable query, as if it had no
deadline) and in the admission hold (``savable_running``: no prompt waits to spare a lost
query's decode). ``flowsage`` as shipped has it off; ``register()`` adds the queue and preset
``flowsage-savable`` (marginal_delay + it) to this process's registry, as the benchmarks that
measure it do (``bench queue_choice``, ``bench light_load``). Not shipped: measured at the
saturation points it meets more deadlines than flowsage and costs the P95 (paper-4gpu
x1.028; docs/scheduler.md, "Where the queue order acts"), so it is an experiment's option,
which the product's ``--help`` does not list.

The rule, stated before it was measured (notes, requests.md, stop 54):

* Flowsage reads a query's remaining path as a normal law, so its chance of meeting the
  deadline is ``Phi(z)``, ``z = (D - now - R) / sigma``, and it serves the lowest ``z``
  first: the query most likely to miss. A second of service moves that chance by
  ``phi(z) / sigma`` — 0.399 / sigma at z = 0, 0.048 / sigma at |z| = 2.05 — and it falls on
  *both* sides of 0: past some point the query served first is the one a second helps least.
  Swapping two queries (equal spreads, equal service) raises the expected deadlines met when
  the one moved ahead has the smaller ``|z|``.
* The bound mirrors the one the project already uses for a decided outcome: the admission
  hold calls a query *safe* (it needs nothing) at a miss probability of at most
  ``risk.HOLD_SAFE`` = 0.02; here a query is *lost* at a meet probability of at most 0.02
  (z <= -2.054). Any query it is moved behind that is not more decided than it (|z| <
  2.054) gains more from the capacity; a query beyond its deadline with 98% probability adds
  to the P95 only as the tail it is already in. One value, not fitted to a trace.
* Outside the queue the same reading: the hold (``risk.hold_for_rank``, gatecut's) makes a
  safe prompt wait so that the calls decoding beside it are spared its prefill chunks;
  sparing a lost query's decode buys neither a deadline nor the P95, so the hold reads the
  instance's running calls without them. A lost query's own prompt is never held (it is
  never safe), as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from agentflow.scheduler.policies.queue_flowsage import LOST_MEET, FlowSageQueue, lost_z
from agentflow.scheduler.risk import deadline_z

if TYPE_CHECKING:
    from agentflow.scheduler.call import QueryState, ScheduledCall

__all__ = ["LOST_MEET", "NAME", "SavableRunning", "is_lost", "lost_z", "lost_z_of", "register",
           "savable_running"]

NAME = "flowsage-savable"
_FACTORY = partial(FlowSageQueue, lost_meet=LOST_MEET)  # one object: registering is idempotent


def register() -> None:
    """Add the queue ``flowsage-savable`` and the preset of that name (marginal_delay + it)
    to this process's policy registry; again: a no-op."""
    from agentflow.scheduler import policies

    policies.register_queue(NAME, _FACTORY)
    policies.PRESETS.setdefault(NAME, ("marginal_delay", NAME))


def lost_z_of(coordinator: Any) -> float | None:
    """The z bound of the coordinator's queue policy when it ranks lost queries behind
    (``FlowSageQueue(lost_meet=...)``, through the class ranking's wrapper), else None."""
    queue = getattr(coordinator, "_queue_policy", None)
    meet = getattr(queue, "lost_meet", None) if queue is not None else None
    return None if meet is None else lost_z(meet)


def is_lost(coordinator: Any, query: QueryState, now: float, z_bound: float) -> bool:
    """Whether ``query``'s deadline is lost at ``now``: z at or below ``z_bound`` (a query
    without a deadline never is)."""
    if query.deadline is None:
        return False
    return deadline_z(coordinator, query, now) <= z_bound


class SavableRunning:
    """An instance queue as the admission hold reads it (``risk.RunningQueue``: its name
    and running calls), without the running calls of lost queries."""

    __slots__ = ("name", "running")

    def __init__(self, name: str, running: list[ScheduledCall]):
        self.name = name
        self.running: Iterable[ScheduledCall] = running


def savable_running(coordinator: Any, queue: Any, now: float, z_bound: float) -> Any:
    """``queue`` itself when none of its running calls is of a lost query, else a
    ``SavableRunning`` view without them."""
    running = list(queue.running)
    kept = [r for r in running if not is_lost(coordinator, r.query, now, z_bound)]
    if len(kept) == len(running):
        return queue
    return SavableRunning(queue.name, kept)
