"""The queue's order where the contention is (issue 38): an engine with slots (llama-server)
is given at most its free slots, the rest wait in agentflow's queue and are released in the
queue policy's order as slots free; a batching engine is told each call's queue rank
(``classes.engine_priority``) for its own waiting queue and preemption, and the simulator's
engine orders by it. Counted, not timed."""

from __future__ import annotations

from agentflow.config import InstanceConfig
from agentflow.scheduler import Coordinator
from agentflow.scheduler.setup import instance_spec
from agentflow.sim.engine import SimInstance
from agentflow.workflow import ManualClock
from tests.scheduler.utils import FixedLengths, chain_run


def test_llama_server_slots_hold_the_rest_in_agentflows_queue_released_by_rank() -> None:
    cfg = InstanceConfig(name="cpu-0", backend={"type": "llama_server", "parallel": 2})
    spec = instance_spec(cfg)
    assert spec.max_inflight == 2  # the server's slots
    c = Coordinator([spec], clock=ManualClock(0.0), policy="flowsage",
                    length_model=FixedLengths({"s": 20}))
    calls = {}
    for qid, deadline in (("a", 900.0), ("b", 900.0), ("loose", 800.0), ("tight", 60.0)):
        c.on_query_arrival(qid, deadline=deadline, run=chain_run(qid, deadline, ["s"]))
        calls[qid], _ = c.on_call_ready(qid, stage="s", node_id=f"{qid}.0", prompt_tokens=50)
    assert [calls[q].state.name for q in ("a", "b", "loose", "tight")] == [
        "RUNNING", "RUNNING", "WAITING", "WAITING"]  # two slots: the rest wait here
    c.clock.advance(1.0)  # type: ignore[attr-defined]
    started = c.on_call_done(calls["a"], output_tokens=20, ttft_s=0.1, total_s=1.0)
    # the slot goes to the query most likely to miss, not to the one that came first
    assert [d.call.query.id for d in started] == ["tight"]


def test_the_simulated_engine_admits_and_preempts_by_the_rank_it_is_told() -> None:
    """The engine's waiting heap and its KV preemption read the priority the coordinator
    sends, so with the queue's rank in it the engine's order is the queue's."""
    from agentflow import hardware

    eng = SimInstance(hardware.gpu("A6000"), hardware.model("Llama-3.1-8B"),
                      max_num_seqs=1)
    eng.add("first-come", 200, 5, priority=500, now=0.0)
    eng.add("late-urgent", 200, 5, priority=100, now=0.0)
    eng.add("late-loose", 200, 5, priority=900, now=0.0)
    finished = [e.seq_id for e in eng.step_until(60.0) if e.kind == "finished"]
    assert finished == ["late-urgent", "first-come", "late-loose"]
