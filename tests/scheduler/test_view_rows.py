"""The view's row-by-row caches decide exactly as the rebuild-everything caches they replaced.

``ReferenceCoordinator`` keeps main's view as it was before issue 36 (c857c21): every
cluster-wide coefficient array rebuilt from all time models whenever ``_models_epoch``
moved, which every learn and every instance up/down bumped; the up list rebuilt at every
read; the cluster mean a plain sum over the up rows. A recorded event sequence (seeded:
arrivals with tenants and classes, calls ready along each query's workflow, progress,
finishes that report times so models learn, failures, instances down and up, cancels) is
replayed through it and through the coordinator as it is now, and every decision must be the
same, for every preset policy.
"""

from __future__ import annotations

import copy
import random
from fractions import Fraction

import networkx as nx
import numpy as np
import pytest

from agentflow.scheduler import PRESETS, Coordinator, InstanceSpec
from agentflow.scheduler.call import CallState, ScheduledCall
from agentflow.scheduler.decisions import FailCall, PreemptCall, QueryRejected, StartCall
from agentflow.scheduler.exact_mean import ExactColumnMeans
from agentflow.scheduler.lengths.learned import LearnedLengthModel
from agentflow.scheduler.policies.base import BatchView
from agentflow.workflow import ManualClock, Node, NodeKind, Query, WorkflowRun

# --------------------------------------------------------------------- the reference view


class ReferenceCoordinator(Coordinator):
    """The coordinator with main's view (c857c21) restored, method for method."""

    marginal_price = None  # marginal_delay prices from ``batch_view`` below, as it did

    def _init_view(self, instances):
        super()._init_view(instances)
        self._ref_mean = None
        self._coef_cache = None
        self._batch_cache = {}

    @property
    def up_instances(self):
        return [name for name, q in self.queues.items() if q.up]

    def _model_learned(self, instance):
        self._models_epoch += 1

    def _instances_changed(self):
        self._models_epoch += 1

    def dispatch_view(self, call, instances, now):
        idx = [self._index[n] for n in instances]
        work = self.work_vector(now)
        behind = self._work_behind(call)
        if behind is not None:
            work = work - behind
        return work[idx], self.time_vector(call)[idx], self._name_rank[idx]

    def batch_view(self, call, instances, now):
        idx = [self._index[n] for n in instances]
        oh, pf, df = self._coef_vectors()
        book = self.loads
        queued_all = book.n_wait * oh + book.wait_prompt * pf + book.wait_output * df
        behind = self._work_behind(call)
        queued = (queued_all if behind is None else queued_all - behind)[idx]
        prompt = call.prompt_tokens
        if call.prompt_tokens_on:
            prompt = np.array([call.tokens_on(n) for n in instances], dtype=float)
        n_run = book.n_run[idx]
        need = prompt + self._output_reserve(call)
        room = (n_run < self._max_inflight[idx]) & (
            (n_run == 0) | (book.kv_used[idx] + need <= self._kv_budget[idx]))
        time_s = self.time_vector(call)[idx]
        rate = df
        if self._shielded(call):
            rate, slope, seen = self._batch_coefs(clean=True)
            time_s = time_s + call.mean_output * (rate - df)[idx]
        else:
            _, slope, seen = self._batch_coefs()
        solo_s = time_s + call.mean_output * (np.minimum(rate, self._solo_df()) - rate)[idx]
        return BatchView(queued_s=queued, prefilling_s=book.prefill_prompt[idx] * pf[idx],
                         running_s=book.running(now)[idx], n_running=n_run,
                         room=room, slots=self._max_inflight[idx],
                         time_s=time_s, prefill_s=prompt * pf[idx],
                         co_runner_decode_s=call.mean_output * slope[idx],
                         co_runners_seen=seen[idx], name_rank=self._name_rank[idx],
                         n_peers=self._peers(call, idx), solo_s=solo_s)

    def _batch_coefs(self, clean=False):
        cached = self._batch_cache.get(clean)
        if cached is None or cached[0] != self._models_epoch:
            models = [self.time_models[n] for n in self.queues]
            fits = [m.co_runner_slope(clean=clean) for m in models]
            cached = self._batch_cache[clean] = (
                self._models_epoch,
                np.array([m.decode_s_per_token
                          * (m.clean_decode_ratio if clean else m.decode_ratio)
                          for m in models]),
                np.array([m.decode_s_per_token * f[0] for m, f in zip(models, fits)]),
                np.array([f[1] for f in fits]))
        return cached[1], cached[2], cached[3]

    def _solo_df(self):
        return np.array([self.time_models[n].decode_s_per_token for n in self.queues])

    def _coef_vectors(self):
        cached = self._coef_cache
        key = self._models_epoch
        if cached is None or cached[0] != key:
            models = [self.time_models[n] for n in self.queues]
            cached = self._coef_cache = (
                key, np.array([m.overhead_s for m in models]),
                np.array([m.prefill_s_per_token * m.prefill_ratio for m in models]),
                np.array([m.decode_s_per_token * m.decode_ratio for m in models]))
        return cached[1], cached[2], cached[3]

    def _mean_coefs(self):
        coef = self._ref_mean
        key = self._models_epoch
        if coef is None or coef[0] != key:
            up = [q.up for q in self.queues.values()]
            vectors = self._coef_vectors()
            if any(up):
                vectors = tuple(v[up] for v in vectors)
            k = len(vectors[0])
            coef = self._ref_mean = (key, *(sum(v.tolist()) / k for v in vectors))
        return coef[1], coef[2], coef[3]

    def _retry_after(self, now):
        work = self.work_vector(now)
        loads = [float(work[self._index[n]]) for n in self.up_instances] or [5.0]
        return max(1.0, min(loads))


class BorrowingReference(Coordinator):
    """The coordinator with main's view as it was at 400c12a, before the untried peers'
    rows were kept as blocks: a learn marks every untried peer's row stale, each rewritten
    one by one from ``_borrowed``, which scans the group's time models at every call."""

    def _model_learned(self, instance):
        i = self._index[instance]
        self._stale_rows.add(i)
        self._mean_coef = None
        key = self._peer_keys[i]
        self._group_learns[key] += 1
        self._untried.discard(i)
        if self._untried:
            self._stale_rows.update(j for j in self._groups[key] if j in self._untried)

    def _borrowed(self, i, model):
        if model.observations:
            return None
        peers = [m for m in (self.time_models[self._names[j]]
                             for j in self._groups[self._peer_keys[i]] if j != i)
                 if m.observations]
        if not peers:
            return None
        k = len(peers)
        return (sum(p.prefill_ratio for p in peers) / k, sum(p.decode_ratio for p in peers) / k,
                sum(p.clean_decode_ratio for p in peers) / k)

    def _coef_vectors(self):
        if self._rows_epoch != self._models_epoch:
            self._untried = {i for i in range(len(self._names))
                             if not self.time_models[self._names[i]].observations}
            for i, name in enumerate(self.queues):
                self._fill_row(i, self.time_models[name])
            self._rows_epoch = self._models_epoch
            self._stale_rows.clear()
            self._mean_coef = None
        elif self._stale_rows:
            for i in self._stale_rows:
                self._fill_row(i, self.time_models[self._names[i]])
            self._stale_rows.clear()
        return self._oh, self._pf, self._df

    def _fill_row(self, i, m):
        borrowed = self._borrowed(i, m) if i in self._untried else None
        prefill_ratio, decode_ratio, clean_ratio = borrowed if borrowed is not None else (
            m.prefill_ratio, m.decode_ratio, m.clean_decode_ratio)
        self._oh[i] = m.overhead_s
        self._pf[i] = m.prefill_s_per_token * prefill_ratio
        self._df[i] = m.decode_s_per_token * decode_ratio
        self._sums.set_row(i, (self._oh[i], self._pf[i], self._df[i]))
        self._solo[i] = m.decode_s_per_token
        for clean, (rate, slope, seen) in self._batch_rows.items():
            fit = m.co_runner_slope(clean=clean)
            rate[i] = m.decode_s_per_token * (clean_ratio if clean else decode_ratio)
            slope[i] = m.decode_s_per_token * fit[0]
            seen[i] = fit[1]


# ------------------------------------------------------------------------ the event replay

STAGES = ["extract_keywords", "generate_candidate", "generate_candidate", "revise",
          "generate_unit_test", "evaluate", "evaluate"]

SPECS = [
    InstanceSpec("h200-0", "H200", "Llama-3.1-8B", max_inflight=3, kv_token_budget=9000),
    InstanceSpec("h100-0", "H100", "Llama-3.1-8B", max_inflight=2),
    InstanceSpec("a100-0", "A100-80G", "Llama-3.1-8B", max_inflight=2,
                 max_pending_prefill=1),
    InstanceSpec("a100-1", "A100-80G", "Llama-3.1-8B", max_inflight=2),
    InstanceSpec("l40s-0", "L40S", "Llama-3.1-8B", max_inflight=2, kv_token_budget=6000),
    InstanceSpec("a6000-0", "A6000", "Llama-3.1-8B", max_inflight=1),
]


def _run(query_id: str, deadline: float) -> WorkflowRun:
    """extract -> two candidates -> revise -> unit tests -> two evaluations."""
    async def noop(ctx):
        return None
    g = nx.DiGraph()
    nodes = [Node(f"{query_id}.{i}", s, NodeKind.LLM, noop, hints={"prompt_tokens": 800})
             for i, s in enumerate(STAGES)]
    for n in nodes:
        g.add_node(n.id, node=n)
    g.add_edges_from([(nodes[0].id, nodes[1].id), (nodes[0].id, nodes[2].id),
                      (nodes[1].id, nodes[3].id), (nodes[2].id, nodes[3].id),
                      (nodes[3].id, nodes[4].id), (nodes[4].id, nodes[5].id),
                      (nodes[4].id, nodes[6].id)])
    return WorkflowRun(Query("q", "db", arrival=0.0, slo_s=deadline, id=query_id), g)


# Groups of peers (same GPU and model), some with two starting models (quantised KV, more
# tensor parallelism), on more instances than the replay's finishes reach for a long
# while: untried members borrow their answered peers' ratios throughout.
PEER_SPECS = [
    *[InstanceSpec(f"h100-{i}", "H100", "Llama-3.1-8B", max_inflight=2) for i in range(5)],
    *[InstanceSpec(f"a100-{i}", "A100-80G", "Llama-3.1-8B", max_inflight=1,
                   kv_bits=8 if i % 2 else None) for i in range(6)],
    *[InstanceSpec(f"l40s-{i}", "L40S", "Llama-3.1-8B", max_inflight=2,
                   kv_token_budget=6000) for i in range(3)],
    *[InstanceSpec(f"a6000-{i}", "A6000", "Llama-3.1-8B", max_inflight=1,
                   tensor_parallel=2 if i == 3 else 1) for i in range(4)],
    InstanceSpec("h200-0", "H200", "Llama-3.1-8B", max_inflight=3, kv_token_budget=9000),
]


def replay(cls: type[Coordinator], policy: str, seed: int, events: int = 500,
           check=None, specs: list[InstanceSpec] = SPECS) -> list[tuple]:
    """Drive a coordinator of ``cls`` through ``events`` seeded events; the decisions it
    answered, as plain tuples. The events depend only on the seed and on the decisions, so
    two coordinators that decide alike see the same sequence. ``check(c)``: called after
    every event."""
    rng = random.Random(seed)
    clock = ManualClock(0.0)
    kw = {"preemption": "auto"} if policy in ("flowsage", "oracle") else {}
    c = cls(specs, clock=clock, policy=policy, length_model=LearnedLengthModel(), **kw)
    log: list[tuple] = []
    running: dict[str, ScheduledCall] = {}
    runs: dict[str, WorkflowRun] = {}
    down: list[str] = []
    n_queries = 0

    def take(decisions) -> None:
        for d in decisions:
            if isinstance(d, StartCall):
                running[d.call.id] = d.call
                log.append(("start", d.call.id, d.instance, d.priority, d.attempt))
            elif isinstance(d, PreemptCall):
                running.pop(d.call.id, None)
                log.append(("preempt", d.call.id, d.instance, d.attempt))
            elif isinstance(d, FailCall):
                running.pop(d.call.id, None)
                log.append(("fail", d.call.id, d.reason))

    def ready(qid: str) -> None:
        """Every node of ``qid`` whose predecessors are done and that has no call yet."""
        query = c.queries.get(qid)
        if query is None:
            return
        run = runs[qid]
        has_call = {x.node_id for x in query.calls} | query.done_nodes
        for n in run.graph:
            if n in has_call or not all(p in query.done_nodes
                                        for p in run.graph.predecessors(n)):
                continue
            node = run.node(n)
            call, decisions = c.on_call_ready(qid, stage=node.stage, node_id=n,
                                              prompt_tokens=rng.randint(200, 3000),
                                              max_tokens=rng.choice([None, 400]))
            log.append(("ready", call.id, n))
            take(decisions)

    def pick() -> ScheduledCall | None:
        live = [running[k] for k in sorted(running)
                if running[k].state == CallState.RUNNING]
        return rng.choice(live) if live else None

    for _ in range(events):
        clock.advance(rng.uniform(0.0, 0.4))
        r = rng.random()
        if r < 0.16 or not c.queries:
            qid = f"q{n_queries}"
            n_queries += 1
            runs[qid] = _run(qid, 20.0 + rng.random() * 30)
            try:
                c.on_query_arrival(qid, deadline=clock.now() + rng.uniform(5, 40),
                                   key_text=f"question {rng.randint(0, 30)}", run=runs[qid],
                                   tenant=rng.choice(["a", "b", None]),
                                   slo_class=rng.choice([None, "interactive", "batch"]))
            except QueryRejected as e:
                log.append(("rejected", qid, str(e)))
                continue
            ready(qid)
        elif r < 0.60:
            call = pick()
            if call is None:
                continue
            running.pop(call.id)
            out = rng.randint(5, 500)
            total = rng.uniform(0.3, 8.0)
            take(c.on_call_done(call, output_tokens=out, ttft_s=total * rng.uniform(0.05, 0.5),
                                total_s=total, cached_tokens=rng.choice([0, 0, 128])))
            log.append(("done", call.id))
            qid = call.query.id
            query = c.queries.get(qid)
            if query is not None and len(query.done_nodes) == len(runs[qid].graph):
                c.on_query_done(qid)
            else:
                ready(qid)
        elif r < 0.80:
            call = pick()
            if call is not None:
                take(c.on_call_progress(call, call.attained_tokens + rng.randint(1, 60)))
        elif r < 0.86:
            call = pick()
            if call is not None:
                running.pop(call.id)
                take(c.on_call_failed(call, "engine error", retryable=rng.random() < 0.8))
        elif r < 0.91:
            if down and (rng.random() < 0.6 or len(down) >= 3):
                name = down.pop(0)
                take(c.on_instance_up(name))
                log.append(("up", name))
            else:
                name = rng.choice([s.name for s in specs if s.name not in down])
                down.append(name)
                take(c.on_instance_down(name))
                for call in [x for k, x in sorted(running.items()) if x.instance == name]:
                    if call.state == CallState.RUNNING:
                        running.pop(call.id)
                        take(c.on_call_failed(call, f"{name} went down"))
                log.append(("down", name))
        elif r < 0.94:
            qid = rng.choice(sorted(c.queries))
            stopped, decisions = c.cancel_query(qid)
            for call in stopped:
                running.pop(call.id, None)
            take(decisions)
            log.append(("cancel", qid, sorted(x.id for x in stopped)))
        else:  # a rejection's retry-after and the waiting count read the view too
            log.append(("retry", round(c._retry_after(clock.now()), 9), c.waiting_calls))
        if check is not None:
            check(c)
    return log


@pytest.mark.parametrize("policy", [*PRESETS, "least_loaded+edf", "earliest_finish+llf"])
def test_every_decision_matches_the_rebuild_everything_view(policy):
    new = replay(Coordinator, policy, seed=7)
    old = replay(ReferenceCoordinator, policy, seed=7)
    assert sum(1 for e in old if e[0] == "start") > 100  # the replay really decides
    assert any(e[0] == "down" for e in old) and any(e[0] == "done" for e in old)
    for i, (a, b) in enumerate(zip(new, old)):
        assert a == b, f"event {i}: {a} != {b} (before: {old[max(0, i - 3):i]})"
    assert len(new) == len(old)


@pytest.mark.parametrize("policy", [*PRESETS, "least_loaded+edf", "earliest_finish+llf"])
def test_every_decision_matches_the_row_by_row_borrowing_view(policy):
    """Untried peers priced by their answered peers' ratios, kept as blocks, decide as the
    row-by-row rewrite did; the replay really has untried members beside answered ones."""
    borrowing = []

    def seen(c: Coordinator) -> None:
        models = [c.time_models[n] for n in c.queues]
        borrowing.append(sum(1 for i, m in enumerate(models)
                             if not m.observations and c._borrowed(i, m) is not None))

    new = replay(Coordinator, policy, seed=11, specs=PEER_SPECS, check=seen)
    old = replay(BorrowingReference, policy, seed=11, specs=PEER_SPECS)
    assert sum(1 for e in old if e[0] == "start") > 100
    assert sum(1 for n in borrowing if n >= 3) > 100  # many events with borrowers
    for i, (a, b) in enumerate(zip(new, old)):
        assert a == b, f"event {i}: {a} != {b} (before: {old[max(0, i - 3):i]})"
    assert len(new) == len(old)


def _priced_ratios(c: Coordinator, i: int) -> tuple[float, float]:
    """(prefill, decode) ratio instance ``i`` is priced with, from the time models alone:
    its own once it has answered, else the mean of its answered peers' (same GPU, model and
    backend), else its own starting ones (issue 39: an untried twin is priced as its peers)."""
    specs = [q.spec for q in c.queues.values()]
    models = [c.time_models[s.name] for s in specs]
    peers = [m for j, m in enumerate(models)
             if j != i and m.observations and specs[j].peer_key == specs[i].peer_key]
    if models[i].observations or not peers:
        return models[i].prefill_ratio, models[i].decode_ratio
    k = len(peers)
    return sum(p.prefill_ratio for p in peers) / k, sum(p.decode_ratio for p in peers) / k


def _exact_mean(values) -> float:
    return float(sum(Fraction(v) for v in values) / len(values))


def test_rows_equal_a_fresh_build_after_every_event():
    """After every event the kept rows are the arrays a rebuild from every time model gives
    (bit for bit), and the cluster mean is the exact mean of the up rows, rounded once."""
    def check(c: Coordinator) -> None:
        models = [c.time_models[n] for n in c.queues]
        oh, pf, df = c._coef_vectors()
        ratios = [_priced_ratios(c, i) for i in range(len(models))]
        assert np.array_equal(oh, [m.overhead_s for m in models])
        assert np.array_equal(pf, [m.prefill_s_per_token * r[0]
                                   for m, r in zip(models, ratios)])
        assert np.array_equal(df, [m.decode_s_per_token * r[1]
                                   for m, r in zip(models, ratios)])
        assert np.array_equal(c._solo_df(), [m.decode_s_per_token for m in models])
        for clean in (False, True):
            rate, slope, seen = c._batch_coefs(clean=clean)
            fits = [m.co_runner_slope(clean=clean) for m in models]
            assert np.array_equal(slope, [m.decode_s_per_token * f[0]
                                          for m, f in zip(models, fits)])
            assert np.array_equal(seen, [f[1] for f in fits])
        up = [q.up for q in c.queues.values()]
        assert c.up_instances == [n for n, q in c.queues.items() if q.up]
        rows = [i for i, u in enumerate(up) if u] or list(range(len(up)))
        assert c._mean_coefs() == tuple(_exact_mean([v[i] for i in rows]) for v in (oh, pf, df))

    log = replay(Coordinator, "flowsage", seed=3, events=300, check=check)
    assert any(e[0] == "down" for e in log)
    log = replay(Coordinator, "flowsage", seed=5, events=300, check=check, specs=PEER_SPECS)
    assert any(e[0] == "down" for e in log)


def test_exact_column_means_do_not_depend_on_the_order_of_changes():
    rng = random.Random(0)
    values = [[rng.uniform(1e-6, 2.0) for _ in range(2)] for _ in range(50)]
    a, b = ExactColumnMeans(50, 2), ExactColumnMeans(50, 2)
    for i in range(50):
        a.set_row(i, values[i])
    for i in reversed(range(50)):  # other order, through other values first
        b.set_row(i, [v * 3.7 for v in values[i]])
        b.set_row(i, values[i])
    assert a.means() == b.means() == tuple(_exact_mean([v[j] for v in values])
                                           for j in range(2))
    counted = [i % 3 != 0 for i in range(50)]
    a.set_counted(counted)
    assert a.means()[0] == _exact_mean([v[0] for v, c in zip(values, counted) if c])
    a.set_counted([False] * 50)  # none counted: the mean over all rows
    assert a.means()[1] == _exact_mean([v[1] for v in values])
    a.set_row(4, [float("inf"), 1.0])
    assert a.means()[0] == float("inf")
    a.set_row(4, values[4])
    assert a.means()[0] == _exact_mean([v[0] for v in values])


def test_a_block_counts_as_its_members_one_by_one():
    """Rows kept as one block give the means the same rows give set one by one, through
    joins, a row leaving its block for a value of its own, and instances going down."""
    rng = random.Random(1)
    own = [[rng.uniform(1e-6, 2.0) for _ in range(3)] for _ in range(40)]
    shared = [rng.uniform(1e-6, 2.0) for _ in range(3)]
    rows, blocked = ExactColumnMeans(40, 3), ExactColumnMeans(40, 3)
    members = set(range(0, 40, 3))
    for i in range(40):
        rows.set_row(i, shared if i in members else own[i])
        blocked.set_row(i, own[i])
    for i in sorted(members):
        blocked.join_block(i, "b")
    blocked.set_block("b", shared)
    assert blocked.means() == rows.means()
    counted = [i % 4 != 1 for i in range(40)]
    rows.set_counted(counted)
    blocked.set_counted(counted)
    assert blocked.means() == rows.means()
    shared = [v * 1.3 for v in shared]
    blocked.set_block("b", shared)
    for i in members:
        rows.set_row(i, shared)
    assert blocked.means() == rows.means()
    blocked.set_row(3, own[3])  # out of the block
    rows.set_row(3, own[3])
    assert blocked.means() == rows.means()
    blocked.set_block("b", [float("inf"), 1.0, 1.0])  # a non-finite block: the float sum
    for i in members - {3}:
        rows.set_row(i, [float("inf"), 1.0, 1.0])
    assert blocked.means()[0] == rows.means()[0] == float("inf")
    assert blocked.means()[1:] == rows.means()[1:]


def test_the_kept_cluster_mean_is_current_when_read_first():
    """``_mean_coefs`` answers from its kept mean without asking ``_coef_vectors`` whether
    rows are stale (the common read in a paths pass): read first after every event, before
    anything flushes the rows, it is still the exact mean of a fresh build from the models."""
    def check(c: Coordinator) -> None:
        mean = c._mean_coefs()  # first: no other read has brought the rows up to date
        models = [c.time_models[n] for n in c.queues]
        ratios = [_priced_ratios(c, i) for i in range(len(models))]
        up = [q.up for q in c.queues.values()]
        rows = [i for i, u in enumerate(up) if u] or list(range(len(up)))
        cols = ([m.overhead_s for m in models],
                [m.prefill_s_per_token * r[0] for m, r in zip(models, ratios)],
                [m.decode_s_per_token * r[1] for m, r in zip(models, ratios)])
        assert mean == tuple(_exact_mean([v[i] for i in rows]) for v in cols)
        assert c._mean_coefs() is mean  # unchanged since: the kept tuple itself

    replay(Coordinator, "flowsage", seed=3, events=300, check=check)
    replay(Coordinator, "flowsage", seed=5, events=300, check=check, specs=PEER_SPECS)


def test_a_replaced_model_moves_the_kept_cluster_mean():
    """A model replaced outside ``observe`` (tests, calibration) moves ``_models_epoch``
    only; the kept mean must not outlive it."""
    specs = SPECS[:3]
    c = Coordinator(specs, clock=ManualClock(0.0), policy="flowsage")
    before = c._mean_coefs()
    model = copy.deepcopy(c.time_models["h200-0"])
    model.overhead_s += 1.0
    c.time_models["h200-0"] = model
    after = c._mean_coefs()
    assert after[0] == _exact_mean([c.time_models[s.name].overhead_s for s in specs])
    assert after[0] != before[0]
