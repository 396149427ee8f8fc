"""Decisions are the same as before the per-decision work was cut (lazy re-placement of
re-keyed queue entries, lines moved in place in the kinetic tournament, invalidation walks
that stop early, a critical-path DP that sums each stage's chain once, ``marginal_delay``'s
price computed in one pass by the view instead of from a ``BatchView``).

``ReferenceCoordinator`` runs every instance queue as it was (``ReferenceQueue``: a re-key
re-places its entry at once, by removing it and inserting it again; ``ReferenceTournament``:
every invalidation walks to the root) and the per-edge DP, kept here verbatim. Seeded event
sequences go through both and every decision must be the same: the replay of
``test_view_rows`` for every preset (arrivals with classes and tenants, progress, failures,
instances down and up, cancels), its peer-group cluster, and the benchmark's own workload on
a 64-instance fleet, where one query's event re-keys its calls on a dozen instances. The fast
queue is also checked against its O(n) reference scan at every pick.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from agentflow.bench.scheduler import scheduler_overhead
from agentflow.scheduler import PRESETS, Coordinator
from agentflow.scheduler.instance import InstanceQueue
from agentflow.scheduler.policies.dispatch_marginal_delay import MarginalDelayDispatch
from agentflow.scheduler.ranking import KineticTournament, next_switch, segment_at
from agentflow.workflow.graph import NodeKind
from tests.scheduler.test_view_rows import PEER_SPECS, SPECS, replay

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

    def rekey_query(self, call, now, key):  # through ``_rank`` below, as it was
        self.rekey(call, now, None, key)

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
            heapq.heappush(self._timers, (switch, entry.seq, entry.version,
                                          next(self._timer_pushes), entry))


class ReferenceCoordinator(Coordinator):
    marginal_price = None  # marginal_delay prices from ``batch_view``, term by term, as it did

    def __init__(self, instances, **kw):
        super().__init__(instances, **kw)
        for q in self.queues.values():  # before any event: nothing is queued yet
            q.__class__ = ReferenceQueue

    # the critical-path DP as it was: per edge, a child's time plus its chain after it
    def _critical_paths(self, query, now, coefs=None, prompts=None):
        run = query.run
        assert run is not None  # callers compute paths only for queries with a workflow
        graph = run.graph
        shape = len(graph)  # the graph only grows, and only by new nodes (expansions)
        if query.topo is None or query.topo[0] != shape:
            import networkx as nx

            order = list(nx.topological_sort(graph))
            query.topo = (shape, [(n, run.node(n), list(graph.successors(n)))
                                  for n in reversed(order)])
        _, reverse_order = query.topo
        oh, pf, df = self._mean_coefs() if coefs is None else coefs
        calls = {c.node_id: c for c in query.calls}
        done = query.done_nodes
        state_of = run.state  # a WorkflowRun, or a shard's mirror of one
        pending, running, llm = run.PENDING, run.RUNNING, NodeKind.LLM
        rem: dict[str, tuple[float, float, float]] = {}
        after: dict[str | None, float] = {}
        after_lo: dict[str, float] = {}
        after_hi: dict[str, float] = {}
        total = total_lo = total_hi = work = 0.0
        finished = 0
        prompt: float
        for n, node, succ in reverse_order:
            state = state_of(n)
            if (state != pending and state != running) or n in done:
                finished += 1
                continue
            if node.kind == llm:
                call = calls.get(n)
                if call is not None and call.length_summary is not None:  # the common case
                    prompt, (mean, lo, hi) = call.prompt_tokens, call.length_summary
                else:
                    prompt, (mean, lo, hi) = self._stage_lengths(query, node, call, prompts)
                base = oh + prompt * pf
                t, t_lo, t_hi = base + mean * df, base + lo * df, base + hi * df
                work += t
            else:
                t = t_lo = t_hi = self._tool_time(query, node)
            if state == running:
                started = run.started_at(n)
                if started is not None:
                    elapsed = now - started
                    t = max(0.0, t - elapsed)
                    t_lo = max(0.0, t_lo - elapsed)
                    t_hi = max(0.0, t_hi - elapsed)
            rem[n] = (t, t_lo, t_hi)
            best = best_lo = best_hi = 0.0
            for child in succ:
                r = rem.get(child)
                if r is not None:
                    v = r[0] + after[child]
                    if v > best:
                        best = v
                    v = r[1] + after_lo[child]
                    if v > best_lo:
                        best_lo = v
                    v = r[2] + after_hi[child]
                    if v > best_hi:
                        best_hi = v
            after[n], after_lo[n], after_hi[n] = best, best_lo, best_hi
            if t + best > total:
                total = t + best
            if t_lo + best_lo > total_lo:
                total_lo = t_lo + best_lo
            if t_hi + best_hi > total_hi:
                total_hi = t_hi + best_hi
        if finished:  # drop the finished stages: every later pass would skip them again
            query.topo = (shape, [(n, node, [c for c in succ if c in rem])
                                  for n, node, succ in reverse_order if n in rem])
        after[None] = total
        query.path_cache = after
        query.path_lo, query.path_hi, query.work_left = total_lo, total_hi, work
        query.paths_stamp = self._paths_stamp(query)
        query.paths_due = None


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


@pytest.mark.parametrize("policy", ["flowsage", "hexgen-flow"])
def test_the_paths_are_the_floats_of_the_per_edge_dp(policy):
    """After every replay event, every query's paths by the DP as it is and as it was."""
    compared = []

    def both(c: Coordinator) -> None:
        now = c.clock.now()
        for query in c.queries.values():
            if query.run is None:
                continue
            ReferenceCoordinator._critical_paths(c, query, now)
            old = (dict(query.path_cache), query.path_lo, query.path_hi, query.work_left)
            Coordinator._critical_paths(c, query, now)
            new = (query.path_cache, query.path_lo, query.path_hi, query.work_left)
            assert new == old
            compared.append(len(new[0]))

    replay(Coordinator, policy, seed=5, check=both)
    assert len(compared) > 1000 and max(compared) >= 5


# ------------------------------------------------- marginal_delay's price, fused and not


def _bits(a: np.ndarray) -> bytes:
    """The array's floats bit for bit (so -0.0 and 0.0, or two NaNs, are told apart)."""
    return np.ascontiguousarray(np.asarray(a, dtype=float)).tobytes()


@pytest.fixture
def priced(monkeypatch):
    """At every marginal_delay dispatch, the fused price (``ClusterView.marginal_price``)
    and the one built from ``batch_view`` term by term, compared bit for bit."""
    seen: list[int] = []
    fused = MarginalDelayDispatch.price_s

    def both(self, call, instances, now, view):
        price, names = fused(self, call, instances, now, view)
        ref_price, ref_names = self.price_from_batch_view(call, instances, now, view)
        assert _bits(price) == _bits(ref_price), (call.id, instances)
        assert _bits(names) == _bits(ref_names)
        seen.append(len(instances))
        return price, names

    monkeypatch.setattr(MarginalDelayDispatch, "price_s", both)
    return seen


@pytest.mark.parametrize("policy", ["flowsage", "oracle", "marginal_delay+fcfs",
                                    "cache_aware+edf"])
@pytest.mark.parametrize("specs", ["plain", "peers"])
def test_the_fused_price_is_the_batch_view_s_bit_for_bit(policy, specs, priced):
    """Seeded replays (classes and tenants, so worse-band work behind, shielded calls and
    peers counts; KV budgets; failures, so retries priced on a subset of instances)."""
    replay(Coordinator, policy, seed=13, specs=SPECS if specs == "plain" else PEER_SPECS)
    assert len(priced) > 100 and min(priced) < max(priced)  # some on a subset


def test_the_fused_price_on_the_benchmark_s_fleet(priced):
    """The benchmark's rounds on 64 instances without KV budgets (the unbounded-KV room
    test), learning at every finish, every round's dispatch compared."""
    scheduler_overhead.measure("flowsage", 1000, 60, "hetero-64")
    assert len(priced) > 1000


def test_the_fused_price_with_per_instance_prompt_lengths(priced):
    """Tokenizers that disagree: each instance prices its own prompt length."""
    from agentflow.workflow import ManualClock

    c = Coordinator(SPECS, clock=ManualClock(0.0), policy="flowsage")
    c.on_query_arrival("q", deadline=30.0)
    for k in range(12):
        c.clock.advance(0.1)
        c.on_call_ready("q", stage="generate_candidate", node_id=f"n{k}", prompt_tokens=900,
                        prompt_tokens_by_instance={s.name: 700 + 97 * i + k
                                                   for i, s in enumerate(SPECS)})
    assert len(priced) == 12
