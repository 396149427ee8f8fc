"""Policy interfaces. A dispatch policy picks an instance for a ready call; a queue policy
orders the calls waiting on one instance. Both read the cluster through ``SchedulerView``
(implemented by the coordinator, see ``scheduler.view``), so they hold no state about calls
themselves."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

    from agentflow.scheduler.call import QueryState, ScheduledCall
    from agentflow.scheduler.distribution import Distribution
    from agentflow.scheduler.ranking import Key


@dataclass(frozen=True)
class BatchView:
    """What dispatch to a continuous-batching engine needs to know, one entry per candidate
    instance (``SchedulerView.batch_view``): seconds of calls waiting in its queue
    (``queued_s``), of prompt prefill admitted there but not yet done (``prefilling_s``) and
    left on the calls it runs (``running_s``), in single-request time; how many it runs
    (``n_running``) of at most ``slots``; whether it has a slot and KV room for the call now
    (``room``); the call's expected time there (``time_s``) and the part of it that is prompt
    prefill (``prefill_s``); the decode seconds the call gains, and inflicts, per call running
    beside it (``co_runner_decode_s``, learned) and the co-runners ``time_s`` already assumes
    (``co_runners_seen``); and the rank of the instance's name (ties)."""

    queued_s: np.ndarray
    prefilling_s: np.ndarray
    running_s: np.ndarray
    n_running: np.ndarray
    room: np.ndarray
    slots: np.ndarray
    time_s: np.ndarray
    prefill_s: np.ndarray
    co_runner_decode_s: np.ndarray
    co_runners_seen: np.ndarray
    # The call's time there with no co-runner (decode at the profile's solo rate, or the
    # learned one where that is faster): the floor of the co-runner correction.
    solo_s: np.ndarray
    name_rank: np.ndarray
    # Under class ranking (``scheduler.classes``): per instance, the running calls of the
    # call's band or a better one — the co-runners whose delay counts against admitting it;
    # None: every running call counts.
    n_peers: np.ndarray | None = None


class SchedulerView(Protocol):
    def expected_s(self, call: ScheduledCall, instance: str) -> float:
        """Expected run time of ``call`` on ``instance`` (mean over its length distribution)."""

    def outstanding_work(self, instance: str, now: float) -> float:
        """``W_i``: expected seconds of work waiting and still running on ``instance``."""

    def dispatch_view(self, call: ScheduledCall, instances: list[str], now: float
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(``W_i``, ``t(call, i)``, rank of the instance's name) for each of ``instances``,
        as arrays aligned with the list (vectorised, so dispatch cost barely grows with the
        cluster)."""

    def batch_view(self, call: ScheduledCall, instances: list[str], now: float
                   ) -> BatchView:
        """Queue, batch and KV state of each of ``instances`` and the call's times there
        (``BatchView``), vectorised like ``dispatch_view``."""

    def prefix_saved_s(self, call: ScheduledCall, instances: list[str]) -> np.ndarray:
        """Expected prefill seconds ``call`` skips on each instance thanks to the prompt
        prefix the router-side index believes it holds (zeros without prompt text)."""

    def downstream_s(self, call: ScheduledCall, now: float) -> float:
        """Expected seconds of the query's critical path after this call's stage."""

    def remaining_s(self, query: QueryState, now: float) -> float:
        """Expected seconds left on the query's whole remaining critical path."""

    def remaining_cost(self, query: QueryState) -> Distribution:
        """Distribution of the query's remaining workflow cost (sum of its calls' costs)."""

    def call_cost(self, call: ScheduledCall) -> Distribution:
        """Distribution of this call's cost ``O^2/2 + I*O``."""


class DispatchPolicy(abc.ABC):
    name = "dispatch"

    @abc.abstractmethod
    def choose(self, call: ScheduledCall, instances: list[str], now: float,
               view: SchedulerView) -> str:
        """One of ``instances`` (never empty, all up) for ``call``."""


class QueuePolicy(abc.ABC):
    """Orders one instance's waiting calls.

    ``rank`` returns the call's key as ``ranking.Segment``s (tier, then ``a - s * now``,
    smaller first, ties to the older call), computed when the call is enqueued or its query
    changes — so a key may move with time only along a line and switch tier at known
    instants, which is what lets ``InstanceQueue`` pick the next call in O(log n)."""

    name = "queue"
    # Whether keys read the query's state (critical paths, work left): then the coordinator
    # keeps those current and re-keys the query's waiting calls at each of its events.
    query_dependent = True
    # Whether a key depends on the query only (not on which of its calls): then a queue ranks
    # one entry per query, and a query event re-keys that entry once, not every call.
    per_query = False

    @abc.abstractmethod
    def rank(self, call: ScheduledCall, now: float, view: SchedulerView) -> Key:
        """The call's key from ``now`` until its query's next event."""

    def key(self, call: ScheduledCall, now: float, view: SchedulerView) -> tuple[int, float]:
        """(tier, value) of a freshly computed key at ``now`` (for inspection and tests)."""
        from agentflow.scheduler.ranking import key_at

        return key_at(self.rank(call, now, view), now)


def budget_and_urgency(call: ScheduledCall, now: float, view: SchedulerView
                       ) -> tuple[float, float] | None:
    """HexGen-Flow's per-stage budget and urgency, or None without a deadline.

    The query's remaining time is split over its remaining critical path in proportion to
    this stage's expected time: ``budget = (D - now) * t / (t + downstream)``, and
    ``urgency = t - budget`` (higher is more urgent). Both move as the workflow advances:
    a slow early stage shrinks every later stage's budget.
    """
    if call.deadline is None:
        return None
    t, share = stage_share(call, now, view)
    budget = (call.deadline - now) * share
    return budget, t - budget


def stage_share(call: ScheduledCall, now: float, view: SchedulerView) -> tuple[float, float]:
    """(t, share): the call's expected time on its instance and ``t / (t + downstream)``."""
    t = view.expected_s(call, call.instance) if call.instance else 0.0
    downstream = view.downstream_s(call, now)
    share = t / (t + downstream) if t + downstream > 0 else 1.0
    return t, share
