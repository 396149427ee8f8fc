"""Stop 54 (#36): the admission gate's rank hold (``risk.hold_for_rank``) prices a decoding
co-runner's own remainder first and reads its query's critical path only where the wait
bound leaves it in (one path read for its slack and its miss probability; the second rule
reads the remainders the loop priced). Same answers as stop 53's order
(``risk._hold_for_rank_priced``, what ``_WAIT_FIRST = False`` runs), shown here:

- at every admission the gate tries in seeded simulations (both rules firing, the second
  rule on and off), the cut's answer and the reference's, asked in turn on the same state;
- whole runs with the cut on and off: every gate answer (time, instance, call) and every
  query record to the last float;
- on random states near every threshold (slack against slack, the miss probabilities, the
  wait bound, the second rule's ranks and cap; the bound and the second rule on and off);
- faults planted in a copy of the cut (each test moved a little, a remainder lost from
  the second rule or a sibling's added, the wrong query's spread) are each caught: by the
  random states, and the wait bound's also by the simulations.
"""

from __future__ import annotations

import inspect
import math
import random
import textwrap
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from agentflow.scheduler import classes, remaining, risk
from agentflow.scheduler.call import QueryState, ScheduledCall
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.time_model import InstanceTimeModel
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.driver import SimResult, Simulation
from agentflow.sim.workload import TraceNode, TraceQuery
from tests.sim.scenarios import record_rows, small_scenario

Hold = Callable[[Any, Any, Any, float], bool]


# (arrivals a second, deadlines after arrival, prompt tokens, output tokens) to draw from:
# deadlines from tight to none, and many short decoders beside rare long prompts
SHAPES: dict[str, tuple[float, list[float | None], list[int], list[int]]] = {
    "mixed": (3.0, [None, 1.5, 3.0, 6.0, 600.0, 3600.0], [150, 400, 900, 3000, 9000, 14000],
              [12, 30, 60, 120, 300]),
    "spare": (3.0, [2.0, 600.0, 3600.0, 3600.0], [150, 200, 300, 400, 12000], [12, 30, 60]),
}


def _run_synthetic(shape: str, seed: int, n: int = 70) -> SimResult:
    """Chains of 1-3 calls drawn from ``SHAPES[shape]`` on two 8B instances of two
    generations: both hold rules fire (each > 50 times over the runs)."""
    rate, slo_choices, prompts, outputs = SHAPES[shape]
    rng = random.Random(seed)
    cluster = SimClusterConfig(name="two", instances=[
        SimInstanceConfig(name="a", gpu="A100-80G", model="Llama-3.1-8B"),
        SimInstanceConfig(name="c", gpu="L40S", model="Llama-3.1-8B")])
    queries, arrivals, slos = [], [], []
    t = 0.0
    for i in range(n):
        nodes = [TraceNode(f"n{k}", f"s{k}", "llm", (f"n{k - 1}",) if k else (),
                           rng.choice(prompts), rng.choice(outputs))
                 for k in range(rng.randint(1, 3))]
        queries.append(TraceQuery(id=f"q{i}", question=f"q{i}", nodes=nodes))
        t += rng.expovariate(rate)
        arrivals.append(t)
        slos.append(rng.choice(slo_choices))
    return Simulation(cluster, "flowsage").run(queries, arrivals, slos, [1.0] * n)


def _run_small(tenants: bool) -> SimResult:
    scenario = small_scenario(tenants, tenants)
    return scenario.run(scenario.simulation("flowsage"))


RUNS: list[tuple[str, Callable[[], SimResult]]] = [
    ("mixed-1", lambda: _run_synthetic("mixed", 1)),
    ("mixed-2", lambda: _run_synthetic("mixed", 2)),
    ("spare-1", lambda: _run_synthetic("spare", 1)),
    ("tenants", lambda: _run_small(True)),
    ("plain", lambda: _run_small(False)),
]


@contextmanager
def _gate(monkeypatch: pytest.MonkeyPatch, hold: Hold) -> Iterator[None]:
    """The gate (``classes.headroom_gate``) calls ``hold`` instead of ``hold_for_rank``."""
    with monkeypatch.context() as m:
        m.setattr(classes, "hold_for_rank", hold)
        yield


def _checked(fast: Hold, counts: Counter[str]) -> Hold:
    """Asks ``fast``, then the reference on the same state; counts which rule held."""
    def hold(coordinator: Any, queue: Any, call: Any, now: float) -> bool:
        got = fast(coordinator, queue, call, now)
        want = risk._hold_for_rank_priced(coordinator, queue, call, now)
        counts["tries"] += 1
        if got != want:
            counts["mismatch"] += 1
        if want:
            share, risk.HOLD_SPARE_SLACK_SHARE = risk.HOLD_SPARE_SLACK_SHARE, None
            try:
                first = risk._hold_for_rank_priced(coordinator, queue, call, now)
            finally:
                risk.HOLD_SPARE_SLACK_SHARE = share
            counts["rule 1" if first else "rule 2"] += 1
        return want
    return hold


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("share", [risk.HOLD_SPARE_SLACK_SHARE, None])
def test_every_gate_answer_is_the_reference_one(monkeypatch: pytest.MonkeyPatch,
                                                share: float | None, skip: bool) -> None:
    monkeypatch.setattr(risk, "HOLD_SPARE_SLACK_SHARE", share)
    monkeypatch.setattr(risk, "_BOUND_SKIP", skip)
    counts: Counter[str] = Counter()
    least = risk.remaining_at_least_s

    def counted(coordinator: Any, call: Any, instance: str) -> float:
        counts["bounded"] += 1
        got = least(coordinator, call, instance)
        now = coordinator.clock.now()
        assert got <= remaining.remaining_s(coordinator, call, instance, now)  # a bound
        return got

    monkeypatch.setattr(risk, "remaining_at_least_s", counted)
    with _gate(monkeypatch, _checked(risk.hold_for_rank, counts)):
        for _, run in RUNS:
            run()
    assert counts["mismatch"] == 0
    assert counts["tries"] > 1000
    assert counts["rule 1"] > 50  # the at-risk rule held
    if share is not None:
        assert counts["rule 2"] > 50  # and the second rule
    assert (counts["bounded"] > 1000) == skip


def test_the_lower_bound_is_one_on_awkward_predictions() -> None:
    """``remaining_at_least_s`` is at most ``remaining_s`` on predictions made to test it:
    one atom, atoms of ~1e-16 mass (the conditional mean barely above the mean), tokens
    written at, between and past the atoms (the over-run rule), caps at and past them,
    a prompt still prefilling, and it is -inf on a negative decode rate."""
    rng = random.Random(7)
    model = InstanceTimeModel(prefill_s_per_token=1e-4, decode_s_per_token=0.02)
    co = _Coordinator(model, {})
    shapes = [([50.0], [1.0]), ([10.0, 20.0, 4000.0], [0.5, 0.5 - 1e-16, 1e-16]),
              ([1.0, 2.0, 3.0], [1e-16, 1e-16, 1.0 - 2e-16])]
    for _ in range(300):
        n = rng.randint(1, 40)
        shapes.append((sorted(rng.sample(range(1, 3000), n)),
                       [rng.choice([1e-16, 1e-9, 1.0, rng.random()]) for _ in range(n)]))
    checked = 0
    for values, probs in shapes:
        d = Distribution(values, probs)
        top = int(d.max())
        for attained in {0, 1, top - 1, top, top + 5, *rng.sample(range(0, top + 10), 5)}:
            if attained < 0:
                continue
            for cap in (None, attained, attained + 3, top, top + 100):
                c = ScheduledCall(id="c", query=QueryState(id="q", arrival=0.0, deadline=None),
                                  stage="s", node_id="n", prompt_tokens=500, output=d,
                                  ready_at=0.0, max_tokens=cap)
                c.attained_tokens, c.started_at = attained, 0.0
                got = remaining.remaining_at_least_s(co, c, "i")
                assert got <= remaining.remaining_s(co, c, "i", 0.01), (values, attained, cap)
                checked += got > -math.inf
    assert checked > 1000  # mostly a real bound, not -inf
    model.decode_ratio = -1.0
    c.attained_tokens = 0
    assert remaining.remaining_at_least_s(co, c, "i") == -math.inf


def _answers(monkeypatch: pytest.MonkeyPatch, wait_first: bool, skip: bool = True
             ) -> tuple[list[tuple[Any, ...]], list[list[tuple[Any, ...]]]]:
    answers: list[tuple[Any, ...]] = []

    def hold(coordinator: Any, queue: Any, call: Any, now: float) -> bool:
        got = risk.hold_for_rank(coordinator, queue, call, now)
        answers.append((now, queue.name, call.id, got))
        return got

    monkeypatch.setattr(risk, "_WAIT_FIRST", wait_first)
    monkeypatch.setattr(risk, "_BOUND_SKIP", skip)
    with _gate(monkeypatch, hold):
        rows = [record_rows(run()) for _, run in RUNS]
    return answers, rows


def test_runs_with_the_cut_on_and_off_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    on, rows_on = _answers(monkeypatch, True)
    unskipped, rows_unskipped = _answers(monkeypatch, True, skip=False)
    off, rows_off = _answers(monkeypatch, False)
    assert sum(a[3] for a in on) > 100
    assert on == unskipped == off
    assert rows_on == rows_unskipped == rows_off


class _Coordinator:
    """What the hold reads of a coordinator: time models and each query's remaining path."""

    def __init__(self, model: InstanceTimeModel, paths: dict[str, float]) -> None:
        self.time_models = {"i": model}
        self.paths = paths

    def remaining_s(self, query: QueryState, now: float) -> float:
        return self.paths[query.id]


class _Queue:
    def __init__(self, running: list[ScheduledCall]) -> None:
        self.name = "i"
        self.running = running


def _state(rng: random.Random) -> tuple[_Coordinator, _Queue, ScheduledCall, float]:
    """A waiting call and 0-8 running ones, their queries' slack drawn around what each
    test compares with (z from -1 to 3 against the spread, 1 to 4 for the waiting call's;
    remainders from a few to hundreds of tokens)."""
    now = rng.uniform(0.0, 100.0)
    model = InstanceTimeModel(prefill_s_per_token=rng.uniform(2e-5, 2e-4),
                              decode_s_per_token=rng.uniform(0.005, 0.05))
    paths: dict[str, float] = {}

    def query(name: str, z_lo: float, z_hi: float) -> QueryState:
        remaining = rng.uniform(0.1, 30.0)
        sigma = rng.uniform(0.02, 0.5) * remaining
        z = rng.uniform(z_lo, z_hi)
        deadline = None if rng.random() < 0.1 else now + remaining + sigma * z
        q = QueryState(id=name, arrival=0.0, deadline=deadline)
        q.run = object()  # type: ignore[assignment]  # spread from the paths' band
        q.path_lo, q.path_hi = remaining - 1.2816 * sigma, remaining + 1.2816 * sigma
        paths[name] = remaining
        return q

    def call(name: str, q: QueryState, attained: int, prompts: list[int]) -> ScheduledCall:
        values = sorted(rng.sample(range(1, rng.choice([20, 60, 400])), rng.randint(1, 4)))
        c = ScheduledCall(id=name, query=q, stage="s", node_id=name,
                          prompt_tokens=rng.choice(prompts),
                          output=Distribution([float(v) for v in values]), ready_at=0.0)
        c.attained_tokens = attained
        if attained and rng.random() < 0.3:  # an output cap some way past what it wrote
            c.max_tokens = attained + rng.randint(0, 120)
        return c

    mine = query("mine", 1.0, 4.0)  # mostly safe: the hold looks further
    running = []
    for k in range(rng.randint(0, 8)):
        q = mine if rng.random() < 0.1 else query(f"q{k}", -1.0, 3.0)
        running.append(call(f"r{k}", q, 0 if rng.random() < 0.1 else rng.randint(1, 300),
                            [100, 800, 3000]))
    return (_Coordinator(model, paths), _Queue(running), call("c", mine, 0, [800, 3000, 12000]),
            now)


def _random_mismatches(hold: Hold, cases: int = 4000) -> tuple[int, Counter[str]]:
    """Mismatches of ``hold`` against the reference on random states, under each setting
    of the wait bound and the second rule; what the reference answered, counted."""
    counts: Counter[str] = Counter()
    rng = random.Random(54)
    mismatches = 0
    bound0, share0 = risk.HOLD_WAIT_PER_STALL, risk.HOLD_SPARE_SLACK_SHARE
    try:
        for i in range(cases):
            bound = (bound0, None, 1.0)[i % 3]
            share = (share0, None, 0.2)[i // 3 % 3]
            risk.HOLD_WAIT_PER_STALL, risk.HOLD_SPARE_SLACK_SHARE = bound, share
            coordinator, queue, call, now = _state(rng)
            want = risk._hold_for_rank_priced(coordinator, queue, call, now)
            if hold(coordinator, queue, call, now) != want:
                mismatches += 1
            counts[f"bound {bound} share {share} {want}"] += 1
    finally:
        risk.HOLD_WAIT_PER_STALL, risk.HOLD_SPARE_SLACK_SHARE = bound0, share0
    return mismatches, counts


@pytest.mark.parametrize("skip", [True, False])
def test_random_states_near_every_threshold_get_the_reference_answer(
        monkeypatch: pytest.MonkeyPatch, skip: bool) -> None:
    monkeypatch.setattr(risk, "_BOUND_SKIP", skip)
    mismatches, counts = _random_mismatches(risk.hold_for_rank, cases=8000)
    assert mismatches == 0
    assert len(counts) == 18 and min(counts.values()) > 50, counts  # each answer, each way


def _planted(old: str, new: str, name: str = "hold_for_rank") -> Any:
    """A copy of ``risk``'s function ``name`` with one fault planted (``old`` replaced by
    ``new``), reading the module's own globals (the settings the tests move)."""
    source = textwrap.dedent(inspect.getsource(getattr(risk, name)))
    assert source.count(old) == 1, old
    source = source.replace(old, new).replace(f"def {name}(", "def _planted_copy(")
    namespace = vars(risk)
    exec(compile(source, "<planted>", "exec"), namespace)  # noqa: S102
    return namespace.pop("_planted_copy")


FAULTS = [
    ("wait > bound * stall:", "wait > 0.9 * bound * stall:"),
    ("if 0.5 * math.erfc(z / _SQRT2) < HOLD_AT_RISK:",
     "if 0.5 * math.erfc(z / _SQRT2) + 0.02 < HOLD_AT_RISK:"),
    ("if 0.5 * math.erfc(z / _SQRT2) > HOLD_SAFE:",
     "if 0.5 * math.erfc(z / _SQRT2) > 1.2 * HOLD_SAFE:"),
    ("z = theirs / remaining_spread_s(theirs_q, theirs_left)",
     "z = theirs / remaining_spread_s(query, theirs_left)"),
    ("waits = sorted([w for w, _ in decoding])",
     "waits = sorted([w for w, _ in decoding if w > 0.05])"),
    ("if r.attained_tokens == 0 or r.query is query:", "if r.attained_tokens == 0:"),
    ("        if mine - wait <= theirs:\n", "        if mine - 1.1 * wait <= theirs:\n"),
    ("limit = share * mine", "limit = 0.7 * share * mine"),
    ("if w < limit and (j + 1) * stall > w:", "if w < limit and j * stall > w:"),
    ("if least > above and least >= limit:", "if least > 0.7 * above and least >= limit:"),
]
# (a co-runner past the wait bound but under the second rule's cap acts only from a rank
# past its stall count: rare, so more states)
LIMIT_FAULT = ("if least > above and least >= limit:", "if least > above:")
def _planted_bound(old: str, new: str) -> Any:
    """A copy of ``remaining.remaining_at_least_s`` with one fault planted."""
    source = textwrap.dedent(inspect.getsource(remaining.remaining_at_least_s))
    assert source.count(old) == 1, old
    source = source.replace(old, new).replace("def remaining_at_least_s(", "def _planted_copy(")
    namespace = vars(remaining)
    exec(compile(source, "<planted>", "exec"), namespace)  # noqa: S102
    return namespace.pop("_planted_copy")


# faults in the lower bound (``remaining.remaining_at_least_s``, as the hold calls it)
BOUND_FAULTS = [
    ("(1.0 - _MEAN_MARGIN)", "(1.0 + 0.2)"),
    ("tokens = min(tokens, float(cap) - attained)", "tokens = tokens"),
]


@pytest.mark.parametrize("old,new", FAULTS)
def test_a_planted_fault_is_caught_on_random_states(old: str, new: str) -> None:
    mismatches, _ = _random_mismatches(_planted(old, new))
    assert mismatches > 0


def test_a_bound_past_the_second_rules_cap_is_caught_on_random_states() -> None:
    mismatches, _ = _random_mismatches(_planted(*LIMIT_FAULT), cases=20000)
    assert mismatches > 0


@pytest.mark.parametrize("old,new", BOUND_FAULTS)
def test_a_fault_planted_in_the_bound_is_caught_on_random_states(
        monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    monkeypatch.setattr(risk, "remaining_at_least_s",
                        _planted_bound(old, new))
    mismatches, _ = _random_mismatches(risk.hold_for_rank)
    assert mismatches > 0


def test_a_planted_fault_is_caught_in_the_simulations(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: Counter[str] = Counter()
    with _gate(monkeypatch, _checked(_planted(*FAULTS[0]), counts)):
        for _, run in RUNS:
            run()
    assert counts["mismatch"] > 0
