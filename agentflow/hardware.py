"""Hardware and model profiles: what the time model and the simulator know about a GPU
and an LLM, from public spec sheets and model configs.

Numbers are dense (no sparsity) FP16/BF16 tensor throughput and HBM/GDDR bandwidth. Real
kernels reach a fraction of these; ``efficiency`` factors say how much, and the scheduler's
time model corrects them online from observed timings. ``mem_gb`` is read as GiB (2**30
bytes), the unit ``nvidia-smi`` reports.

Calibration: ``CALIBRATIONS`` holds per-(GPU, model, weight precision) constants fitted to
measured vLLM single-request latencies (``agentflow bench sim_calibration`` re-derives them and
prints the fit); ``calibrated(gpu, model)`` returns the GPU profile with them applied, or the
profile unchanged where no calibration exists. Only physical constants are fitted: the
fraction of peak bandwidth reached streaming weights, the fraction reached reading the KV
cache in decode attention, and a fixed per-request front-end cost.

Operator constants (``OPERATOR_FIT``, the defaults of every ``GPUProfile``): the step-time model
(``agentflow.step_time``) times each operator class on its own roofline; its efficiencies
and kernel latencies are fitted once per class on measured A100 operator times by
``agentflow bench fit_operators``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# Written by agentflow bench fit_operators on the even half of Vidur's rows (sorted by their
# key, alternate rows); it prints every class's error on the odd, held-out half.
OPERATOR_FIT: dict[str, float] = {
    "linear_latency_s": 8.242e-06,
    "compute_efficiency": 0.7351,
    "bw_efficiency": 0.8052,
    "gemm_knee_p": 3.229,
    "gemm_wave_penalty": 0.08734,
    "gemm_half_tile_efficiency": 0.8229,
    "elementwise_latency_s": 9.373e-07,
    "elementwise_bw_efficiency": 0.4702,
    "elementwise_block_bw_gbs": 5.713,
    "decode_attn_latency_s": 1.72e-05,
    "attn_bw_efficiency": 0.8375,
    "attn_wave_penalty": 0.2798,
    "prefill_attn_latency_s": 1.1e-05,
    "prefill_attn_efficiency": 0.5567,
    "prefill_attn_half_tokens": 532.4,
    "kv_write_latency_s": 2.55e-05,
}
_F = OPERATOR_FIT


@dataclass(frozen=True)
class GPUProfile:
    name: str
    peak_tflops: float  # dense FP16/BF16 tensor-core TFLOP/s
    mem_bw_gbs: float  # memory bandwidth, GB/s
    mem_gb: float  # GiB
    # Operator efficiencies and kernel latencies (agentflow.step_time): a step is the sum of
    # its operators, each on its own roofline. Fitted once per operator class on measured A100
    # operator times (Vidur's profiles of Llama-3-8B, TP 1, ../shared/profiles/vidur-a100) by
    # agentflow bench fit_operators; other GPUs keep these fractions of their own spec-sheet
    # peaks until data for them say otherwise.
    # GEMMs: fractions of peak FLOP/s and of peak bandwidth streaming weights; latency per
    # GEMM kernel.
    compute_efficiency: float = _F["compute_efficiency"]
    bw_efficiency: float = _F["bw_efficiency"]
    linear_latency_s: float = _F["linear_latency_s"]
    # Norms, rope, activation, residual add (and the KV write's bytes): bandwidth fraction,
    # latency per kernel; the KV-cache write kernel's latency.
    elementwise_bw_efficiency: float = _F["elementwise_bw_efficiency"]
    elementwise_latency_s: float = _F["elementwise_latency_s"]
    # vLLM's norm and activation kernels run one thread block per token (up to 1,024
    # threads: 2 resident per SM, whose limit is 2,048 threads on A100/H100/H200/L40S),
    # each block streaming its row at most at ``elementwise_block_bw_gbs`` (one block's
    # loads in flight over the memory latency): below a wave a few tokens cost a row's
    # latency-bound read; waves of tokens beyond (0: no per-block limit).
    elementwise_blocks_per_sm: int = 2
    elementwise_block_bw_gbs: float = _F["elementwise_block_bw_gbs"]
    kv_write_latency_s: float = _F["kv_write_latency_s"]
    # How a GEMM's compute and weight-streaming terms meet near the knee: their p-norm
    # (infinity: the plain maximum); and the M tile of its tensor-core kernels (a batch of
    # T tokens computes T rounded up to the tile, or to a power of two below it).
    gemm_knee_p: float = _F["gemm_knee_p"]
    gemm_tile_tokens: int = 128
    # Its N tile (output features; 0: no wave quantisation), the CTAs of that tile one SM
    # holds, and the share of a wave a partial last wave of output tiles costs (below one
    # wave split-K spreads the tiles over the SMs: agentflow.step_time.wave_factor).
    gemm_tile_features: int = 128
    gemm_ctas_per_sm: int = 1
    gemm_wave_penalty: float = _F["gemm_wave_penalty"]
    # The library's other kernel at the knee: half-height M tiles (gemm_tile_tokens / 2
    # rows), whose compute runs at this fraction of the full tile's efficiency (less reuse
    # of each loaded operand); a GEMM runs whichever of the two is faster for its shape
    # (agentflow.step_time.OperatorModel.gemm). 0: one kernel only.
    gemm_half_tile_efficiency: float = _F["gemm_half_tile_efficiency"]
    # Decode attention reading the KV cache: fraction of peak bandwidth and kernel latency.
    attn_bw_efficiency: float = _F["attn_bw_efficiency"]
    decode_attn_latency_s: float = _F["decode_attn_latency_s"]
    # Streaming multiprocessors; the decode-attention blocks one SM holds at once (its
    # occupancy: a split-KV decode kernel such as FlashInfer's sizes its grid to
    # blocks/SM x SMs and splits the KV only while a (sequence, KV head) block each fits in
    # it; 3 on the A100 rows, where the split stops between 40 and 41 sequences of 8 KV
    # heads: 320 <= 324 < 328; register-bound, so the same on GPUs with 64K registers per
    # SM); and the share of a round a partial last round of those blocks costs
    # (agentflow.step_time.wave_factor).
    sm_count: int = 108
    attn_blocks_per_sm: int = 3
    attn_wave_penalty: float = _F["attn_wave_penalty"]
    # Prefill attention (and attention FLOPs in general): fraction of peak FLOP/s, latency;
    # a chunk of n tokens reaches n / (n + half) of that efficiency (fewer query tiles than
    # SMs can hold).
    prefill_attn_efficiency: float = _F["prefill_attn_efficiency"]
    prefill_attn_latency_s: float = _F["prefill_attn_latency_s"]
    prefill_attn_half_tokens: float = _F["prefill_attn_half_tokens"]
    # Fixed cost of one engine iteration: scheduling, input preparation, sampling and the
    # launch of the (CUDA-graph) forward pass. Not identifiable from single-request timings
    # (it trades off against bw_efficiency) nor from kernel profiles (they time the GPU
    # only); a prior from vLLM V1's per-step CPU time.
    step_overhead_s: float = 0.002
    # Fixed cost per request outside the GPU loop (HTTP, tokenisation, streaming).
    request_overhead_s: float = 0.0
    interconnect_gbs: float = 25.0  # per-direction GPU-GPU bandwidth (PCIe 4.0 x16 ~ 25)
    # Whether an operator's compute and memory traffic overlap, so it takes the larger of
    # the two (a GPU: thousands of warps hide loads under FLOPs), or add (one CPU core: the
    # same thread streams the weights and runs the dequantising dot products, so each
    # sequence of a decode batch costs its own compute on top of the shared weight read).
    overlap_compute_memory: bool = True
    # Where they do not overlap: fraction of peak FLOP/s a decode token's GEMM rows reach
    # (matrix-vector dot products; agentflow.step_time). Unused where they overlap.
    decode_compute_efficiency: float = _F["compute_efficiency"]
    comm_latency_s: float = 2e-5  # latency of one all-reduce
    # Where they do not overlap: a llama.cpp CPU pass of fewer rows than this streams each
    # GEMM's (and the LM head's) weights once per row, its matrix-vector path; from this
    # many rows up one read serves them all (0: always one read). Host-fitted by agentflow
    # calibrate (4 on this project's AMD EPYC VM; agentflow.sim.llama_batches).
    cpu_tiled_rows: float = 0.0
    # Where they do not overlap: seconds a llama.cpp CPU forward pass costs on top of its
    # operators when it computes more than one sequence (a batch of decodes, a decode beside
    # a prompt chunk). Why: on this project's EPYC VM a decode step of 2 or of 4 sequences
    # through llama-server cost ~10-12 ms more than the operator sums with per-row weight
    # reads price (46-52 ms against 35-38 for 2, 62-72 against 54-61 for 4, at 32- and
    # 512-token contexts alike: a per-pass cost, not a per-row one; stop 50's idle
    # calibrations), which no single-request row shows. Host-fitted by agentflow calibrate
    # on its batched rows (0: none, every stored profile, every GPU).
    cpu_multi_seq_s: float = 0.0
    # A CPU host's co-run factor: the CPU seconds a unit of work costs on one core while no
    # other local instance is busy, over what it costs beside busy ones. ``agentflow
    # calibrate`` fits a host's profile with all its local instances busy at once (as they
    # serve) and then times a fixed probe on each instance alone and beside its busy
    # neighbours (``host_calibration.measure_corun``); the simulator multiplies a local
    # engine's iterations by it while none of the host's other engines is busy
    # (``agentflow.sim.host_corun``). 1.0: no difference (every stored profile, every GPU).
    cpu_alone_factor: float = 1.0
    # A CPU host's per-instance speed: (instance name, factor) pairs, each the CPU seconds the
    # speed probe typically cost on that instance's core (the median of every probe of every
    # calibration try, with its neighbours busy) over what it cost while the rows these
    # constants were fitted on were timed. Why: a VM's speed moves ~20% within minutes, so
    # one try's rows catch one phase, and its pinned cores need not run at one speed; the
    # simulator multiplies a local engine's iterations by its instance's factor
    # (``llamacpp_server.configure_engine``). Empty: 1.0 for every instance (every stored
    # profile, every GPU, host profiles stored before it).
    cpu_instance_speed: tuple[tuple[str, float], ...] = ()


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
    ffn_hidden: int = 0  # MLP intermediate size per token (MoE: active experts'); 0: 4*hidden
    vocab: int = 128256
    head_bits: int = 16  # LM head weights (GGUF files often keep a tied embedding in 8 bits)
    # Sliding-window attention (tokens; 0: none). llama-server checkpoints such a model's
    # window state near each prompt's end, which changes how it chunks prompts, and its
    # local layers attend to at most this many keys (``agentflow.step_time``).
    sliding_window: int = 0
    # With a window: every N-th layer attends to the whole context (a global layer), the
    # others to the window (llama.cpp's ``swa_pattern``; gemma-3: 6, five local layers to
    # one global); 0: every layer is local.
    sliding_window_pattern: int = 0

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bits / 8

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bits / 8

    @property
    def base_name(self) -> str:
        """The model's name without the ``-wN`` suffixes ``quantized`` adds."""
        return re.sub(r"(-w\d+)+$", "", self.name)

    def quantized(self, weight_bits: int, kv_bits: int | None = None) -> ModelProfile:
        return replace(self, name=f"{self.base_name}-w{weight_bits}", weight_bits=weight_bits,
                       kv_bits=kv_bits if kv_bits is not None else self.kv_bits)


GPUS: dict[str, GPUProfile] = {g.name: g for g in (
    GPUProfile("A100-80G", peak_tflops=312, mem_bw_gbs=2039, mem_gb=80,
               interconnect_gbs=300),  # NVLink3: 600 GB/s both directions
    GPUProfile("A100-40G", peak_tflops=312, mem_bw_gbs=1555, mem_gb=40, interconnect_gbs=300),
    GPUProfile("H100", peak_tflops=989, mem_bw_gbs=3350, mem_gb=80, interconnect_gbs=450,
               sm_count=132),
    GPUProfile("H200", peak_tflops=989, mem_bw_gbs=4800, mem_gb=141, interconnect_gbs=450,
               sm_count=132),
    GPUProfile("A6000", peak_tflops=154.8, mem_bw_gbs=768, mem_gb=48, sm_count=84),
    GPUProfile("L40S", peak_tflops=362, mem_bw_gbs=864, mem_gb=48, sm_count=142),
    GPUProfile("A40", peak_tflops=149.7, mem_bw_gbs=696, mem_gb=48, sm_count=84),
)}

MODELS: dict[str, ModelProfile] = {m.name: m for m in (
    ModelProfile("Llama-3.1-70B", params_b=70.6, active_params_b=70.6, layers=80, hidden=8192,
                 heads=64, kv_heads=8, head_dim=128, ffn_hidden=28672),
    ModelProfile("Llama-3.1-8B", params_b=8.03, active_params_b=8.03, layers=32, hidden=4096,
                 heads=32, kv_heads=8, head_dim=128, ffn_hidden=14336),
    ModelProfile("Qwen3-30B-A3B", params_b=30.5, active_params_b=3.3, layers=48, hidden=2048,
                 heads=32, kv_heads=4, head_dim=128, ffn_hidden=8 * 768, vocab=151936),
    # The embedded default (llama.cpp on CPU): timed by measurement, not by a roofline.
    ModelProfile("gemma-3-270m", params_b=0.27, active_params_b=0.27, layers=18, hidden=640,
                 heads=4, kv_heads=1, head_dim=256, weight_bits=4, ffn_hidden=2048,
                 vocab=262144, head_bits=8,  # Q4_K_M's tied embedding is Q8_0
                 # the GGUF's gemma3.attention.sliding_window; llama.cpp's gemma3 pattern
                 sliding_window=512, sliding_window_pattern=6),
)}


# One CPU core running llama.cpp's llama-server (the llama_server backend, pinned with
# ``cores``), for simulating CPU clusters and checking the simulator against a real batching
# engine (agentflow bench real_vs_sim). Peak: AVX-512, 2 FMA ports x 16 fp32 lanes at ~2.5 GHz;
# bandwidth: what one core streams. Compute and memory do not overlap on it
# (``overlap_compute_memory``), and a decode token's GEMM rows have their own compute
# efficiency (agentflow.step_time). The efficiencies and overheads are fitted to gemma-3-270m
# Q4_K_M on this project's build machine (a Sapphire Rapids Xeon, 2 cores shared with other
# work) by ``agentflow bench real_vs_sim --calibrate --cpu-share --fit-batched``: 24 single
# requests (prompts 32-2048, outputs 1-96) and 8 batches of 2 and 4 equal requests,
# 2026-12-01 11:56-12:02 UTC at load 4-6, each row's times scaled by the share of its core
# the server process got (0.34-0.70, from /proc), so the profile is a dedicated core's.
# Fit error over the 48 times: median 6.2%, max 30%; batched rows median 4.1%. Fitted on
# single requests alone, the batched rows come out up to 44% long (single requests cannot
# separate the per-sequence decode compute from the per-step weight read). Without the
# share correction (same grid, 11:15-11:21, load 3-4) the fit was median 22%, max 47%, and
# read a decode compute efficiency of 0.08: contention, not physics. ``mem_gb`` is the
# memory one instance may use.
GPUS["Xeon-core"] = GPUProfile(
    "Xeon-core", peak_tflops=0.16, mem_bw_gbs=12.0, mem_gb=8, compute_efficiency=0.3415,
    decode_compute_efficiency=0.312, bw_efficiency=0.6276, attn_bw_efficiency=0.8034,
    prefill_attn_efficiency=0.6215, step_overhead_s=1.717e-05, request_overhead_s=1e-05,
    interconnect_gbs=0.0, overlap_compute_memory=False,
    # the kernel latencies and element-wise bandwidth (OPERATOR_FIT's then) it was fitted
    # beside, pinned so that a refit of the GPU operator constants leaves this fit alone
    linear_latency_s=6.977e-06, elementwise_latency_s=3.01e-06,
    elementwise_bw_efficiency=0.4882, decode_attn_latency_s=1.682e-05)

# What each stored CPU profile was fitted on: a description, and the words a CPU model name
# must hold to count as the same hardware (agentflow.sim.host_profiles warns otherwise; the
# check tells vendors and lines apart, not generations within a line).
FITTED_ON: dict[str, tuple[str, tuple[str, ...]]] = {
    "Xeon-core": ("one core of an Intel Xeon (Sapphire Rapids)", ("Intel", "Xeon")),
}


@dataclass(frozen=True)
class Calibration:
    """Constants fitted for one GPU serving one model at one weight precision."""

    bw_efficiency: float
    attn_bw_efficiency: float
    request_overhead_s: float
    source: str = ""


# Fitted by agentflow bench sim_calibration (agentflow.sim.calibration.fit_constants): weighted
# least squares of the simulator's single-request latency (relative error) on the
# even-indexed half of traces/vllm-latency (Llama-3.1-70B on vLLM, one request at a time),
# attn_bw_efficiency shared by the three GPUs, step_overhead_s fixed at the 2 ms prior and
# every other operator constant at its OPERATOR_FIT value (the step is the operator sum of
# agentflow.step_time); the odd half is held out. These override, for this GPU, model and
# precision only, the GEMM weight-streaming and decode-attention efficiencies of OPERATOR_FIT: the
# measured latencies grow with input x output as a KV read at 0.41 of peak bandwidth for
# 4-bit KV bytes (0.82 if that vLLM stored the cache in 8 bits, close to the 0.80 Vidur's
# 16-bit decode kernel reaches). Assumes 4-bit weights and KV (HexGen-Flow's setup) and, as the data
# show, prompts served from vLLM's prefix cache (see agentflow/sim/calibration.py). The A6000's
# weight streaming comes out at 1.01 of its spec-sheet bandwidth: the per-layer fixed costs the
# step model charges at one token (kernel latencies, the KV write, the norms' and activation's
# latency-bound rows: 46 us per 70B layer, as Vidur's 70B rows show) are more than that vLLM
# build spent, and the fit takes the difference from the weight read (held-out error 0.4%).
_VLLM_70B = "traces/vllm-latency, Llama-3.1-70B w4/kv4, vLLM, single requests"
CALIBRATIONS: dict[tuple[str, str, int], Calibration] = {
    ("A100-80G", "Llama-3.1-70B", 4): Calibration(0.6674, 0.4099, 0.0485, _VLLM_70B),
    ("A6000", "Llama-3.1-70B", 4): Calibration(1.0123, 0.4099, 0.0296, _VLLM_70B),
    ("L40S", "Llama-3.1-70B", 4): Calibration(0.9905, 0.4099, 0.0184, _VLLM_70B),
}

# HexGen-Flow's testbed: four GPUs of three kinds, each serving Llama-3.1-70B w4/kv4 alone.
PAPER_4GPU: tuple[tuple[str, str], ...] = (
    ("A100-0", "A100-80G"), ("A100-1", "A100-80G"), ("A6000", "A6000"), ("L40S", "L40S"))


def paper_model() -> ModelProfile:
    """Llama-3.1-70B with 4-bit weights and 4-bit KV cache, as in the HexGen-Flow runs."""
    return model("Llama-3.1-70B").quantized(4, 4)


def calibration_for(gpu_profile: GPUProfile, model_profile: ModelProfile) -> Calibration | None:
    return CALIBRATIONS.get((gpu_profile.name, model_profile.base_name,
                             model_profile.weight_bits))


def calibrated(gpu_profile: GPUProfile | str, model_profile: ModelProfile | str) -> GPUProfile:
    """``gpu_profile`` with the fitted constants for this model applied, if any exist."""
    g = gpu(gpu_profile) if isinstance(gpu_profile, str) else gpu_profile
    m = model(model_profile) if isinstance(model_profile, str) else model_profile
    cal = calibration_for(g, m)
    if cal is None:
        return g
    return replace(g, bw_efficiency=cal.bw_efficiency,
                   attn_bw_efficiency=cal.attn_bw_efficiency,
                   request_overhead_s=cal.request_overhead_s)


_GIB = 2 ** 30


def kv_cache_blocks(gpu_profile: GPUProfile, model_profile: ModelProfile,
                    tensor_parallel: int = 1, *, max_num_seqs: int = 256,
                    max_num_batched_tokens: int = 2048, block_size: int = 16,
                    gpu_memory_utilization: float = 0.9) -> int:
    """KV-cache blocks (of ``block_size`` tokens) a vLLM engine with these limits holds:
    what memory is left per GPU after the weights and the activation peak of a full step.

        per GPU free  = mem * gpu_memory_utilization - weight_bytes / tp - activation_reserve
        activation_reserve = max_num_batched_tokens * (4 * hidden + 2 * ffn_hidden / tp) * 2 B
                             + max_num_seqs * vocab * 4 B (logits) + 1 GiB (context, graphs)
        blocks        = floor(per GPU free / (kv_bytes_per_token / tp * block_size))

    KV heads are split across tensor-parallel ranks (replicated when there are fewer heads
    than ranks). Serving (the coordinator's KV budget) and the simulator both read it here,
    so a budget means the same in both. 0 when the model does not fit."""
    tp, m = tensor_parallel, model_profile
    kvb = m.kv_bytes_per_token
    kv_per_gpu = kvb * max(1, tp // max(1, m.kv_heads)) / tp if tp > 1 else kvb
    ffn = m.ffn_hidden or 4 * m.hidden
    reserve = (max_num_batched_tokens * (4 * m.hidden + 2 * ffn / tp) * 2
               + max_num_seqs * m.vocab * 4 + _GIB)
    free = gpu_profile.mem_gb * _GIB * gpu_memory_utilization - m.weight_bytes / tp - reserve
    return int(free // (kv_per_gpu * block_size)) if free > 0 else 0


def default_max_num_batched_tokens(gpu_profile: GPUProfile | str) -> int:
    """vLLM V1's default per-step token budget for ``vllm serve`` on this GPU
    (``EngineArgs.get_batch_defaults``, OpenAI API server context): 8192 on GPUs with at
    least 70 GiB that are not an A100 (H100, H200), 2048 elsewhere — A100s included, where a
    larger budget lowered throughput (vLLM PR #17885)."""
    g = gpu(gpu_profile) if isinstance(gpu_profile, str) else gpu_profile
    return 8192 if g.mem_gb >= 70 and "a100" not in g.name.lower() else 2048


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
