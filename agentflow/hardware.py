"""Hardware and model profiles: what the time model and the simulator know about a GPU
and an LLM, from public spec sheets and model configs.

Numbers are dense (no sparsity) FP16/BF16 tensor throughput and HBM/GDDR bandwidth. Real
kernels reach a fraction of these; ``efficiency`` factors say how much, and the scheduler's
time model corrects them online from observed timings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUProfile:
    name: str
    peak_tflops: float  # dense FP16/BF16 tensor-core TFLOP/s
    mem_bw_gbs: float  # memory bandwidth, GB/s
    mem_gb: float
    compute_efficiency: float = 0.55  # fraction of peak FLOP/s reached in prefill GEMMs
    bw_efficiency: float = 0.6  # fraction of peak bandwidth reached in decode


@dataclass(frozen=True)
class ModelProfile:
    name: str
    params_b: float  # total parameters, billions
    active_params_b: float  # parameters touched per token (MoE: the active experts)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    weight_bits: int = 16
    kv_bits: int = 16

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bits / 8

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bits / 8

    def quantized(self, weight_bits: int, kv_bits: int | None = None) -> "ModelProfile":
        from dataclasses import replace

        return replace(self, name=f"{self.name}-w{weight_bits}", weight_bits=weight_bits,
                       kv_bits=kv_bits if kv_bits is not None else self.kv_bits)


GPUS: dict[str, GPUProfile] = {g.name: g for g in (
    GPUProfile("A100-80G", peak_tflops=312, mem_bw_gbs=2039, mem_gb=80),
    GPUProfile("A100-40G", peak_tflops=312, mem_bw_gbs=1555, mem_gb=40),
    GPUProfile("H100", peak_tflops=989, mem_bw_gbs=3350, mem_gb=80),
    GPUProfile("H200", peak_tflops=989, mem_bw_gbs=4800, mem_gb=141),
    GPUProfile("A6000", peak_tflops=154.8, mem_bw_gbs=768, mem_gb=48),
    GPUProfile("L40S", peak_tflops=362, mem_bw_gbs=864, mem_gb=48),
    GPUProfile("A40", peak_tflops=149.7, mem_bw_gbs=696, mem_gb=48),
)}

MODELS: dict[str, ModelProfile] = {m.name: m for m in (
    ModelProfile("Llama-3.1-70B", params_b=70.6, active_params_b=70.6, layers=80, hidden=8192,
                 heads=64, kv_heads=8, head_dim=128),
    ModelProfile("Llama-3.1-8B", params_b=8.03, active_params_b=8.03, layers=32, hidden=4096,
                 heads=32, kv_heads=8, head_dim=128),
    ModelProfile("Qwen3-30B-A3B", params_b=30.5, active_params_b=3.3, layers=48, hidden=2048,
                 heads=32, kv_heads=4, head_dim=128),
    # The embedded default (llama.cpp on CPU): timed by measurement, not by a roofline.
    ModelProfile("gemma-3-270m", params_b=0.27, active_params_b=0.27, layers=18, hidden=640,
                 heads=4, kv_heads=1, head_dim=256, weight_bits=4),
)}


def gpu(name: str) -> GPUProfile:
    try:
        return GPUS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None


def model(name: str) -> ModelProfile:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None
