"""Instances of unknown speed, and instances that have answered nothing yet (issue 39 item 5).

Two serving anomalies, both from pricing an instance at starting rates that do not describe
it: (1) on scripted instances (no hardware profile; the CPU constants price their 0.2 s
answers at seconds) admission by backlog refused 2 and 4 of 10 queries on a near-idle
cluster; (2) on two identical CPU instances, the one that had measured the loaded host
looked slower than its untried twin, and every candidate queued on the twin while it sat
idle. Counted, not timed: each test failed before the change (noted per test).
"""

from __future__ import annotations

import pytest

from agentflow.config import InstanceConfig
from agentflow.scheduler import Coordinator, InstanceSpec, QueryRejected
from agentflow.scheduler.backlog import speed_unmeasured
from agentflow.scheduler.setup import instance_spec
from agentflow.scheduler.time_model import CPU_DECODE_S_PER_TOKEN, InstanceTimeModel
from agentflow.workflow import ManualClock
from tests.scheduler.utils import FixedLengths, chain_run


def _cluster(backend: str, *, n: int = 2, **kw) -> Coordinator:
    cfgs = [InstanceConfig(name=f"local-{i}", backend={"type": backend}) for i in range(n)]
    return Coordinator([instance_spec(c) for c in cfgs], clock=ManualClock(0.0),
                       policy="flowsage", length_model=FixedLengths({"s": 100}), **kw)


def _admit(c: Coordinator, qid: str, deadline: float) -> None:
    c.on_query_arrival(qid, deadline=deadline, run=chain_run(qid, deadline, ["s", "s", "s"]))


def test_the_config_says_which_instances_have_a_known_speed() -> None:
    def spec(**kw) -> InstanceSpec:
        return instance_spec(InstanceConfig(name="i", **kw))

    assert spec(gpu="H100", model="Llama-3.1-8B").speed_known
    assert spec(backend={"type": "local"}).speed_known  # the CPU constants' own engine
    assert spec(backend={"type": "llama_server"}).speed_known
    scripted = spec(backend={"type": "scripted"})
    assert not scripted.speed_known and scripted.backend == "scripted"
    assert not spec(backend={"type": "openai", "base_url": "http://x", "model": "m"}).speed_known
    assert not InstanceTimeModel.for_spec(scripted).speed_known


def test_a_scripted_cluster_is_not_refused_on_a_guessed_speed() -> None:
    """Before: the third query was refused (3 x 100 tokens at the CPU's 0.027 s = 8.1 s of
    work a query, two of them 8.1 s on two instances, past a 5 s SLO)."""
    c = _cluster("scripted", admit_by_backlog=True)
    assert speed_unmeasured(c)
    for q in "abcd":
        _admit(c, q, deadline=5.0)
    assert set(c.queries) == set("abcd")


def test_a_known_speed_is_still_held_to_its_backlog() -> None:
    c = _cluster("llama_server", admit_by_backlog=True)
    assert not speed_unmeasured(c)
    _admit(c, "a", deadline=5.0)
    _admit(c, "b", deadline=5.0)  # 8.1 s on two instances: 4.05 s
    with pytest.raises(QueryRejected, match="to clear the work"):
        _admit(c, "c", deadline=5.0)


def test_one_answer_measures_the_instance_and_its_peers_then_the_backlog_counts() -> None:
    c = _cluster("scripted", admit_by_backlog=True)
    _admit(c, "a", deadline=5.0)
    call, _ = c.on_call_ready("a", stage="s", node_id="a.0", prompt_tokens=0)
    assert call.instance == "local-0"
    c.clock.advance(0.2)  # type: ignore[attr-defined]
    c.on_call_progress(call, 1)
    c.on_call_done(call, output_tokens=100, ttft_s=0.0, total_s=0.2)
    assert not speed_unmeasured(c)
    # the first answer replaces the guess (before: 0.8 x 1 + 0.2 x its ratio)
    ratio = 0.2 / (99 * CPU_DECODE_S_PER_TOKEN)
    assert c.time_models["local-0"].decode_ratio == pytest.approx(ratio)
    # local-1 has answered nothing: priced as its measured peer, not at the CPU guess
    probe, _ = c.on_call_ready("a", stage="s", node_id="a.1", prompt_tokens=0)
    assert c.expected_s(probe, "local-1") == pytest.approx(c.expected_s(probe, "local-0"))
    assert c.expected_s(probe, "local-1") < 0.3


def test_an_untried_twin_is_priced_as_its_measured_peer() -> None:
    """Before: all three calls went to local-0 (one ran, two queued) while local-1 — which
    had measured the loaded host at 3x the CPU constants — sat idle: local-0, untried, was
    priced at the constants, so waiting there looked no worse than running on local-1."""
    c = _cluster("llama_server")
    slow = c.time_models["local-1"]
    for _ in range(20):  # a loaded host: 3x the constants, prefill and decode
        prefill = 3 * slow.prefill_s(2000)
        slow.observe(2000, 50, prefill, prefill + 3 * 49 * slow.decode_s_per_token)
    c._models_epoch += 1
    c.length_model.lengths["s"] = 50
    c.on_query_arrival("q", deadline=None)
    placed = [c.on_call_ready("q", stage="s", node_id=f"q.{i}", prompt_tokens=2000)[0].instance
              for i in range(3)]
    assert sorted(placed) == ["local-0", "local-0", "local-1"]


def test_an_instance_with_answers_of_its_own_keeps_them() -> None:
    c = _cluster("llama_server")
    a, b = c.time_models["local-0"], c.time_models["local-1"]
    a.observe(1000, 50, 3 * a.prefill_s(1000), 3 * a.prefill_s(1000) + 49 * 0.1)
    b.observe(1000, 50, b.prefill_s(1000), b.prefill_s(1000) + 49 * b.decode_s_per_token)
    c._models_epoch += 1
    assert c._borrowed(0, a) is None and c._borrowed(1, b) is None
    assert c._coef_vectors()[1].tolist() == [a.prefill_s_per_token * a.prefill_ratio,
                                             b.prefill_s_per_token * b.prefill_ratio]
