"""The hold's second rule (``scheduler.risk._spares_stall``): under flowsage a safe query's
long prompt also waits while the decoders on its instance that end soonest would each be
spared its prefill for less than the wait — here four short calls that the prompt's
~1.1 s of prefill would all stall, which end ~1 s sooner for it — unless that wait is more
than ``HOLD_SPARE_SLACK_SHARE`` of its slack, or the rule is off."""

from __future__ import annotations

import pytest

from agentflow.scheduler import risk
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.driver import Simulation, StageTiming
from agentflow.sim.workload import TraceNode, TraceQuery


def _query(name: str, prompt: int, output: int) -> TraceQuery:
    return TraceQuery(id=name, question=name,
                      nodes=[TraceNode("a", "generate", "llm", (), prompt, output)])


DECODERS = [_query(f"d{i}", 200, 60) for i in range(4)]
LONG = _query("r", 12000, 40)  # ~1.1 s of prefill on the A100 (8B)


def _run(long_slo_s: float = 600.0) -> dict[str, StageTiming]:
    cluster = SimClusterConfig(name="one", instances=[
        SimInstanceConfig(name="gpu", gpu="A100-80G", model="Llama-3.1-8B")])
    seen: list[StageTiming] = []
    sim = Simulation(cluster, "flowsage", on_stage=seen.append)
    n = len(DECODERS)
    result = sim.run([*DECODERS, LONG], [0.0] * n + [0.5], [600.0] * n + [long_slo_s],
                     [1.0] * (n + 1))
    assert all(r.status == "done" for r in result.records)
    return {s.query_id.split(":")[1]: s for s in seen}


def _ran_from(st: StageTiming) -> float:
    return st.end - st.run_s


def _decoders_end(got: dict[str, StageTiming]) -> float:
    return max(got[q.id].end for q in DECODERS)


def test_long_prompt_waits_while_the_decoders_it_would_stall_end():
    got = _run()
    first_end = min(got[q.id].end for q in DECODERS)
    assert _ran_from(got["r"]) >= first_end - 1e-9  # not beside them from its arrival
    assert _decoders_end(got) < 1.2  # they end ~1 s sooner than beside its chunks (~2 s)


def test_off_the_prompt_starts_at_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(risk, "HOLD_SPARE_SLACK_SHARE", None)
    got = _run()
    assert _ran_from(got["r"]) < 0.6
    assert _decoders_end(got) > 1.8


def test_no_wait_beyond_its_share_of_the_slack():
    got = _run(long_slo_s=30.0)  # 1% of ~28 s of slack is less than any decoder's remainder
    assert _ran_from(got["r"]) < 0.6
