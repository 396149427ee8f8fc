"""The simulator's preemption sees how far a running call really is, as serving's token
stream shows it: the engine counts the tokens each sequence has written at any instant
(``SimInstance.tokens_written``, a read that changes nothing), and the driver reports them
before a decision that may stop calls. Its events alone say 1, 2, 4, 8..., so a call 900
tokens in looked 512 in: cheaper to redo, more left to wait for, stopped when serving would
have let it finish. Real simulated engines (A100, Llama-3.1-8B profiles), true lengths."""

from __future__ import annotations

import pytest

from agentflow import hardware
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.driver import Simulation
from agentflow.sim.engine import SimInstance
from agentflow.sim.workload import TraceNode, TraceQuery

OUTPUT = 1500  # the batch call's tokens


def _engine(jump_ahead: bool = True) -> SimInstance:
    e = SimInstance(hardware.gpu("A100-80G"), hardware.model("Llama-3.1-8B"),
                    jump_ahead=jump_ahead)
    e.add("a", 300, 40, 0, 0.0)
    e.add("b", 200, 25, 0, 0.0)
    return e


def _events(e: SimInstance) -> list[tuple]:
    out = []
    while (t := e.next_event_time()) is not None:
        out += [(ev.kind, ev.seq_id, ev.time, ev.output_tokens) for ev in e.step_until(t)]
    return out


def test_the_engine_counts_tokens_between_its_events_without_moving() -> None:
    """A jump-ahead engine woken only at its events (as the driver does) counts, at any
    instant, what an engine stepped one iteration at a time has written by then."""
    ends = []  # every iteration's end, from the one-at-a-time engine
    one = _engine(jump_ahead=False)
    while (t := one.next_event_time()) is not None:
        one.step_until(t)
        ends.append(t)
    samples = [(a + b) / 2 for a, b in zip(ends, ends[1:])]
    one, lazy = _engine(jump_ahead=False), _engine()
    seen, events = set(), []
    for t in samples:
        while (nxt := lazy.next_event_time()) is not None and nxt <= t:
            events += [(ev.kind, ev.seq_id, ev.time, ev.output_tokens)
                       for ev in lazy.step_until(nxt)]
        one.step_until(t)
        assert lazy.tokens_written(t) == one.tokens_written(t), t
        seen.update(lazy.tokens_written(t).values())
    assert {3, 5, 7, 9, 17} <= seen  # counts no event reports
    # reading changed nothing: the engine read at every sample ran to the same events as
    # one never read
    assert events + _events(lazy) == _events(_engine())


def _run(page_at: float | None, preemption: str | None = "class"):
    cluster = SimClusterConfig(name="one", instances=[SimInstanceConfig(
        gpu="A100-80G", model="Llama-3.1-8B", max_inflight=1)])
    batch = TraceQuery(id="batch", question="a long batch question",
                       nodes=[TraceNode("g", "generate", "llm", (), 2000, OUTPUT)])
    page = TraceQuery(id="page", question="a short page question",
                      nodes=[TraceNode("g", "generate", "llm", (), 500, 40)])
    queries, arrivals = [batch], [0.0]
    if page_at is not None:
        queries.append(page)
        arrivals.append(page_at)
    sim = Simulation(cluster, "oracle", preemption=preemption)
    result = sim.run(queries, arrivals, [None] * len(queries), [1.0] * len(queries),
                     tenants=["evalrun", "page"][:len(queries)],
                     classes=["batch", "interactive"][:len(queries)])
    return {r.id.split(":")[1]: r for r in result.records}


def test_a_call_past_half_its_length_is_left_to_finish_not_stopped_at_its_last_bucket(
        ) -> None:
    """With true lengths, stopping the batch call pays when its redo (what it wrote) is
    less than what is left of it: before about 750 of its 1500 tokens, not after. The page
    question arrives when the batch call has written 900 (its last event said 512)."""
    alone = _run(None)["batch"]
    per_token = alone.latency_s / OUTPUT  # an upper bound: the prefill is in it too
    # 900 tokens in (at most 900 x the mean step, so no fewer than the prefill's share)
    late = _run(alone.latency_s - (OUTPUT - 900) * per_token)
    assert late["batch"].preemptions == 0
    assert late["page"].finish > late["batch"].finish  # it waited for the batch call
    # early on (about 300 tokens in, 256 by its events) stopping pays, as before
    early = _run(alone.latency_s - (OUTPUT - 300) * per_token)
    assert early["batch"].preemptions == 1
    assert early["page"].finish < early["batch"].finish


@pytest.mark.parametrize("page_at", [None, 3.0])
def test_with_preemption_off_the_counts_are_never_read(page_at, monkeypatch) -> None:
    def refuse(self, t):
        raise AssertionError("tokens_written read with preemption off")

    monkeypatch.setattr(SimInstance, "tokens_written", refuse)
    records = _run(page_at, preemption=None)
    assert all(r.status == "done" for r in records.values())
