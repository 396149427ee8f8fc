"""How long one engine iteration takes: the sum of its operators, each on its own roofline.

On a GPU the operators of a forward pass run one after another, so their times add: a small
prefill chunk does not hide inside a memory-bound decode step, and a batch's decode
attention (bandwidth-bound, one read of every sequence's KV cache) adds to the weight reads
of the linear layers. Each operator ``o`` of a layer takes

    t_o = latency_o + max(FLOPs_o / (peak FLOP/s * compute eff_o),
                          bytes_o / (peak bandwidth * bandwidth eff_o))

with the efficiencies and latencies of its class in ``agentflow.hardware.GPUProfile``
(fitted once per class on measured operator times: ``agentflow bench fit_operators``). A step of
``T`` tokens over ``S`` sequences, ``B`` of which decode one token (the others prefill a chunk
of ``n_i`` tokens after ``c_i`` cached ones) is, per layer:

* linear: the four GEMMs (qkv projection, output projection, gated MLP up, MLP down) at ``T``
  tokens; a mixture-of-experts MLP reads the fraction ``1 - (1 - active/total)^T`` of its
  expert weights (what a batch of ``T`` tokens is expected to touch);
* element-wise: the two norms, rotary embedding, activation and residual add at ``T`` tokens,
  and the write of the step's keys and values into the paged cache;
* decode attention: one kernel over the ``B`` decoding sequences, reading ``sum(c_i + 1)``
  tokens of KV cache;
* prefill attention: one kernel over the prefilling sequences, ``sum(n_i c_i + n_i (n_i+1)/2)``
  query-key pairs over ``sum(c_i + n_i)`` cached tokens (a sliding-window model's local
  layers count only the pairs inside the window, and read at most the window's KV:
  ``ModelProfile.sliding_window``, ``windowed_pairs``; its decodes too);

times the layers; plus, once per step, the LM head at ``S`` rows, the tensor-parallel
all-reduces (``tp > 1``) and a fixed per-step overhead (scheduling, input preparation,
sampling, launch); on a CPU core, a pass computing more than one sequence adds the host's
``GPUProfile.cpu_multi_seq_s`` (fitted by ``agentflow calibrate`` on its batched rows).

On a GPU four kernel effects Vidur's A100 rows show sit on top of the rooflines (fitted on
half of the rows, checked on the other half: ``agentflow bench fit_operators``). Each is a
count of work units over what the GPU holds at once (its ``sm_count`` times the kernel's
occupancy), with a partial last wave (``wave_factor``):

* a GEMM computes whole M tiles (``gemm_tile_tokens``, 128; below it the next power of
  two), so 136 tokens cost what 256 do; its (M x ``gemm_tile_features``) output tiles run
  ``gemm_ctas_per_sm`` per SM, a partial last wave costing ``gemm_wave_penalty`` of a wave
  (below one wave split-K spreads them); near the knee its compute and weight-streaming
  times meet as a p-norm (``gemm_knee_p``) rather than a sharp maximum;
* the norms and the gated activation run one thread block per token
  (``elementwise_blocks_per_sm`` per SM), each streaming its row at most at
  ``elementwise_block_bw_gbs``: a kernel takes the longer of its bytes at the element-wise
  bandwidth and its waves of rows (one token's activation is a latency-bound row read);
* decode attention runs a thread block per (sequence, KV head), ``attn_blocks_per_sm`` per
  SM; a split-KV kernel splits the KV to fill the GPU while they fit in one round, and above
  it a partial last round costs ``attn_wave_penalty`` of a round;
* a prefill chunk of ``n`` tokens reaches ``n / (n + half)`` of the attention efficiency
  (``prefill_attn_half_tokens``; the factor stops at 2 below ``half`` tokens).

Where compute and memory do not overlap (``GPUProfile.overlap_compute_memory`` false: one CPU
core running llama.cpp, whose one thread both streams the weights and does the dequantising
dot products), an operator's two terms add instead of taking their maximum. That is what makes
a CPU decode step grow with the batch: the weights are read once per step, but every
sequence's dot products cost the core its own time, where a GPU hides a small batch's FLOPs
under the weight read. There, too, a decode token's GEMM rows run at their own compute
efficiency (``decode_compute_efficiency``): a batch of a few decode rows runs llama.cpp's
quantised matrix-vector path rather than a prefill chunk's matrix-matrix one (fitted on this
build with contention taken out: 0.31 vs 0.34 of the core's fp32 peak, nearly equal — the
serial roofline is what makes a batch's decode grow; ``agentflow bench real_vs_sim
--calibrate --cpu-share --fit-batched``). The GPU profiles keep the maximum (and ignore
that class).

Everything here works on Python floats and on numpy arrays alike with the same float
operations in the same order, so a vectorised run of decode steps gives bit-identical times
to steps computed one at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow.hardware import GPUProfile, ModelProfile


def _max(a, b):
    """``max`` of two floats or element-wise of arrays, with the same result either way."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b else b


def _min(a, b):
    """``min`` of two floats or element-wise of arrays, as ``_max``."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a <= b else b


def _add(a, b):
    """The serial roofline: compute and memory time do not hide each other."""
    return a + b


def tile_rows(T: int, tile: int) -> int:
    """Rows a tensor-core GEMM computes for ``T`` tokens: its M tile is the smallest power of
    two >= ``T`` up to ``tile``, and larger batches fill whole tiles, so the padding rows
    cost compute time (why a step of 136 tokens costs what one of 256 does on an A100)."""
    if tile <= 1 or T <= 0:
        return T
    if T >= tile:
        return -(-T // tile) * tile
    return 1 << (T - 1).bit_length()


def wave_factor(ctas: float, slots: int, penalty: float) -> float:
    """Time of ``ctas`` equal thread blocks on ``slots`` resident places (SMs x blocks per
    SM) over the time at full occupancy: above one wave, the last partial wave leaves them
    idle for the fraction ``penalty`` of a wave's time (0: work spreads evenly, 1: a whole
    wave is paid). Below one wave the kernel splits its work to fill the GPU (FlashInfer's
    split-KV, cuBLAS's split-K), so 1."""
    w = ctas / slots if slots > 0 else 0.0
    if w <= 1.0 or penalty <= 0.0:
        return 1.0
    return ((1.0 - penalty) * w + penalty * math.ceil(w)) / w


@dataclass(frozen=True)
class StepShape:
    """What one iteration computes, in the sums the operator model needs."""

    tokens: int  # T: tokens computed this step (decode + prefill)
    seqs: int  # S: sequences in the step (rows of the LM head)
    decode_seqs: int = 0  # B: sequences computing one token
    decode_kv: int = 0  # sum over them of (cached context + 1): KV tokens attended
    prefill_tokens: int = 0  # sum of chunk lengths n_i of the prefilling sequences
    prefill_pairs: int = 0  # sum of n_i * c_i + n_i * (n_i + 1) / 2
    prefill_kv: int = 0  # sum of c_i + n_i

    @classmethod
    def of(cls, ns, contexts) -> StepShape:
        """Sequence ``i`` computes ``ns[i]`` tokens on top of ``contexts[i]`` cached ones; one
        token is a decode (a decode kernel attends to it), more a prefill chunk."""
        ns, contexts = [int(n) for n in ns], [int(c) for c in contexts]
        for n, c in zip(ns, contexts):
            if n < 1 or c < 0:
                raise ValueError(f"a sequence computes >= 1 token over >= 0 cached ones, got "
                                 f"{n} over {c}")
        return cls(*step_sums(ns, contexts))


def step_sums(ns, contexts) -> tuple[int, int, int, int, int, int, int]:
    """``(T, S, B, decode_kv, prefill_tokens, prefill_pairs, prefill_kv)`` of a step, without
    checks: the one place a step's shape is summed, shared by ``StepShape.of`` (which checks
    first) and the simulated engine's scheduler (which builds the counts itself, once per
    scheduling decision, where a dataclass and checks would cost it time)."""
    T = S = B = dkv = pt = pp = pkv = 0
    for n, c in zip(ns, contexts):
        T += n
        S += 1
        if n == 1:
            B += 1
            dkv += c + 1
        else:
            pt += n
            pp += n * c + n * (n + 1) // 2
            pkv += c + n
    return T, S, B, dkv, pt, pp, pkv


def windowed_pairs(c: int, n: int, window: int) -> int:
    """Query-key pairs of a chunk of ``n`` tokens after ``c`` cached ones when each query
    attends to at most ``window`` keys (itself included): ``sum(min(c + i, window))`` for
    ``i`` in 1..n, in closed form."""
    a, b = c + 1, c + n
    if b <= window:
        return (a + b) * n // 2
    if a > window:
        return window * n
    return (a + window) * (window - a + 1) // 2 + window * (b - window)


class OperatorModel:
    """The operator rooflines of one model on ``tp`` GPUs of one kind (constants precomputed).

    ``gpu`` is used as given (apply ``hardware.calibrated`` first for fitted constants)."""

    def __init__(self, gpu: GPUProfile, model: ModelProfile, tensor_parallel: int = 1):
        if tensor_parallel < 1:
            raise ValueError("tensor_parallel must be >= 1")
        self.gpu, self.model, self.tp = gpu, model, tensor_parallel
        tp = tensor_parallel
        m = model
        hd, h, kv = m.head_dim, m.heads, m.kv_heads
        qd, kvd = h * hd, kv * hd
        ffn = m.ffn_hidden or 4 * m.hidden
        wb = m.weight_bits / 8
        kvb = m.kv_bits / 8
        self.layers = m.layers
        peak = gpu.peak_tflops * 1e12  # one GPU: the work below is per GPU
        bw = gpu.mem_bw_gbs * 1e9
        # max(compute, memory) where the two overlap (GPUs), their sum where they do not.
        self._serial = not gpu.overlap_compute_memory
        self._roof = _add if self._serial else _max
        self._f_lin = peak * gpu.compute_efficiency
        self._f_dec = peak * gpu.decode_compute_efficiency
        self._b_lin = bw * gpu.bw_efficiency
        # GEMMs of one layer as (in, out) features.
        attn_params = m.hidden * (qd + 2 * kvd) + qd * m.hidden
        mlp_active = 3 * m.hidden * ffn
        dense = m.active_params_b >= m.params_b
        emb = m.vocab * m.hidden
        mlp_total: float = float(mlp_active)
        if not dense:
            mlp_total = max(mlp_active, (m.params_b * 1e9 - 2 * emb - m.layers * attn_params)
                            / m.layers)
        self._moe_rho = None if dense else mlp_active / mlp_total
        self._gemms = ((m.hidden, qd + 2 * kvd, 1.0), (qd, m.hidden, 1.0),
                       (m.hidden, 2 * ffn, mlp_total / mlp_active),
                       (ffn, m.hidden, mlp_total / mlp_active))
        self._wb = wb
        self._lat_lin = gpu.linear_latency_s
        self._tile = gpu.gemm_tile_tokens
        self._knee_p = gpu.gemm_knee_p
        # output tiles of (tokens x features) per GEMM, in waves of the tiles the SMs hold
        self._tile_n = gpu.gemm_tile_features
        self._gemm_slots = gpu.sm_count * gpu.gemm_ctas_per_sm
        self._gemm_wave = gpu.gemm_wave_penalty
        self._half_eff = gpu.gemm_half_tile_efficiency
        # Element-wise bytes per token and layer (2-byte activations): two RMS norms
        # (read + write hidden), rotary embedding (q and k in place), gated activation
        # (read 2 ffn, write ffn), residual add (two reads, one write).
        # (the two norms and the activation run a thread block per token; rope and the
        # residual add are plain element-wise kernels over all elements)
        self._elem_rows = (2.0 * 2 * m.hidden, 2.0 * 2 * m.hidden, 2.0 * 3 * ffn / tp)
        self._elem_flat = 2.0 * (2 * (qd + kvd) / tp + 3 * m.hidden)
        self._elem_tok = sum(self._elem_rows) + self._elem_flat
        self._b_elem = bw * gpu.elementwise_bw_efficiency
        self._lat_elem = 5 * gpu.elementwise_latency_s
        # a GPU element-wise kernel runs one thread block per token, each streaming its
        # row at most at one block's rate, in waves of the blocks the SMs hold at once
        self._elem_slots = gpu.sm_count * gpu.elementwise_blocks_per_sm
        self._b_block = gpu.elementwise_block_bw_gbs * 1e9
        # KV-cache write: read the step's keys and values, write them into the paged cache.
        kv_tok = 2 * kvd * max(1, tp // max(1, kv)) / tp if tp > 1 else 2 * kvd
        self._kvw_tok = kv_tok * (2 + kvb)
        self._lat_kvw = gpu.kv_write_latency_s
        # Attention: bytes of KV per attended token and layer (on one GPU), FLOPs per pair.
        self._kv_tok = kv_tok * kvb
        self._flop_pair = 4.0 * qd / tp
        self._q_tok = 2.0 * 2 * qd / tp  # read q, write o (2 bytes each)
        self._b_dec = bw * gpu.attn_bw_efficiency
        self._lat_dec = gpu.decode_attn_latency_s
        self._f_pf = peak * gpu.prefill_attn_efficiency
        self._lat_pf = gpu.prefill_attn_latency_s
        # decode attention runs one thread block per (sequence, KV head) on each GPU; the
        # blocks resident at once are the kernel's blocks per SM times the SMs
        self._kv_heads_gpu = max(1, kv // tp)
        self._slots = gpu.sm_count * gpu.attn_blocks_per_sm
        self._wave = gpu.attn_wave_penalty
        self._pf_half = gpu.prefill_attn_half_tokens
        # Sliding-window attention: the local layers' share of the layers, whose queries
        # attend to at most ``sliding_window`` keys (``windowed_pairs``); 0: none.
        self._window = m.sliding_window
        self._local = 0.0
        if m.sliding_window > 0:
            every = m.sliding_window_pattern
            self._local = (m.layers - (m.layers // every if every > 0 else 0)) / m.layers
        self._lm = (m.hidden, m.vocab / tp, m.hidden * m.vocab * m.head_bits / 8 / tp)
        self._overhead = gpu.step_overhead_s
        # a CPU pass computing more than one sequence costs this on top (host-fitted)
        self._multi = gpu.cpu_multi_seq_s if self._serial else 0.0
        # T (serial: (T, B)) -> linear + element-wise seconds per layer; S (or (S, B)) -> head
        self._per_tok: dict[Any, float] = {}
        self._head: dict[Any, float] = {}
        self._comm = None
        if tp > 1:
            self._comm = (2 * m.layers * gpu.comm_latency_s,
                          2 * m.layers * 2 * (tp - 1) / tp * m.hidden * 2
                          / (gpu.interconnect_gbs * 1e9))

    # ------------------------------------------------------------------ one layer, seconds
    def gemm_work(self, i: int, T):
        """(FLOPs, bytes) of GEMM ``i`` of the layer (0 qkv projection, 1 output projection,
        2 MLP gate+up, 3 MLP down) at ``T`` tokens, on one GPU."""
        k, n, expert = self._gemms[i]
        w = k * n * self._wb / self.tp
        if expert != 1.0 and self._moe_rho is not None:
            w = w * expert * (1.0 - (1.0 - self._moe_rho) ** T)
        return 2.0 * k * n / self.tp * T, w + 2.0 * (k + n) / self.tp * T

    def gemm(self, i: int, T, B=0):
        """GEMM ``i`` at ``T`` tokens, ``B`` of them decode rows (they matter only where
        compute and memory do not overlap: see ``_compute_s``)."""
        flops, nbytes = self.gemm_work(i, T)
        if self._serial:
            return self._lat_lin + self._compute_s(flops, T, B) + nbytes / self._b_lin
        if not T:
            return self._lat_lin + self._gpu_roof(flops, nbytes)
        t = self._tiled(i, T, flops, nbytes, self._tile, 1.0)
        half = self._tile // 2
        if self._half_eff > 0.0 and T > half >= 1:
            # the half-height kernel: fewer padding rows above a full tile (T = 136-192
            # computes 192 rows, not 256), each at a lower efficiency; the faster one runs
            t = _min(t, self._tiled(i, T, flops, nbytes, half, self._half_eff))
        return self._lat_lin + t

    def _tiled(self, i: int, T, flops, nbytes, tile: int, efficiency: float):
        """Seconds of GEMM ``i``'s kernel with ``tile``-row M tiles (relative compute
        ``efficiency``) at ``T`` tokens, less its latency: padded rows, waves of output
        tiles, the knee's roofline."""
        rows = tile_rows(T, tile)
        flops = flops * rows / T / efficiency
        if self._tile_n > 0:
            n = self._gemms[i][1] / self.tp
            tiles = rows // min(rows, tile) * -(-n // self._tile_n)
            flops = flops * wave_factor(tiles, self._gemm_slots, self._gemm_wave)
        return self._gpu_roof(flops, nbytes)

    def _gpu_roof(self, flops, nbytes):
        """A GPU GEMM's roofline: near the knee the kernel is slower than either asymptote,
        so the two terms meet as a p-norm (``gemm_knee_p``; infinity: the plain max)."""
        c, m = flops / self._f_lin, nbytes / self._b_lin
        p = self._knee_p
        if math.isinf(p):
            return _max(c, m)
        return (c ** p + m ** p) ** (1.0 / p)

    def _compute_s(self, flops, rows, decode_rows):
        """Compute seconds of a serial (CPU) GEMM whose ``decode_rows`` of ``rows`` are
        decode tokens: those run at the decode efficiency, the others at the prefill one
        (one kernel runs them all; the split prices a mixed step between the two)."""
        if not rows:
            return 0.0
        return flops * ((rows - decode_rows) / rows / self._f_lin
                        + decode_rows / rows / self._f_dec)

    def linear(self, T, B=0):
        """The layer's four GEMMs at ``T`` tokens (``B`` of them decodes)."""
        return (self.gemm(0, T, B) + self.gemm(1, T, B) + self.gemm(2, T, B)
                + self.gemm(3, T, B))

    def norms_act_bytes(self, T):
        return self._elem_tok * T

    def norms_act(self, T):
        """The layer's two norms, rotary embedding, activation and residual add.

        On a GPU each kernel takes the longer of its bytes at the element-wise bandwidth
        and its waves of per-token blocks (``ceil(T / (SMs x blocks per SM))``), each wave
        one row at one block's streaming rate: a few tokens cost a row's latency-bound
        read, not their share of the bandwidth; 256 tokens take two waves on an A100
        (216 resident blocks), 192 one. On a CPU: latency plus bytes."""
        if self._serial or self._b_block <= 0 or not T:
            return self._lat_elem + self.norms_act_bytes(T) / self._b_elem
        waves = -(-T // self._elem_slots) / self._b_block
        t = self._lat_elem + self._elem_flat * T / self._b_elem
        for row in self._elem_rows:
            t += _max(row * T / self._b_elem, row * waves)
        return t

    def kv_write(self, T):
        """Writing the step's keys and values into the paged cache (bytes at element-wise
        bandwidth, not Vidur's measured 0.55 us/token: see agentflow bench fit_operators)."""
        return self._lat_kvw + self._kvw_tok * T / self._b_elem

    def elementwise(self, T):
        return self.norms_act(T) + self.kv_write(T)

    def attention_work(self, q_tokens, pairs, kv_tokens):
        """(FLOPs, bytes) of an attention kernel: ``q_tokens`` queries over ``pairs``
        query-key pairs reading ``kv_tokens`` of KV cache, on one GPU."""
        return (self._flop_pair * pairs,
                self._kv_tok * kv_tokens + self._q_tok * q_tokens)

    def decode_attention(self, B, kv_tokens):
        """One decode-attention kernel: ``B`` sequences attending to ``kv_tokens`` in all."""
        if not B:
            return 0.0
        if self._local:
            # a local layer's decode reads at most the window of each sequence's KV: exact
            # for one sequence (and for B all past the window or all within it), an upper
            # bound for a batch that mixes both (the sums do not say which attends how far)
            kv_tokens = kv_tokens - self._local * (kv_tokens - _min(kv_tokens, B * self._window))
        mem = (self._kv_tok * kv_tokens + self._q_tok * B) / self._b_dec
        if not self._serial:
            mem = mem * wave_factor(B * self._kv_heads_gpu, self._slots, self._wave)
        return self._lat_dec + self._roof(self._flop_pair * kv_tokens / self._f_pf, mem)

    def prefill_attention(self, tokens, pairs, kv_tokens):
        """One prefill-attention kernel over chunks of ``tokens`` in all."""
        if not tokens:
            return 0.0
        if self._local:
            pairs, kv_tokens = self._windowed(tokens, pairs, kv_tokens)
        compute = self._flop_pair * pairs / self._f_pf
        if not self._serial:
            # a chunk of n tokens reaches n / (n + half) of the efficiency (fewer query
            # tiles than the SMs hold); below ``half`` tokens other kernels take over, so
            # the factor stops at 2
            n = max(tokens, self._pf_half)
            compute = compute * (n + self._pf_half) / n
        return self._lat_pf + self._roof(compute,
                                         (self._kv_tok * kv_tokens + self._q_tok * tokens)
                                         / self._b_dec)

    def _windowed(self, tokens, pairs, kv_tokens):
        """(pairs, KV tokens) of a prefill pass averaged over the layers, the local ones
        counting only the pairs inside the window. Why it matters: on gemma-3 (15 of 18
        layers local, window 512) the causal pairs grow with the square of the context
        where the real cost does not, so a fit on prompts of 32-2048 tokens put the
        prompts of ~1k tokens 5-6% short and those of 256 and 2048 2-4% long (stop 50's
        idle calibrations); with the window the same rows fit within ~1%. One sequence's
        chunk (``pairs`` is then exactly its causal count) is windowed exactly; several
        sequences' chunks in one pass, whose sums do not say how far each attends, keep the
        bound ``tokens * window`` on their pairs and their KV as summed."""
        n, kv, W = int(tokens), int(kv_tokens), self._window
        c = kv - n
        if not self.several_sequences(0, tokens, pairs, kv_tokens):
            local_pairs, local_kv = windowed_pairs(c, n, W), min(kv, W - 1 + n)
        else:  # several chunks: no single sequence has these sums (n_i * n_j > 0)
            local_pairs, local_kv = min(int(pairs), n * W), kv
        f = self._local
        return pairs - f * (pairs - local_pairs), kv_tokens - f * (kv - local_kv)

    # ------------------------------------------------------------------- once per step
    def lm_head_work(self, S):
        """(FLOPs, bytes) of the LM head (``head_bits`` weights) over ``S`` rows, on one GPU."""
        k, n, w = self._lm
        return 2.0 * k * n * S, w + 2.0 * (k + n) * S

    def lm_head(self, S, B=0):
        flops, nbytes = self.lm_head_work(S)
        if self._serial:
            if not S:  # a llama.cpp ubatch that samples no row skips the head
                return 0.0
            return self._lat_lin + self._compute_s(flops, S, B) + nbytes / self._b_lin
        return self._lat_lin + _max(flops / self._f_lin, nbytes / self._b_lin)

    def allreduce(self, T):
        """Tensor-parallel all-reduces of the step (two per layer), 0 on one GPU."""
        if self._comm is None:
            return 0.0
        return self._comm[0] + self._comm[1] * T

    def fixed(self, T):
        """Per-step seconds outside the layers' kernels: overhead and all-reduces."""
        add = self._overhead
        if self._comm is not None:
            add = add + self._comm[0] + self._comm[1] * T
        return add

    def step(self, shape: StepShape) -> float:
        """Seconds of one iteration."""
        return float(self.step_parts(shape.tokens, shape.seqs, shape.decode_seqs,
                                     shape.decode_kv, shape.prefill_tokens,
                                     shape.prefill_pairs, shape.prefill_kv))

    def step_parts(self, T, S, B, decode_kv, pf_tokens=0, pf_pairs=0, pf_kv=0):
        """``step`` on the sums directly; ``decode_kv`` may be an array (one step each)."""
        # a simulation sees few distinct step sizes (and, serial, decode counts)
        kt, ks = ((T, B), (S, B)) if self._serial else (T, S)
        per_tok = self._per_tok.get(kt)
        if per_tok is None:
            per_tok = self._per_tok[kt] = float(self.linear(T, B) + self.elementwise(T))
        head = self._head.get(ks)
        if head is None:
            head = self._head[ks] = float(self.lm_head(S, B))
        layer = (per_tok + self.decode_attention(B, decode_kv)
                 + self.prefill_attention(pf_tokens, pf_pairs, pf_kv))
        out = layer * self.layers + head + self.fixed(T)
        if self._multi and self.several_sequences(B, pf_tokens, pf_pairs, pf_kv):
            out = out + self._multi
        return out

    @staticmethod
    def several_sequences(B, pf_tokens, pf_pairs, pf_kv) -> bool:
        """Whether a pass of these sums computes more than one sequence: two decodes, a
        decode beside a prompt chunk, or several chunks (one chunk's ``pf_pairs`` is exactly
        its causal count over ``pf_kv - pf_tokens`` cached tokens; no two chunks' sums are,
        since ``n_i * n_j > 0``)."""
        if B >= 2 or (B and pf_tokens):
            return True
        if not pf_tokens:
            return False
        n, c = int(pf_tokens), int(pf_kv) - int(pf_tokens)
        return not (c >= 0 and int(pf_pairs) == n * c + n * (n + 1) // 2)

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per operator class over all layers, and the per-step terms."""
        L = self.layers
        out = {
            "linear": float(self.linear(shape.tokens, shape.decode_seqs)) * L,
            "elementwise": float(self.elementwise(shape.tokens)) * L,
            "decode_attention": float(self.decode_attention(shape.decode_seqs,
                                                            shape.decode_kv)) * L,
            "prefill_attention": float(self.prefill_attention(
                shape.prefill_tokens, shape.prefill_pairs, shape.prefill_kv)) * L,
            "lm_head": float(self.lm_head(shape.seqs, shape.decode_seqs)),
            "allreduce": float(self.allreduce(shape.tokens)),
            "overhead": self._overhead + (self._multi if self._multi and self.several_sequences(
                shape.decode_seqs, shape.prefill_tokens, shape.prefill_pairs, shape.prefill_kv)
                else 0.0),
        }
        return out
