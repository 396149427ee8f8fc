"""What llama-server's forward passes cost: the slot/ubatch rule (``agentflow.llm.
llama_batches``) priced by an instance's operator model (``agentflow.step_time``).

One CPU term sits on top of the operator sums: llama.cpp's CPU matrix multiply on some
hosts shares a pass's weight read among its rows only from ``GPUProfile.cpu_tiled_rows``
rows up; below that it runs one matrix-vector product per row, each streaming the weights
again (on the Sapphire Rapids build host two rows in one pass cost 1.25-1.37x one, so its
stored ``Xeon-core`` keeps 0: one read; ``agentflow calibrate`` fits it per host). Measured with
``llama_decode`` alone (llama-cpp-python, no server, no sampling, no HTTP; gemma-3-270m
Q4_K_M, one thread, one core of this project's EPYC VM, 24 decode steps, three rounds):
a step of 2 sequences in one ubatch (consecutive slots) cost 1.99-2.01x a lone step, 3 cost
3.2-3.6x, 4 cost 2.80-2.88x (5: 3.8-3.9x). The operator sums alone priced 2 at 1.58x and
4 at 2.74x. With the weights read once per row below 4 rows the model gives 2.0x, 3.0x,
2.9x: the weight read is 0.37 of a lone step in the fitted host profile. The same holds for
the LM head's rows (``S``, the sampled rows of the pass) and for the linear layers' rows
(``T``, every token of the pass; a prompt chunk has hundreds, so only decode-only passes of
2-3 sequences pay it). GPUs (compute and memory overlap) are priced as before.
"""

from __future__ import annotations

from typing import Any

from agentflow.llm.llama_batches import Piece, batch_order, decode_groups, ubatches
from agentflow.step_time import step_sums


def extra_reads(rows: Any, tiled: float) -> Any:
    """How many more times than once a pass of ``rows`` rows streams a matrix's weights on
    a CPU core: each of 1 to ``tiled - 1`` rows reads them itself, from ``tiled`` up one
    read serves all (and a pass without rows reads none); arrays too."""
    return (rows - 1) * (rows >= 1) * (rows < tiled)


def _weight_seconds(ops: Any) -> tuple[float, float]:
    """(seconds of one read of every layer's GEMM weights, of the LM head's weights) on the
    instance's weight-streaming bandwidth; (0, 0) where compute and memory overlap (GPUs)."""
    cached = getattr(ops, "_llama_weight_s", None)
    if cached is not None:
        return cached
    out = (0.0, 0.0)
    g = ops.gpu
    if not g.overlap_compute_memory:
        bw = g.mem_bw_gbs * 1e9 * g.bw_efficiency
        layer = sum(ops.gemm_work(i, 0)[1] for i in range(4))
        out = (layer * ops.layers / bw, ops.lm_head_work(0)[1] / bw)
    ops._llama_weight_s = out
    return out


def extra_reads_seconds(ops: Any, T: Any, S: Any) -> Any:
    """Seconds a pass of ``T`` tokens and ``S`` sampled rows spends re-reading weights that
    the operator sums count once (``extra_reads``)."""
    tiled = getattr(ops.gpu, "cpu_tiled_rows", 0.0)
    if tiled < 2:
        return 0.0
    lin, head = _weight_seconds(ops)
    return extra_reads(T, tiled) * lin + extra_reads(S, tiled) * head


def iteration_seconds(ops: Any, pieces: list[Piece], n_ubatch: int) -> float:
    """One server iteration: the sum of its ubatches' forward passes (``ops``: the
    instance's ``agentflow.step_time.OperatorModel``)."""
    total = 0.0
    for part in ubatches(batch_order(pieces), n_ubatch):
        T, _, B, dkv, pt, pp, pkv = step_sums([p.n for p in part], [p.context for p in part])
        S = sum(p.samples for p in part)
        total = total + ops.step_parts(T, S, B, dkv, pt, pp, pkv) \
            + extra_reads_seconds(ops, T, S)
    return float(total)


def decode_run_seconds(ops: Any, slots: list[int], kv0: list[int], j: Any) -> Any:
    """Iterations ``j`` (an array) of a run in which the sequences in ``slots`` each decode
    one token, sequence i attending to ``kv0[i] + j`` tokens: the same sums, in the same
    order, as ``iteration_seconds`` gives one such iteration."""
    total: Any = 0.0
    for g in decode_groups(slots):
        n = len(g)
        total = total + ops.step_parts(n, n, n, sum(kv0[i] for i in g) + n * j) \
            + extra_reads_seconds(ops, n, n)
    return total
