"""Simulated clusters, by name or from a YAML file.

    name: my-cluster
    instances:
      - {gpu: A100-80G, model: Llama-3.1-70B, weight_bits: 4, kv_bits: 4, count: 2}
      - {gpu: L40S, model: Llama-3.1-8B, tensor_parallel: 1, max_num_seqs: 128}
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentflow import hardware


class SimInstanceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: str
    model: str
    weight_bits: int = 16
    kv_bits: int = 16
    tensor_parallel: int = 1
    count: int = 1
    name: str | None = None  # defaults to "<gpu>-<n>"
    max_num_seqs: int = 64  # the engine's batch limit
    max_num_batched_tokens: int = 8192
    # Calls the coordinator admits to the instance at once (also bounded by the engine's KV
    # cache); the rest wait in its local queue, where the queue policy orders them.
    max_inflight: int = 64
    # Admitted calls without a first token yet: the engine prefills at most
    # max_num_batched_tokens per step, so a couple of pending prefills keep it busy while
    # the rest wait where the queue policy can order them.
    max_pending_prefill: int | None = 2

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str) -> str:
        hardware.gpu(value)
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        hardware.model(value)
        return value


class SimClusterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "cluster"
    instances: list[SimInstanceConfig] = Field(min_length=1)

    def expanded(self) -> list[tuple[str, SimInstanceConfig]]:
        """One (unique name, config) per instance, ``count`` expanded."""
        out, seen = [], {}
        for inst in self.instances:
            for _ in range(inst.count):
                base = inst.name or inst.gpu.lower()
                seen[base] = seen.get(base, -1) + 1
                out.append((f"{base}-{seen[base]}", inst))
        return out

    @property
    def gpu_types(self) -> list[str]:
        return sorted({i.gpu for i in self.instances})


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


def load_cluster(name_or_path: str) -> SimClusterConfig:
    if name_or_path in CLUSTERS:
        return CLUSTERS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"unknown cluster {name_or_path!r}: not a name "
                         f"({', '.join(CLUSTERS)}) nor a YAML file")
    data = yaml.safe_load(path.read_text())
    return SimClusterConfig.model_validate(data)
