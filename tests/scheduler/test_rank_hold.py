"""The rank-aware hold (``scheduler.risk.hold_for_rank``): under flowsage a safe query's long
prompt waits in agentflow's queue while a call of a query at risk of missing its deadline
decodes on the instance, so its prefill chunks do not stall that call's decode steps; with
too little slack to wait, with a prompt too short to be worth waiting the at-risk call's
remainder for (``HOLD_WAIT_PER_STALL``), or under a queue that does not rank by deadline risk
(fcfs), it starts at once."""

from __future__ import annotations

import pytest

from agentflow.scheduler import risk
from agentflow.sim.cluster import SimClusterConfig, SimInstanceConfig
from agentflow.sim.driver import Simulation, StageTiming
from agentflow.sim.workload import TraceNode, TraceQuery

URGENT = TraceQuery(id="u", question="q1", nodes=[TraceNode("a", "generate", "llm", (), 600,
                                                            1500)])
RICH = TraceQuery(id="r", question="q2", nodes=[TraceNode("a", "generate", "llm", (), 12000,
                                                          40)])


def _run(policy: str, rich_slo_s: float, rich: TraceQuery = RICH) -> dict[str, StageTiming]:
    cluster = SimClusterConfig(name="one", instances=[
        SimInstanceConfig(name="gpu", gpu="A100-80G", model="Llama-3.1-8B")])
    seen: list[StageTiming] = []
    sim = Simulation(cluster, policy, on_stage=seen.append)
    result = sim.run([URGENT, rich], [0.0, 2.0], [1.0, rich_slo_s], [10.0, 1.0])
    assert all(r.status == "done" for r in result.records)
    return {s.query_id.split(":")[1]: s for s in seen}


def _ran_from(st: StageTiming) -> float:
    return st.end - st.run_s


def test_slack_rich_prefill_waits_for_the_at_risk_decode():
    got = _run("flowsage", 600.0)
    assert _ran_from(got["r"]) >= got["u"].end - 1e-9  # its prompt ran after u's last token
    plain = _run("marginal_delay+fcfs", 600.0)
    assert _ran_from(plain["r"]) < plain["u"].end  # fcfs: beside it, stalling its decode
    assert got["u"].end < plain["u"].end  # and u finishes sooner for it


@pytest.mark.parametrize("slo", [2.0, 3.0])
def test_no_hold_without_the_slack_to_wait(slo: float):
    got = _run("flowsage", slo)
    assert _ran_from(got["r"]) < got["u"].end


# A 1,000-token prompt prefills in ~0.1 s on the A100, while the at-risk call has ~2.8 s of
# decode left by its length distribution when it arrives: waiting that out for a 0.1 s stall
# is not worth it (the long prompt above, ~1.1 s, is).
SHORT = TraceQuery(id="r", question="q2", nodes=[TraceNode("a", "generate", "llm", (), 1000,
                                                           40)])


def test_short_prompt_is_not_held_for_a_long_remainder():
    got = _run("flowsage", 600.0, SHORT)
    assert _ran_from(got["r"]) < 3.0  # at once, not after u's last token (~21.8 s)
    assert got["u"].end > 20.0


def test_unbounded_wait_holds_the_short_prompt_too(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(risk, "HOLD_WAIT_PER_STALL", None)
    got = _run("flowsage", 600.0, SHORT)
    assert _ran_from(got["r"]) >= got["u"].end - 1e-9
