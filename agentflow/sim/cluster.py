"""Simulated clusters, by name or from a cluster file — the same file serving reads.

    name: my-cluster
    instances:
      - {gpu: A100-80G, model: Llama-3.1-70B, weight_bits: 4, kv_bits: 4, count: 2}
      - {gpu: L40S, model: Llama-3.1-8B, tensor_parallel: 1, max_num_seqs: 128}

Instances are ``agentflow.config.InstanceConfig`` (every field documented there). A full
agentflow config (``agentflow serve --config``: pipeline, slo_s, backends, ...) is a cluster
file too: the simulator takes its instances and checks the rest as serving would.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentflow.config import AgentFlowConfig, InstanceConfig, expand_instances

# The simulator's name for the shared instance description (kept for its call sites).
SimInstanceConfig = InstanceConfig


class SimClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "cluster"
    instances: list[InstanceConfig] = Field(min_length=1)

    @field_validator("instances")
    @classmethod
    def _simulable(cls, value: list[InstanceConfig]) -> list[InstanceConfig]:
        for inst in value:
            if inst.gpu is None or inst.model is None:
                raise ValueError(f"instance {inst.name or '(unnamed)'}: the simulator needs "
                                 "its gpu and model (hardware profiles)")
        expand_instances(value)  # names must come out unique
        return value

    def expanded(self) -> list[tuple[str, InstanceConfig]]:
        """One (unique name, config) per instance, ``count`` expanded — the names serving
        gives the same instances."""
        return [(inst.label, inst) for inst in expand_instances(self.instances)]


CLUSTERS: dict[str, SimClusterConfig] = {
    # HexGen-Flow's testbed: four GPUs of three kinds, each serving Llama-3.1-70B with
    # 4-bit weights and KV cache.
    "paper-4gpu": SimClusterConfig(name="paper-4gpu", instances=[
        SimInstanceConfig(gpu="A100-80G", model="Llama-3.1-70B", weight_bits=4, kv_bits=4,
                          count=2),
        SimInstanceConfig(gpu="A6000", model="Llama-3.1-70B", weight_bits=4, kv_bits=4),
        SimInstanceConfig(gpu="L40S", model="Llama-3.1-70B", weight_bits=4, kv_bits=4),
    ]),
    "h100-8b-4": SimClusterConfig(name="h100-8b-4", instances=[
        SimInstanceConfig(gpu="H100", model="Llama-3.1-8B", count=4)]),
    "mixed-qwen": SimClusterConfig(name="mixed-qwen", instances=[
        SimInstanceConfig(gpu="H200", model="Qwen3-30B-A3B"),
        SimInstanceConfig(gpu="A40", model="Qwen3-30B-A3B", weight_bits=8),
        SimInstanceConfig(gpu="L40S", model="Qwen3-30B-A3B", weight_bits=8)]),
    # A service-scale heterogeneous fleet: 64 single-GPU Llama-3.1-8B instances on five GPU
    # generations (the decision-cost target of issue 10: every policy < 1 ms per decision).
    "hetero-64": SimClusterConfig(name="hetero-64", instances=[
        SimInstanceConfig(gpu="H200", model="Llama-3.1-8B", count=8),
        SimInstanceConfig(gpu="H100", model="Llama-3.1-8B", count=16),
        SimInstanceConfig(gpu="A100-80G", model="Llama-3.1-8B", count=16),
        SimInstanceConfig(gpu="L40S", model="Llama-3.1-8B", count=12),
        SimInstanceConfig(gpu="A6000", model="Llama-3.1-8B", count=12)]),
}


def _hetero(copies: int) -> SimClusterConfig:
    """``hetero-64``'s mix, ``copies`` times over: the fleet sizes of issue 36 (1,024 and
    4,096 instances), where a decision's and a simulated event's cost must not grow with
    the fleet."""
    mix = [(inst.gpu, inst.count) for inst in CLUSTERS["hetero-64"].instances]
    return SimClusterConfig(name=f"hetero-{64 * copies}", instances=[
        SimInstanceConfig(gpu=gpu, model="Llama-3.1-8B", count=count * copies)
        for gpu, count in mix])


# 128 H200 / 256 H100 / 256 A100-80G / 192 L40S / 192 A6000, and four times that
CLUSTERS["hetero-1024"] = _hetero(16)
CLUSTERS["hetero-4096"] = _hetero(64)


def load_cluster(name_or_path: str) -> SimClusterConfig:
    """A named cluster, or a cluster file: ``name`` + ``instances``, or a whole agentflow
    config (its other settings are validated as serving would, then left to serving)."""
    if name_or_path in CLUSTERS:
        return CLUSTERS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"unknown cluster {name_or_path!r}: not a name "
                         f"({', '.join(CLUSTERS)}) nor a YAML file")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or "instances" not in data:
        raise ValueError(f"{path}: a cluster file is a mapping with an 'instances' list")
    if set(data) - {"name", "instances"}:
        AgentFlowConfig.load(path)  # a serving config: it must be a valid one
    return SimClusterConfig.model_validate({"name": data.get("name") or path.stem,
                                            "instances": data["instances"]})
