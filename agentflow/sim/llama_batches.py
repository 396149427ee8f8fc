"""What llama-server's forward passes cost: the slot/ubatch rule (``agentflow.llm.
llama_batches``) priced by an instance's operator model (``agentflow.step_time``)."""

from __future__ import annotations

from typing import Any

from agentflow.llm.llama_batches import Piece, batch_order, decode_groups, ubatches
from agentflow.step_time import step_sums


def iteration_seconds(ops: Any, pieces: list[Piece], n_ubatch: int) -> float:
    """One server iteration: the sum of its ubatches' forward passes (``ops``: the
    instance's ``agentflow.step_time.OperatorModel``)."""
    total = 0.0
    for part in ubatches(batch_order(pieces), n_ubatch):
        T, _, B, dkv, pt, pp, pkv = step_sums([p.n for p in part], [p.context for p in part])
        total = total + ops.step_parts(T, sum(p.samples for p in part), B, dkv, pt, pp, pkv)
    return float(total)


def decode_run_seconds(ops: Any, slots: list[int], kv0: list[int], j: Any) -> Any:
    """Iterations ``j`` (an array) of a run in which the sequences in ``slots`` each decode
    one token, sequence i attending to ``kv0[i] + j`` tokens: the same sums, in the same
    order, as ``iteration_seconds`` gives one such iteration."""
    total: Any = 0.0
    for g in decode_groups(slots):
        n = len(g)
        total = total + ops.step_parts(n, n, n, sum(kv0[i] for i in g) + n * j)
    return total
