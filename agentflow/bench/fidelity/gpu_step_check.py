"""Time a model's operators on a real GPU and print them beside the step model's prediction.

    agentflow bench gpu_step_check [--gpu H200] [--model Llama-3.1-8B] [--json FILE]
    agentflow bench gpu_step_check --quick --device cpu     # tiny shapes, checks the script

The GPU profiles other than the A100 (``agentflow.hardware.GPUS``) keep the operator
efficiencies fitted on Vidur's A100 rows, applied to their own spec-sheet peaks; nothing had
checked them against a measured GPU of that kind. This benchmark builds the model's layer
from its shapes (random bf16 weights, PyTorch: cuBLAS GEMMs, ``scaled_dot_product_attention``
for attention) and times, each against ``agentflow.step_time.OperatorModel`` for the named
GPU profile:

* the four GEMMs of a layer (qkv projection, output projection, MLP gate+up, MLP down) at
  T = 1 .. 4,096 tokens, and the LM head;
* the element-wise operators (two RMS norms, rotary embedding, gated activation, residual
  add: PyTorch's unfused kernels) and the KV-cache write (``index_copy_`` into a slot
  array);
* decode attention of B sequences at one context (grouped-query heads folded into the
  query length: ``q [B, kv_heads, heads/kv_heads, d]`` against ``k, v [B, kv_heads, c+1, d]``,
  which is exactly GQA decode);
* prefill attention of one chunk of n tokens after c cached ones (causal, lower-right
  aligned);
* whole steps: every layer in order (norm, qkv, rope, KV write, decode and prefill
  attention, output projection, residual, norm, MLP, residual), the final norm and the LM
  head on one row per sequence; measured against the model's layers + LM head (its
  per-step CPU overhead is not GPU time and is shown apart), and against the sum of the
  measured operators (is the step the sum of its operators on this GPU?).

Timing: CUDA graphs of ``--reps`` back-to-back calls (no launch gaps; what a CUDA-graph
engine runs), timed with CUDA events, median of ``--rounds`` replays; each operator cycles
through enough copies of its weights / KV cache to exceed 4x the L2 cache, so reads come from
HBM as they do in a real step. On ``--device cpu`` (a check of the script, not a
measurement) a plain loop with ``perf_counter``.

PyTorch is imported only when the benchmark runs (it is not one of agentflow's
dependencies). Ratios printed are simulated / measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agentflow import hardware
from agentflow.step_time import OperatorModel, StepShape

GEMM_NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096)
# decode attention: (batch, context of each sequence)
DECODE = tuple((b, c) for c in (1024, 4096, 12288) for b in (1, 8, 32, 64, 128, 256)
               if b * c <= 256 * 4096)
# prefill attention: (chunk tokens, cached tokens before it)
PREFILL = ((128, 0), (512, 0), (1024, 0), (2048, 0), (4096, 0), (1024, 4096), (2048, 8192),
           (512, 12288))
# whole steps: (decoding sequences, their context, [(chunk, cached), ...])
STEPS: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...] = (
    (1, 2048, ()), (32, 2048, ()), (128, 2048, ()), (64, 8192, ()),
    (0, 0, ((512, 0),)), (0, 0, ((2048, 0),)), (0, 0, ((1024, 4096),)),
    (32, 4096, ((1024, 4096),)), (16, 12288, ((2048, 8192),)))
QUICK = dict(tokens=(1, 4, 16), decode=((1, 64), (4, 64)), prefill=((16, 0), (16, 32)),
             steps=((2, 64, ()), (0, 0, ((16, 0),)), (2, 64, ((16, 32),))), heads=(),
             layers=2, model="gemma-3-270m", reps=2, rounds=2)
HEADS = (1, 32, 256)  # LM head rows timed besides the steps' own
L2_BYTES = 60 * 2 ** 20  # H100 / H200: 50 / 60 MB; copies are sized to 4x this


@dataclass
class Row:
    """One timed operator (or step): what, measured and predicted microseconds."""

    group: str  # gemm / elementwise / kv_write / lm_head / decode_attn / prefill_attn / step
    what: str
    measured_us: float
    predicted_us: float
    extra: dict[str, float] | None = None

    @property
    def ratio(self) -> float:
        return self.predicted_us / self.measured_us if self.measured_us > 0 else float("nan")


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise SystemExit("gpu_step_check needs PyTorch (pip install torch): it times the "
                         "operators with cuBLAS and scaled_dot_product_attention") from None
    return torch


class Timer:
    """Seconds per call of a list of equivalent callables, run round robin (each touches
    its own copy of the data, so together they exceed the L2 cache)."""

    def __init__(self, torch: Any, device: str, reps: int, rounds: int):
        self.torch, self.device, self.reps, self.rounds = torch, device, reps, rounds
        self.graphs = device.startswith("cuda")

    def __call__(self, fns: Sequence[Callable[[], Any]], reps: int | None = None) -> float:
        torch = self.torch
        n = max(reps or self.reps, len(fns))
        calls = [fns[i % len(fns)] for i in range(n)]
        if not self.graphs:
            for f in fns:
                f()
            times = []
            for _ in range(self.rounds):
                t = time.perf_counter()
                for f in calls:
                    f()
                times.append((time.perf_counter() - t) / n)
            return statistics.median(times)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up outside the graph (cuBLAS picks kernels)
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        run: Callable[[], Any]
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for f in calls:
                    f()
            run = graph.replay
        except RuntimeError as err:  # an op that cannot be captured: time it eagerly
            print(f"    (no CUDA graph: {str(err).splitlines()[0][:80]}; timed eagerly)")
            torch.cuda.synchronize()

            def run() -> None:
                for f in calls:
                    f()
        run()
        torch.cuda.synchronize()
        times = []
        for _ in range(self.rounds):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / n)
        return statistics.median(times)


def copies_for(nbytes: float, cap: int = 8) -> int:
    """Copies of an operand of ``nbytes`` so that together they exceed 4x the L2 cache."""
    return max(1, min(cap, int(-(-4 * L2_BYTES // max(1.0, nbytes)))))


class Bench:
    """The model's operators built in PyTorch on one device, timed against ``ops``."""

    def __init__(self, torch: Any, device: str, ops: OperatorModel, timer: Timer):
        self.torch, self.device, self.ops, self.timer = torch, device, ops, timer
        m = ops.model
        self.m = m
        self.dtype = torch.bfloat16
        self.qd, self.kvd = m.heads * m.head_dim, m.kv_heads * m.head_dim
        self.ffn = m.ffn_hidden or 4 * m.hidden
        self.shapes = ((m.hidden, self.qd + 2 * self.kvd), (self.qd, m.hidden),
                       (m.hidden, 2 * self.ffn), (self.ffn, m.hidden))

    def rand(self, *shape: int) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=self.dtype) * 0.02

    # ------------------------------------------------------------------ operators
    def gemm(self, i: int, T: int) -> Row:
        F = self.torch.nn.functional
        k, n = self.shapes[i]
        ws = [self.rand(n, k) for _ in range(copies_for(2 * k * n))]
        x = self.rand(T, k)
        t = self.timer([lambda w=w: F.linear(x, w) for w in ws])
        flops = 2 * k * n * T
        return Row("gemm", f"{GEMM_NAMES[i]} T={T}", t * 1e6, self.ops.gemm(i, T) * 1e6,
                   {"tflops": flops / t / 1e12, "weight_gbs": 2 * k * n / t / 1e9})

    def lm_head(self, S: int) -> Row:
        F = self.torch.nn.functional
        m = self.m
        w = self.rand(m.vocab, m.hidden)  # 1 GB in bf16 for Llama: already > 4x L2
        x = self.rand(S, m.hidden)
        t = self.timer([lambda: F.linear(x, w)])
        return Row("lm_head", f"S={S}", t * 1e6, self.ops.lm_head(S) * 1e6)

    def _elementwise_fns(self, T: int) -> Callable[[], Any]:
        torch, F, m = self.torch, self.torch.nn.functional, self.m
        h, d = m.hidden, m.head_dim
        x, r = self.rand(T, h), self.rand(T, h)
        nw = torch.ones(h, device=self.device, dtype=self.dtype)
        qk = self.rand(T, m.heads + m.kv_heads, d)
        cos, sin = self.rand(T, 1, d), self.rand(T, 1, d)
        gu = self.rand(T, 2 * self.ffn)

        def run() -> None:
            F.rms_norm(x, (h,), nw, 1e-5)
            F.rms_norm(r, (h,), nw, 1e-5)
            half = d // 2
            rot = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk.mul(cos).add_(rot.mul_(sin))
            g, u = gu.chunk(2, dim=-1)
            F.silu(g).mul_(u)
            torch.add(x, r)
        return run

    def elementwise(self, T: int) -> Row:
        t = self.timer([self._elementwise_fns(T) for _ in range(copies_for(
            self.ops.norms_act_bytes(T)))])
        return Row("elementwise", f"T={T}", t * 1e6, self.ops.norms_act(T) * 1e6)

    def kv_write(self, T: int) -> Row:
        torch = self.torch
        slots = 4 * T + 4096
        cache = torch.zeros(2, slots, self.kvd, device=self.device, dtype=self.dtype)
        kv = self.rand(2, T, self.kvd)
        idx = torch.randperm(slots, device=self.device)[:T]
        t = self.timer([lambda: cache.index_copy_(1, idx, kv)])
        return Row("kv_write", f"T={T}", t * 1e6, self.ops.kv_write(T) * 1e6)

    def decode_attention(self, B: int, c: int) -> Row:
        m = self.m
        g = m.heads // m.kv_heads
        kv_bytes = 2 * B * (c + 1) * self.kvd * 2
        q = self.rand(B, m.kv_heads, g, m.head_dim)
        caches = [(self.rand(B, m.kv_heads, c + 1, m.head_dim),
                   self.rand(B, m.kv_heads, c + 1, m.head_dim))
                  for _ in range(copies_for(kv_bytes, cap=4))]
        t = self.timer([lambda k=k, v=v: self.sdpa(q, k, v) for k, v in caches])
        pred = self.ops.decode_attention(B, B * (c + 1))
        return Row("decode_attn", f"B={B} ctx={c}", t * 1e6, pred * 1e6,
                   {"kv_gbs": kv_bytes / t / 1e9})

    def sdpa(self, q: Any, k: Any, v: Any, **kw: Any) -> Any:
        """``scaled_dot_product_attention`` on a fused kernel only (FlashAttention, memory-
        efficient or cuDNN, as a serving engine runs): never PyTorch's unfused math path,
        which would time something no engine runs. On the CPU, whatever PyTorch picks."""
        F = self.torch.nn.functional
        if not self.device.startswith("cuda"):
            return F.scaled_dot_product_attention(q, k, v, **kw)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                          SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, **kw)

    def _prefill_fn(self, n: int, c: int) -> Callable[[], Any]:
        m = self.m
        q = self.rand(1, m.heads, n, m.head_dim)
        # K/V with every query head (grouped-query K/V repeated once, outside the timed
        # call): the lower-right causal bias wants equal heads on some backends, and
        # prefill attention is compute-bound, so the extra bytes do not set its time
        k, v = self.rand(1, m.heads, c + n, m.head_dim), self.rand(1, m.heads, c + n,
                                                                     m.head_dim)
        if c == 0:
            return lambda: self.sdpa(q, k, v, is_causal=True)
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(n, c + n)
        return lambda: self.sdpa(q, k, v, attn_mask=mask)

    def prefill_attention(self, n: int, c: int) -> Row:
        t = self.timer([self._prefill_fn(n, c)])
        pairs = n * c + n * (n + 1) // 2
        pred = self.ops.prefill_attention(n, pairs, c + n)
        return Row("prefill_attn", f"n={n} cached={c}", t * 1e6, pred * 1e6,
                   {"tflops": self.ops.attention_work(n, pairs, c + n)[0] / t / 1e12})

    # ------------------------------------------------------------------ whole steps
    def step(self, B: int, ctx: int, chunks: Sequence[tuple[int, int]], layers: int,
             by_op: dict[tuple[str, str], float]) -> Row:
        torch, F, m = self.torch, self.torch.nn.functional, self.m
        h, d, hk, g = m.hidden, m.head_dim, m.kv_heads, m.heads // m.kv_heads
        T = B + sum(n for n, _ in chunks)
        S = B + len(chunks)
        nw = torch.ones(h, device=self.device, dtype=self.dtype)
        kv_layer = 2 * (B * (ctx + 1) + sum(c + n for n, c in chunks)) * self.kvd * 2
        share_kv = kv_layer * layers > 16 * 2 ** 30  # > 16 GiB: one cache for every layer
        from torch.nn.attention.bias import causal_lower_right

        def caches() -> dict[str, Any]:
            return {"dec": (self.rand(B, hk, ctx + 1, d), self.rand(B, hk, ctx + 1, d))
                    if B else None,
                    # prefill K/V with every query head (the lower-right causal bias wants
                    # equal heads on some backends; prefill attention is compute-bound)
                    "pf": [(self.rand(1, m.heads, c + n, d), self.rand(1, m.heads, c + n, d))
                           for n, c in chunks],
                    "slots": torch.zeros(2, 4 * T + 4096, self.kvd, device=self.device,
                                         dtype=self.dtype)}

        shared = caches() if share_kv else None
        states = []
        for _ in range(layers):
            st: dict[str, Any] = {name: self.rand(n, k)
                                  for name, (k, n) in zip(GEMM_NAMES, self.shapes)}
            st.update(shared if shared is not None else caches())
            states.append(st)
        head = self.rand(m.vocab, h)
        x0 = self.rand(T, h)
        cos, sin = self.rand(T, 1, d), self.rand(T, 1, d)
        idx = torch.randperm(4 * T + 4096, device=self.device)[:T]
        masks = [causal_lower_right(n, c + n) if c else None for n, c in chunks]
        last = torch.tensor([B + sum(n for n, _ in chunks[:i + 1]) - 1
                             for i in range(len(chunks))], device=self.device,
                            dtype=torch.long)
        rows = torch.cat((torch.arange(B, device=self.device, dtype=torch.long), last))

        def run() -> Any:
            x = x0
            for st in states:
                a = F.rms_norm(x, (h,), nw, 1e-5)
                qkv = F.linear(a, st["qkv_proj"])
                q, k, v = qkv.split((self.qd, self.kvd, self.kvd), dim=-1)
                qk = torch.cat((q, k), dim=-1).view(T, m.heads + hk, d)
                half = d // 2
                rot = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
                qk = qk * cos + rot * sin
                q = qk[:, :m.heads]
                st["slots"].index_copy_(1, idx, torch.stack((qk[:, m.heads:].reshape(
                    T, self.kvd), v)))
                outs = []
                if B:
                    kd, vd = st["dec"]
                    outs.append(self.sdpa(q[:B].reshape(B, hk, g, d), kd, vd).reshape(
                        B, self.qd))
                start = B
                for (n, _c), (kp, vp), mask in zip(chunks, st["pf"], masks):
                    qc = q[start:start + n].transpose(0, 1).unsqueeze(0)
                    o = self.sdpa(qc, kp, vp, attn_mask=mask, is_causal=mask is None)
                    outs.append(o.squeeze(0).transpose(0, 1).reshape(n, self.qd))
                    start += n
                att = outs[0] if len(outs) == 1 else torch.cat(outs)
                x = x + F.linear(att, st["o_proj"])
                a = F.rms_norm(x, (h,), nw, 1e-5)
                gate, up = F.linear(a, st["gate_up_proj"]).chunk(2, dim=-1)
                x = x + F.linear(F.silu(gate) * up, st["down_proj"])
            return F.linear(F.rms_norm(x[rows], (h,), nw, 1e-5), head)

        t = self.timer([run], reps=max(2, self.timer.reps // 4))
        ns = [1] * B + [n for n, _ in chunks]
        cs = [ctx] * B + [c for _, c in chunks]
        parts = self.ops.breakdown(StepShape.of(ns, cs))
        L = self.ops.layers
        layer_s = sum(parts[k] for k in ("linear", "elementwise", "decode_attention",
                                         "prefill_attention")) / L
        pred = layer_s * layers + parts["lm_head"]
        # the same step as the sum of its measured operators, where each was timed
        per_layer = [by_op.get(("gemm", f"{nm} T={T}")) for nm in GEMM_NAMES]
        per_layer += [by_op.get(("elementwise", f"T={T}")), by_op.get(("kv_write", f"T={T}"))]
        if B:
            per_layer.append(by_op.get(("decode_attn", f"B={B} ctx={ctx}")))
        per_layer += [by_op.get(("prefill_attn", f"n={n} cached={c}")) for n, c in chunks]
        summed = None
        if all(p is not None for p in per_layer) and ("lm_head", f"S={S}") in by_op:
            summed = sum(p for p in per_layer if p is not None) * layers \
                + by_op[("lm_head", f"S={S}")]
        what = f"{B} decodes at {ctx}" if B else ""
        if chunks:
            what += (" + " if what else "") + ", ".join(f"chunk {n} after {c}"
                                                        for n, c in chunks)
        extra = {"predicted_with_overhead_us": (pred + parts["overhead"]) * 1e6,
                 "layers": float(layers), "shared_kv": float(share_kv)}
        if summed is not None:
            extra["sum_of_measured_ops_us"] = summed
        return Row("step", what, t * 1e6, pred * 1e6, extra)


def summarize(rows: Sequence[Row]) -> list[str]:
    out = []
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r.ratio)
    for g, ratios in groups.items():
        inside = sum(0.9 <= x <= 1.1 for x in ratios)
        out.append(f"{g:14} n={len(ratios):3d}  sim/measured median {statistics.median(ratios):.3f}"
                   f"  min {min(ratios):.3f}  max {max(ratios):.3f}  within 0.90-1.10: "
                   f"{inside}/{len(ratios)}")
    return out


def _print_row(r: Row) -> None:
    extra = ""
    if r.extra:
        extra = "  " + " ".join(f"{k}={v:.4g}" for k, v in r.extra.items())
    print(f"  {r.group:12} {r.what:34} measured {r.measured_us:10.1f} us  sim "
          f"{r.predicted_us:10.1f} us  ratio {r.ratio:6.3f}{extra}", flush=True)


def ceilings(torch: Any, device: str, timer: Timer) -> dict[str, float]:
    """The device's bf16 matrix rate and copy bandwidth, measured (a profile's peaks are
    spec-sheet numbers; these say what the efficiencies are fractions of, in fact)."""
    n = 8192 if device.startswith("cuda") else 256
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t_mm = timer([lambda: a @ b])
    size = 2 ** 30 if device.startswith("cuda") else 2 ** 22
    src = torch.empty(size, device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    t_cp = timer([lambda: dst.copy_(src)])
    return {"bf16_matmul_tflops": 2 * n ** 3 / t_mm / 1e12,
            "copy_gbs_read_plus_write": 2 * size / t_cp / 1e9}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="agentflow bench gpu_step_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", default="H200", help="GPU profile to predict with (H200)")
    p.add_argument("--model", default=None, help="model profile (Llama-3.1-8B; --quick: "
                   "gemma-3-270m)")
    p.add_argument("--device", default="cuda", help="torch device (cuda; cpu checks the script)")
    p.add_argument("--layers", type=int, default=None,
                   help="layers in the whole-step check (default: the model's)")
    p.add_argument("--reps", type=int, default=20, help="calls per CUDA graph (20)")
    p.add_argument("--rounds", type=int, default=5, help="timed replays, median (5)")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes of a small model, 2 layers: checks the script")
    p.add_argument("--skip", default="", help="comma-separated groups to skip (gemm, "
                   "elementwise, kv_write, lm_head, decode_attn, prefill_attn, step)")
    p.add_argument("--json", help="write every row and the summary to this file")
    args = p.parse_args(argv)
    q = QUICK if args.quick else {}
    model_name = args.model or str(q.get("model", "Llama-3.1-8B"))
    gpu = hardware.gpu(args.gpu)
    model = hardware.model(model_name)
    if model.weight_bits != 16:  # bf16 weights are what the benchmark builds
        model = model.quantized(16, 16)
    ops = OperatorModel(gpu, model)
    layers = args.layers or int(q.get("layers", model.layers))  # type: ignore[call-overload]
    reps = int(q.get("reps", args.reps))  # type: ignore[call-overload]
    rounds = int(q.get("rounds", args.rounds))  # type: ignore[call-overload]
    skip = {s for s in args.skip.split(",") if s}
    torch = _torch()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: PyTorch sees no CUDA device (use --device cpu to "
                         "check the script)")
    torch.manual_seed(0)
    timer = Timer(torch, args.device, reps, rounds)
    bench = Bench(torch, args.device, ops, timer)
    dev_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    print(f"# {dev_name}, torch {torch.__version__}; predicting with profile {gpu.name} "
          f"({gpu.peak_tflops} TFLOP/s, {gpu.mem_bw_gbs} GB/s) for {model.name} bf16")
    ceil = ceilings(torch, args.device, timer)
    print(f"# measured ceilings: bf16 matmul {ceil['bf16_matmul_tflops']:.0f} TFLOP/s, copy "
          f"{ceil['copy_gbs_read_plus_write']:.0f} GB/s (read + write)", flush=True)
    tokens = tuple(q.get("tokens", TOKENS))  # type: ignore[arg-type]
    decode = tuple(q.get("decode", DECODE))  # type: ignore[arg-type]
    prefill = tuple(q.get("prefill", PREFILL))  # type: ignore[arg-type]
    steps = tuple(q.get("steps", STEPS))  # type: ignore[arg-type]
    rows: list[Row] = []
    step_T = {B + sum(n for n, _ in ch) for B, _, ch in steps}
    step_S = {B + len(ch) for B, _, ch in steps}

    def add(make: Callable[..., Row], *a: Any) -> None:
        """One measurement; a failure is printed and the run goes on (one device run)."""
        try:
            r = make(*a)
        except Exception as err:  # noqa: BLE001 - report and continue
            print(f"  FAILED {make.__name__}{a}: {type(err).__name__}: "
                  f"{str(err).splitlines()[0][:160] if str(err) else ''}", flush=True)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            return
        rows.append(r)
        _print_row(r)
        save()  # after every row: a run stopped at its time limit keeps what it measured
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def save() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"device": dev_name, "torch": torch.__version__,
                           "profile": gpu.name, "model": model.name, "ceilings": ceil,
                           "summary": summarize(rows) if rows else [],
                           "rows": [{**asdict(r), "ratio": r.ratio} for r in rows]}, f,
                          indent=1)

    if "gemm" not in skip:
        print("# GEMMs")
        for T in sorted(set(tokens) | step_T):
            for i in range(4):
                add(bench.gemm, i, T)
    if "elementwise" not in skip or "kv_write" not in skip:
        print("# element-wise and KV write")
        for T in sorted(set(tokens) | step_T):
            if "elementwise" not in skip:
                add(bench.elementwise, T)
            if "kv_write" not in skip:
                add(bench.kv_write, T)
    if "lm_head" not in skip:
        print("# LM head")
        for S in sorted(set(q.get("heads", HEADS)) | step_S):  # type: ignore[call-overload]
            add(bench.lm_head, S)
    if "decode_attn" not in skip:
        print("# decode attention")
        for B, c in sorted(set(decode) | {(B, c) for B, c, _ in steps if B}):
            add(bench.decode_attention, B, c)
    if "prefill_attn" not in skip:
        print("# prefill attention")
        for n, c in sorted(set(prefill) | {x for _, _, ch in steps for x in ch}):
            add(bench.prefill_attention, n, c)
    if "step" not in skip:
        print(f"# whole steps ({layers} layers + LM head; sim: layers + LM head, its CPU "
              "overhead apart)")
        by_op = {(r.group, r.what): r.measured_us for r in rows}
        for B, c, ch in steps:
            add(bench.step, B, c, ch, layers, by_op)
    print("# summary (sim / measured)")
    summary = summarize(rows)
    for line in summary:
        print("  " + line)
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
