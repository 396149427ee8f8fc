"""Where a simulated sequence's time goes (``SimInstance.attribute``): prefill, decode, the
stall co-running prefill chunks add to decode steps, and the same work alone."""

from __future__ import annotations

import pytest

from agentflow import hardware
from agentflow.sim.engine import SimInstance

A100 = hardware.gpu("A100-80G")
L8B = hardware.model("Llama-3.1-8B")


def make(attribute: bool = True, **kw) -> SimInstance:
    inst = SimInstance(A100, L8B, request_overhead_s=0.0, **kw)
    inst.attribute = attribute
    return inst


def drain(inst: SimInstance) -> list:
    events = []
    while (t := inst.next_event_time()) is not None:
        events += inst.step_until(t)
    return events


def test_alone_equals_solo():
    inst = make()
    inst.add("a", 3000, 200, 0, 0.0)
    drain(inst)
    (a,) = inst.attributed
    assert a.stall_s == 0.0 and a.lost_s == 0.0 and a.queue_s == 0.0
    assert a.prefill_s == pytest.approx(a.solo_prefill_s, rel=1e-9)
    assert a.decode_s == pytest.approx(a.solo_decode_s, rel=1e-9)
    assert a.run_s == pytest.approx(a.prefill_s + a.decode_s, rel=1e-9)


def test_prefill_beside_decode_is_a_stall():
    """A long prompt admitted while ``a`` decodes: ``a``'s decode steps carrying the
    chunks are charged as stall, and ``a`` runs longer than alone by about that much."""
    inst = make(max_num_batched_tokens=2048)
    inst.add("a", 500, 400, 0, 0.0)
    inst.step_until(0.5)  # a is decoding
    inst.add("b", 12000, 50, 0, 0.5)
    drain(inst)
    got = {x.seq_id: x for x in inst.attributed}
    a, b = got["a"], got["b"]
    assert a.stall_s > 0.0
    assert a.decode_s - a.stall_s >= a.solo_decode_s * 0.999  # decodes beside decodes: slower
    assert a.run_s == pytest.approx(a.prefill_s + a.decode_s, rel=1e-9)
    # b's prompt shared its steps with a's decodes: slower than alone, not a stall
    assert b.prefill_s > b.solo_prefill_s and b.stall_s == 0.0
    excess = a.run_s - a.solo_prefill_s - a.solo_decode_s
    assert a.stall_s <= excess * 1.0001


def test_attribution_changes_no_event():
    def run(attribute: bool) -> list:
        inst = make(attribute, max_num_batched_tokens=2048, num_gpu_blocks=900)
        for i in range(6):
            inst.add(f"s{i}", 1500 + 700 * i, 300 + 50 * i, i % 2, 0.1 * i)
        return [(e.kind, e.seq_id, e.time, e.output_tokens_so_far) for e in drain(inst)]
    assert run(True) == run(False)


def test_preemption_is_lost_time():
    inst = make(max_num_batched_tokens=2048, num_gpu_blocks=260)  # 4160 KV tokens
    inst.add("hi", 1000, 1500, 0, 0.0)
    inst.add("lo", 1000, 1500, 1, 0.0)
    drain(inst)
    got = {x.seq_id: x for x in inst.attributed}
    assert got["lo"].preempted >= 1 and got["lo"].lost_s > 0.0
    assert got["hi"].preempted == 0 and got["hi"].lost_s == 0.0
