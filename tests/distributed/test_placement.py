"""``placement: ray`` in the cluster file and what each instance asks Ray for (no Ray needed),
and the grid map's serial path."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentflow.config import AgentFlowConfig, InstanceConfig
from agentflow.distributed.grid import run_grid_timed
from agentflow.distributed.placement import (
    ACCELERATOR_SLIVER,
    RayPlacement,
    actor_backend_spec,
    actor_resources,
    fits,
    tensor_parallel,
)


def test_placement_shorthand_and_full_form():
    cfg = AgentFlowConfig.model_validate({"placement": "ray", "instances": [{"name": "a"}]})
    assert cfg.placement == RayPlacement(address="auto")
    cfg = AgentFlowConfig.model_validate({
        "placement": {"type": "ray", "address": "ray://head:10001", "max_restarts": -1},
        "instances": [{"name": "a"}]})
    assert cfg.placement.address == "ray://head:10001" and cfg.placement.max_restarts == -1
    assert AgentFlowConfig.model_validate({"instances": [{"name": "a"}]}).placement is None


@pytest.mark.parametrize("bad", ["kubernetes", {"type": "ray", "adress": "auto"},
                                 {"type": "ray", "max_restarts": -2}])
def test_bad_placement_is_rejected_with_the_field(bad):
    with pytest.raises(ValidationError) as err:
        AgentFlowConfig.model_validate({"placement": bad, "instances": [{"name": "a"}]})
    assert "placement" in str(err.value)


def test_gpu_instance_asks_for_its_tp_gpus_and_gpu_type():
    placement = RayPlacement()
    a100 = InstanceConfig(name="a", gpu="A100-80G", tensor_parallel=2,
                          backend={"type": "vllm", "model": "m"})
    need = actor_resources(a100, placement)
    assert need.num_gpus == 2 and need.num_cpus == 0
    assert need.resources == {"accelerator_type:A100": ACCELERATOR_SLIVER}
    l40s = InstanceConfig(name="b", gpu="L40S", backend={"type": "scripted"})
    assert actor_resources(l40s, placement).resources == {"accelerator_type:L40S":
                                                          ACCELERATOR_SLIVER}
    assert tensor_parallel(l40s) == 1
    custom = RayPlacement(accelerator_types={"L40S": "NVIDIA-L40S"})
    assert list(actor_resources(l40s, custom).resources) == ["accelerator_type:NVIDIA-L40S"]


def test_tp_in_engine_args_must_agree_with_the_instance_field():
    inst = InstanceConfig(name="x", gpu="H100", tensor_parallel=4, backend={
        "type": "vllm", "model": "m", "engine_args": {"tensor_parallel_size": 4}})
    assert actor_resources(inst, RayPlacement()).num_gpus == 4
    inst = InstanceConfig(name="x", gpu="H100", backend={
        "type": "vllm", "model": "m", "engine_args": {"tensor_parallel_size": 2}})
    with pytest.raises(ValueError, match="set tensor_parallel: 2"):
        actor_resources(inst, RayPlacement())


def test_vllm_actor_spec_gets_tp_and_in_actor_workers():
    inst = InstanceConfig(name="a", gpu="A100-80G", tensor_parallel=4,
                          backend={"type": "vllm", "model": "m"})
    args = actor_backend_spec(inst)["engine_args"]
    assert args == {"tensor_parallel_size": 4, "distributed_executor_backend": "mp"}
    one = InstanceConfig(name="b", gpu="L40S", backend={"type": "vllm", "model": "m"})
    assert actor_backend_spec(one)["engine_args"] == {"tensor_parallel_size": 1}
    assert "engine_args" not in inst.backend  # the config itself is untouched


def test_example_ray_cluster_file_loads():
    from pathlib import Path

    cfg = AgentFlowConfig.load(Path(__file__).parents[2] / "examples" / "ray-cluster.yaml")
    needs = [actor_resources(i, cfg.placement) for i in cfg.instances]
    assert [n.num_gpus for n in needs] == [4, 4, 4]
    assert [list(n.resources) for n in needs] == [["accelerator_type:A100"]] * 2 + \
        [["accelerator_type:L40S"]]


def test_cpu_instances():
    placement = RayPlacement()
    llama = InstanceConfig(name="cpu", backend={"type": "local", "n_threads": 2})
    need = actor_resources(llama, placement)
    assert (need.num_cpus, need.num_gpus, need.resources) == (2, 0, {})
    scripted = InstanceConfig(name="s", backend={"type": "scripted"})
    assert actor_resources(scripted, placement).num_cpus == 0
    with pytest.raises(ValueError, match="needs a 'gpu'"):
        actor_resources(InstanceConfig(name="v", backend={"type": "vllm", "model": "m"}),
                        placement)


def test_fits_checks_every_resource():
    need = actor_resources(InstanceConfig(name="a", gpu="A100-80G",
                                          backend={"type": "scripted"}), RayPlacement())
    assert fits(need, {"GPU": 2, "accelerator_type:A100": 1, "CPU": 4})
    assert not fits(need, {"GPU": 2, "accelerator_type:L40S": 1})
    assert not fits(need, {"accelerator_type:A100": 1})


def _square(cell: int, offset: int) -> int:
    return cell * cell + offset


def test_serial_grid_keeps_order_and_reports():
    seen = []
    run = run_grid_timed(_square, [3, 1, 2], context=10, on_result=lambda i, r: seen.append(i))
    assert run.results == [19, 11, 14] and seen == [0, 1, 2] and run.where == "serial"
