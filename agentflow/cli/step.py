"""``agentflow simulate step``: the simulated engine's time for one iteration you describe.

So anyone can check the step-time model against a measurement (a vLLM benchmark, a
profiler trace): name the GPU, model and tensor parallelism, list the decoding sequences as
``BATCH:CONTEXT`` groups and any prefill chunks as ``CHUNK[:CACHED]``, and read the
milliseconds the simulator charges for that iteration (the same ``agentflow.step_time``
model and fitted constants ``SimInstance`` uses), with its split over operator classes.
"""

from __future__ import annotations

import argparse
import json

from agentflow import hardware


def _decode_spec(value: str) -> tuple[int, int]:
    parts = value.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        batch, ctx = int(parts[0]), int(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected BATCH:CONTEXT (e.g. 32:12288), got {value!r}") from None
    if batch < 1 or ctx < 0:
        raise argparse.ArgumentTypeError(
            f"BATCH must be >= 1 and CONTEXT >= 0, got {value!r}")
    return batch, ctx


def _prefill_spec(value: str) -> tuple[int, int]:
    parts = value.split(":")
    try:
        if not 1 <= len(parts) <= 2:
            raise ValueError
        chunk = int(parts[0])
        ctx = int(parts[1]) if len(parts) == 2 else 0
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected CHUNK or CHUNK:CACHED (e.g. 2048 or 512:4096), got {value!r}") from None
    if chunk < 1 or ctx < 0:
        raise argparse.ArgumentTypeError(
            f"CHUNK must be >= 1 and CACHED >= 0, got {value!r}")
    return chunk, ctx


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "step", help="time one engine iteration (to check the model against a measurement)",
        description="Print the milliseconds the simulated engine charges for one iteration: "
                    "decoding sequences (--decode BATCH:CONTEXT, repeatable) and prefill "
                    "chunks (--prefill CHUNK[:CACHED], repeatable) on one instance. "
                    "Fitted constants (agentflow.hardware) apply as in the simulator.")
    p.add_argument("--gpu", required=True, help=f"GPU profile: {', '.join(hardware.GPUS)}")
    p.add_argument("--model", required=True,
                   help=f"model profile: {', '.join(hardware.MODELS)}")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs (default 1)")
    p.add_argument("--weight-bits", type=int, default=None,
                   help="weight precision (default: the model profile's, 16)")
    p.add_argument("--kv-bits", type=int, default=None, help="KV-cache precision")
    p.add_argument("--decode", type=_decode_spec, action="append", default=[],
                   metavar="BATCH:CONTEXT",
                   help="BATCH sequences decoding one token each over CONTEXT cached tokens")
    p.add_argument("--prefill", type=_prefill_spec, action="append", default=[],
                   metavar="CHUNK[:CACHED]",
                   help="a sequence prefilling CHUNK tokens after CACHED cached ones (0)")
    p.add_argument("--json", action="store_true",
                   help='print {"step_ms": ..., ...} instead of a table')
    p.set_defaults(func=cmd_step)


def step_ms(gpu: str, model: str, tp: int = 1, decode=(), prefill=(),
            weight_bits: int | None = None, kv_bits: int | None = None) -> dict:
    """The step's milliseconds and their split (what ``--json`` prints)."""
    from agentflow.step_time import OperatorModel, StepShape

    if tp < 1:
        raise ValueError("--tp must be >= 1")
    if not decode and not prefill:
        raise ValueError("describe the step: at least one --decode or --prefill")
    g = hardware.gpu(gpu)
    m = hardware.model(model)
    if weight_bits is not None or kv_bits is not None:
        m = m.quantized(weight_bits or m.weight_bits, kv_bits)
    if hardware.kv_cache_blocks(g, m, tp, max_num_batched_tokens=1) < 1:
        raise ValueError(f"{m.name} does not fit on {tp} x {g.name}")
    g = hardware.calibrated(g, m)
    ns, ctx = [], []
    for batch, c in decode:
        ns += [1] * batch
        ctx += [c] * batch
    for chunk, c in prefill:
        ns.append(chunk)
        ctx.append(c)
    ops = OperatorModel(g, m, tp)
    shape = StepShape.of(ns, ctx)
    parts = ops.breakdown(shape)
    per_step = ("lm_head", "allreduce", "overhead")
    return {"step_ms": ops.step(shape) * 1e3,
            "layers_ms": sum(v for k, v in parts.items() if k not in per_step) * 1e3,
            "operators_ms": {k: v * 1e3 for k, v in parts.items()},
            "gpu": g.name, "model": m.name, "tp": tp, "tokens": shape.tokens,
            "sequences": shape.seqs}


def cmd_step(args: argparse.Namespace) -> int:
    out = step_ms(args.gpu, args.model, args.tp, args.decode, args.prefill,
                  args.weight_bits, args.kv_bits)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['model']} on {out['tp']} x {out['gpu']}: {out['tokens']} tokens, "
          f"{out['sequences']} sequences")
    for k, v in out["operators_ms"].items():
        print(f"  {k:18} {v:10.3f} ms")
    print(f"step: {out['step_ms']:.3f} ms")
    return 0
