"""Engines built from the same GPU, model and tensor parallelism share one operator model
(its step-size caches fill once per fleet), and that changes no step time."""

from agentflow import hardware
from agentflow.sim.engine import SimInstance
from agentflow.step_time import OperatorModel, StepShape


def _pair():
    gpu, model = hardware.gpu("H100"), hardware.model("Llama-3.1-8B")
    return (SimInstance(gpu, model, name="a"), SimInstance(gpu, model, name="b"),
            OperatorModel(hardware.calibrated(gpu, model), model))


def test_same_profiles_share_one_operator_model():
    a, b, _ = _pair()
    assert a.ops is b.ops
    other = SimInstance(hardware.gpu("A100-80G"), hardware.model("Llama-3.1-8B"), name="c")
    assert other.ops is not a.ops


def test_shared_model_prices_steps_as_a_fresh_one():
    a, b, fresh = _pair()
    shapes = [([1] * 5, [900, 1200, 40, 7, 3000]), ([1, 1, 700], [100, 2000, 0]),
              ([2048], [0]), ([333, 1], [16, 5000])]
    for ns, ctx in shapes:  # a fills the shared caches; b reads them; fresh computes anew
        a.step_time(ns, ctx)
    for ns, ctx in shapes:
        want = fresh.step(StepShape.of(ns, ctx))
        assert b.step_time(ns, ctx) == want
