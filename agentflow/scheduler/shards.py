"""Sharded coordinators: the fleet's instances split into K shards, each query routed to one.

One coordinator decides every call of the instances it owns; its per-decision cost grows
with that number (``scheduler.view``), and it runs on one core. K shards, each a full
``Coordinator`` over a share of the instances (its own queues, time models, length model,
view), decide in parallel: a query is routed once, at arrival, to one shard, and every call
of it is scheduled there. So a decision costs what it costs on a fleet K times smaller,
and K shards in K processes make ~K times the decisions per second.

What this costs in quality, and why this split and rule:

- ``split_instances`` is *stratified*: instances are grouped by kind (GPU, model, tensor
  parallelism, precision) and dealt round-robin, so every shard holds a share of every kind
  and is a small copy of the fleet. A shard of only slow GPUs would give its queries worse
  latency whatever the rule; a copy gives each query the same choice of speeds, just fewer
  instances of each.
- Routing (``ShardRouter``) is the only decision made without a shard's full view. ``p2c``
  (default) draws two shards and takes the one whose load summary (``ShardLoad``: seconds
  of work per up instance, from the shard's own ``work_vector``) is lower. Summaries are
  refreshed at most every ``summary_s`` (a remote shard publishes them; reading them per
  query would cost a round trip), and between refreshes the router counts what it sent
  each shard since (priced at that shard's work per query in flight), so a burst does not
  all go to the shard that looked idle at the last refresh. ``hash`` (the query id's CRC
  mod K) reads nothing: the baseline that shows what the summaries buy. ``least`` takes
  the lowest of all K.
- Lost: dispatch across shards (a query's calls never move to another shard's idle
  instance) and the fleet-wide tenant shares (each shard keeps its own, over its queries).

``ShardedCoordinator`` drives K coordinators in one process behind the event methods the
simulator calls on one (``agentflow.sim.Simulation(coordinators=K)``), and times each
shard's share of the work, which is what K processes would run in parallel. Serving's
sharded router (``agentflow.scheduler.shard_router``) routes with the same ``ShardRouter``.
"""

from __future__ import annotations

import itertools
import math
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from agentflow.scheduler.decisions import Decision

if TYPE_CHECKING:
    from agentflow.config import InstanceConfig
    from agentflow.scheduler.call import QueryState, ScheduledCall
    from agentflow.scheduler.coordinator import Coordinator
    from agentflow.scheduler.instance import InstanceQueue
    from agentflow.scheduler.lengths import LengthModel, TrueLengths
    from agentflow.workflow.clock import Clock

ROUTES = ("p2c", "least", "hash")
DEFAULT_ROUTE = "p2c"
# Longest age of the load summaries the router reads (seconds): what a remote shard's
# periodic report would be, at most.
SUMMARY_S = 0.5

T = TypeVar("T")


def instance_kind(cfg: InstanceConfig) -> tuple[Any, ...]:
    """What makes two instances interchangeable for the split: same GPU, model, tensor
    parallelism and precision."""
    return (cfg.gpu or "", cfg.model or "", cfg.tensor_parallel, cfg.weight_bits or 0,
            cfg.kv_bits or 0)


def check_shards(k: int, instances: int) -> int:
    """``k`` if it can split ``instances`` instances (every shard needs one), else a
    ValueError saying why."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"the number of shards must be a whole number >= 1, got {k!r}")
    if k > instances:
        raise ValueError(f"{k} shards need at least {k} instances; this cluster has "
                         f"{instances}")
    return k


def split_instances(items: Sequence[T], k: int,
                    kind: Callable[[T], Any] = lambda item: item) -> list[list[T]]:
    """``items`` dealt into ``k`` shards, stratified by ``kind``: the kinds one after another
    (each kind's items in their given order), dealt round-robin without restarting at each
    kind, so each shard gets ``n_kind / k`` of every kind (give or take one) and shard sizes
    differ by at most one. Deterministic: the same cluster splits the same way."""
    check_shards(k, len(items))
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(kind(item), []).append(item)
    shards: list[list[T]] = [[] for _ in range(k)]
    i = 0
    for key in sorted(groups, key=repr):
        for item in groups[key]:
            shards[i % k].append(item)
            i += 1
    return shards


@dataclass(frozen=True)
class ShardLoad:
    """What a shard tells the router: its up instances and the seconds of work they hold
    (waiting and running calls, as the shard's time models price them)."""

    up: int
    work_s: float
    queries: int = 0

    @property
    def per_instance_s(self) -> float:
        """Seconds until a typical instance of the shard is free (inf: none is up)."""
        return self.work_s / self.up if self.up else math.inf


def coordinator_load(coordinator: Coordinator, now: float) -> ShardLoad:
    """A shard's ``ShardLoad`` from its coordinator's own view."""
    up = [coordinator._index[n] for n, q in coordinator.queues.items() if q.up]
    work = coordinator.work_vector(now)
    return ShardLoad(up=len(up), work_s=float(np.sum(work[up])) if up else 0.0,
                     queries=len(coordinator.queries))


class ShardRouter:
    """Which shard a query goes to (see the module docstring for the rules).

    ``loads()`` returns every shard's ``ShardLoad``; it is read at most every ``summary_s``
    of ``now``. Between two reads the router counts the queries it sent each shard and
    prices each at that shard's work per query in flight at the last read, so a burst
    spreads instead of piling onto the shard that looked idlest. Deterministic: ``p2c``'s
    two draws come from the query id, so a replay routes the same way. A small interface
    on purpose: several front ends may each route with one of these to the same shards."""

    def __init__(self, k: int, loads: Callable[[], Sequence[ShardLoad]], *,
                 rule: str = DEFAULT_ROUTE, summary_s: float = SUMMARY_S):
        if rule not in ROUTES:
            raise ValueError(f"unknown shard routing rule {rule!r}; choose from "
                             f"{', '.join(ROUTES)}")
        if summary_s < 0:
            raise ValueError("summary_s must be >= 0")
        self.k = k
        self.rule = rule
        self.summary_s = summary_s
        self._loads = loads
        self._summary: list[ShardLoad] = []
        self._summary_at = -math.inf
        self._sent = [0] * k  # queries routed to each shard since the summary
        self.routed = [0] * k  # queries routed to each shard so far

    def pick(self, query_id: str, now: float) -> int:
        if self.k == 1:
            choice = 0
        elif self.rule == "hash":
            choice = zlib.crc32(query_id.encode()) % self.k
        else:
            scores = self.scores(now)
            if self.rule == "least":
                choice = int(np.argmin(scores))
            else:
                a, b = _two(query_id, self.k)
                choice = a if scores[a] <= scores[b] else b
        self._sent[choice] += 1
        self.routed[choice] += 1
        return choice

    def scores(self, now: float) -> list[float]:
        """Each shard's expected seconds of work per up instance: its last summary plus the
        queries sent to it since (inf: no instance up)."""
        if not self._summary or now - self._summary_at >= self.summary_s:
            self._summary = list(self._loads())
            if len(self._summary) != self.k:
                raise ValueError(f"{len(self._summary)} load summaries for {self.k} shards")
            self._summary_at = now
            self._sent = [0] * self.k
        out = []
        for s, sent in zip(self._summary, self._sent):
            per_query = s.work_s / s.queries if s.queries else 0.0
            # a tiny count term breaks ties between idle shards by what was sent since
            out.append((s.work_s + sent * per_query) / s.up + 1e-9 * sent if s.up
                       else math.inf)
        return out


def _two(query_id: str, k: int) -> tuple[int, int]:
    """Two distinct shards drawn from the query id (stable across runs and processes)."""
    h = zlib.crc32(query_id.encode())
    a = h % k
    b = (a + 1 + (h // k) % (k - 1)) % k
    return a, b


class _Weights:
    """``fairness.set_weights`` for every shard (a tenant's weight holds in each)."""

    def __init__(self, shards: Sequence[Coordinator]):
        self._shards = shards

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        for shard in self._shards:
            shard.fairness.set_weights(weights)


class ShardedCoordinator:
    """K coordinators in one process behind one coordinator's event methods.

    Each query is routed at arrival (``ShardRouter``); its calls' events go to its shard,
    an instance's events to the shard that owns it. Every event a shard handles is timed in
    CPU seconds (``busy_s``, ``events``; ``time.process_time``, so other processes on a busy
    machine do not count): K shards in K processes would each run only their own share,
    so ``max(busy_s)`` is what the fleet's decisions would take in parallel."""

    def __init__(self, shards: Sequence[Coordinator], *, rule: str = DEFAULT_ROUTE,
                 summary_s: float = SUMMARY_S):
        if not shards:
            raise ValueError("no shards")
        self.shards = list(shards)
        self.clock = self.shards[0].clock
        self.owner: dict[str, int] = {}
        self.queues: dict[str, InstanceQueue] = {}
        # One call-id sequence for all: the runtime keys calls (and engine requests) by id,
        # so two shards' "c0" must not meet (one shard numbers as the plain coordinator).
        ids = itertools.count()
        for i, shard in enumerate(self.shards):
            shard._ids = ids
            for name, queue in shard.queues.items():
                if name in self.owner:
                    raise ValueError(f"instance {name} is in two shards")
                self.owner[name] = i
                self.queues[name] = queue
        self.router = ShardRouter(len(self.shards), self.loads, rule=rule,
                                  summary_s=summary_s)
        self.route: dict[str, int] = {}  # query id -> its shard, while it is in flight
        self.busy_s = [0.0] * len(self.shards)
        self.events = [0] * len(self.shards)
        self.fairness = _Weights(self.shards)

    # ------------------------------------------------------------------ what shards share
    @property
    def preemption(self) -> str | None:
        return self.shards[0].preemption

    @property
    def slo_classes(self) -> Mapping[str, Any]:
        return self.shards[0].slo_classes

    @slo_classes.setter
    def slo_classes(self, value: Mapping[str, Any]) -> None:
        for shard in self.shards:
            shard.slo_classes = value

    @property
    def deadline_admission(self) -> str | None:
        return self.shards[0].deadline_admission

    @deadline_admission.setter
    def deadline_admission(self, value: str | None) -> None:
        for shard in self.shards:
            shard.deadline_admission = value

    @property
    def preempted_calls(self) -> int:
        return sum(s.preempted_calls for s in self.shards)

    @property
    def queries(self) -> dict[str, QueryState]:
        return {qid: q for s in self.shards for qid, q in s.queries.items()}

    def loads(self) -> list[ShardLoad]:
        now = self.clock.now()
        return [coordinator_load(s, now) for s in self.shards]

    def can_preempt(self) -> bool:
        return any(s.can_preempt() for s in self.shards)

    # ------------------------------------------------------------------ events
    def _timed(self, i: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            self.busy_s[i] += time.process_time() - start
            self.events[i] += 1

    def _of_call(self, call: ScheduledCall) -> int:
        i = self.route.get(call.query.id)
        if i is None or self.shards[i].queries.get(call.query.id) is not call.query:
            # its query has left (a late report): the shard of its instance decides
            return self.owner[call.instance] if call.instance is not None else 0
        return i

    def on_query_arrival(self, query_id: str, **kwargs: Any) -> QueryState:
        """Route the query (its shards' up instances and load), then admit it there; a
        shard without an up instance is never chosen while another has one."""
        now = self.clock.now()
        i = self.router.pick(query_id, now)
        if not self.shards[i].up_instances:
            live = [j for j, s in enumerate(self.shards) if s.up_instances]
            if live:
                i = min(live, key=lambda j: coordinator_load(self.shards[j], now)
                        .per_instance_s)
        state: QueryState = self._timed(i, self.shards[i].on_query_arrival, query_id,
                                        **kwargs)
        self.route[query_id] = i
        return state

    def on_call_ready(self, query_id: str, **kwargs: Any
                      ) -> tuple[ScheduledCall, list[Decision]]:
        i = self.route[query_id]
        out: tuple[ScheduledCall, list[Decision]] = self._timed(
            i, self.shards[i].on_call_ready, query_id, **kwargs)
        return out

    def on_call_progress(self, call: ScheduledCall, output_tokens: int) -> list[Decision]:
        i = self._of_call(call)
        out: list[Decision] = self._timed(i, self.shards[i].on_call_progress, call,
                                          output_tokens)
        return out

    def on_call_done(self, call: ScheduledCall, **kwargs: Any) -> list[Decision]:
        i = self._of_call(call)
        out: list[Decision] = self._timed(i, self.shards[i].on_call_done, call, **kwargs)
        return out

    def on_call_failed(self, call: ScheduledCall, reason: str, **kwargs: Any
                       ) -> list[Decision]:
        i = self._of_call(call)
        out: list[Decision] = self._timed(i, self.shards[i].on_call_failed, call, reason,
                                          **kwargs)
        return out

    def on_call_cancelled(self, call: ScheduledCall, **kwargs: Any) -> list[Decision]:
        i = self._of_call(call)
        out: list[Decision] = self._timed(i, self.shards[i].on_call_cancelled, call,
                                          **kwargs)
        return out

    def on_instance_down(self, name: str) -> list[Decision]:
        i = self.owner[name]
        out: list[Decision] = self._timed(i, self.shards[i].on_instance_down, name)
        return out

    def on_instance_up(self, name: str) -> list[Decision]:
        i = self.owner[name]
        out: list[Decision] = self._timed(i, self.shards[i].on_instance_up, name)
        return out

    def settle_paths(self, query_id: str) -> None:
        """``Coordinator.settle_paths`` on the query's shard (none once it has left)."""
        i = self.route.get(query_id)
        if i is not None:
            self.shards[i].settle_paths(query_id)

    def on_query_done(self, query_id: str) -> None:
        i = self.route.pop(query_id, None)
        if i is not None:
            self._timed(i, self.shards[i].on_query_done, query_id)

    def cancel_query(self, query_id: str, **kwargs: Any
                     ) -> tuple[list[ScheduledCall], list[Decision]]:
        i = self.route.get(query_id)
        if i is None:
            return [], []
        out: tuple[list[ScheduledCall], list[Decision]] = self._timed(
            i, self.shards[i].cancel_query, query_id, **kwargs)
        self.route.pop(query_id, None)
        return out

    # ------------------------------------------------------------------ measurement
    def decision_figures(self) -> dict[str, Any]:
        """Events each shard handled and the CPU seconds they took; ``parallel_s``: the
        busiest shard's seconds, what K shards in K processes would take for them all."""
        events = sum(self.events)
        parallel = max(self.busy_s) if self.busy_s else 0.0
        return {"shards": len(self.shards), "events": list(self.events),
                "busy_s": [round(b, 4) for b in self.busy_s],
                "us_per_event": [round(1e6 * b / e, 2) if e else None
                                 for b, e in zip(self.busy_s, self.events)],
                "parallel_s": round(parallel, 4),
                "events_per_s": round(events / parallel, 1) if parallel > 0 else None,
                "routed": list(self.router.routed)}


class ShardLengths:
    """What the simulator tells the length model (``reveal``, ``forget``), for every shard's
    own model: a query's shard is chosen only at its arrival, after its reveal."""

    def __init__(self, models: Sequence[LengthModel]):
        self.models = list(models)

    def reveal(self, query_id: str, lengths: Mapping[str, TrueLengths]) -> None:
        for model in self.models:
            model.reveal(query_id, lengths)

    def forget(self, query_id: str) -> None:
        for model in self.models:
            model.forget(query_id)


def build_sharded(instances: Sequence[InstanceConfig], k: int, *, clock: Clock, policy: str,
                  embedder: str = "hashing", rule: str = DEFAULT_ROUTE,
                  summary_s: float = SUMMARY_S, **settings: Any
                  ) -> tuple[ShardedCoordinator, ShardLengths]:
    """K coordinators over a stratified split of ``instances`` (named), each with its own
    length model (``embedder``) and ``build_coordinator``'s ``settings``."""
    from agentflow.scheduler.lengths import make_length_model
    from agentflow.scheduler.policies import parse_policy
    from agentflow.scheduler.setup import build_coordinator

    parts = split_instances(list(instances), k, kind=instance_kind)
    models = [make_length_model(parse_policy(policy).length_model, embedder=embedder)
              for _ in parts]
    shards = [build_coordinator(part, clock=clock, policy=policy, length_model=model,
                                **settings) for part, model in zip(parts, models)]
    return ShardedCoordinator(shards, rule=rule, summary_s=summary_s), ShardLengths(models)
