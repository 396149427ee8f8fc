"""How llama-server cuts one iteration into forward passes: slots and ubatches.

The rule as llama.cpp applies it, with no timing: ``llamacpp_server.configure_engine`` gives
a simulated engine its slot table, and ``agentflow.sim.llama_batches`` prices the passes.

Why: agentflow starts llama-server with one KV stream per slot (``--no-kv-unified``). llama.cpp
then splits each batch with ``split_equal(n_ubatch, sequential=true)`` (``llama-batch.cpp``;
the sliding-window cache of Gemma 3 takes the same path): a ubatch holds only sequences whose
ids follow one another (slot k, k+1, ...), the same number of tokens of each, at most
``n_ubatch`` in all, and every ubatch is its own forward pass that reads all the weights.
So two requests decoding in slots 0 and 1 share one pass per step, in slots 0 and 2 they take
two, which on one CPU core is nearly twice the time (docs/simulator.md gives the measured
ratios). Which slots are busy follows the server's choice of slot for a new request: the idle
slot released longest ago (the highest id among never-used ones; the prompt-similarity rule
does not fire on the replays' random prompts). A ubatch computes the LM head only for the
rows that are sampled: decode tokens and the last token of a prompt that ends in it.

The server puts the generating slots' tokens into the batch first, in slot order, then the
prompt tokens of the slots still reading their prompt, in slot order; ``ubatches`` splits
that list the way ``split_equal`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class SlotTable:
    """Which slot each running sequence holds, and when each slot was last released."""

    def __init__(self, n_slots: int):
        if n_slots < 1:
            raise ValueError("a llama-server has at least one slot")
        self._released = [-1.0] * n_slots  # -1: never used (the server's initial value)
        self._owner: list[str | None] = [None] * n_slots
        self.slot_of: dict[str, int] = {}

    def take(self, seq_id: str) -> int:
        """The slot llama-server gives a new request: idle, least recently released, the
        last one in slot order among ties (its scan keeps a slot whose time is <=)."""
        best = None
        for i, owner in enumerate(self._owner):
            if owner is None and (best is None or self._released[i] <= self._released[best]):
                best = i
        if best is None:
            raise RuntimeError(f"no idle slot for {seq_id!r}: more running sequences than "
                               f"slots ({len(self._owner)})")
        self._owner[best] = seq_id
        self.slot_of[seq_id] = best
        return best

    def release(self, seq_id: str, t: float) -> None:
        i = self.slot_of.pop(seq_id, None)
        if i is not None:
            self._owner[i] = None
            self._released[i] = t


@dataclass(frozen=True)
class Piece:
    """Tokens of one sequence in one iteration: ``n`` over ``context`` cached ones, in
    ``slot``; ``decode``: a generating slot's token; ``samples``: its last token is sampled
    (a decode, or the end of a prompt)."""

    slot: int
    n: int
    context: int
    decode: bool
    samples: bool


def fill_key(slots: SlotTable) -> Callable[[Any], tuple[bool, int]]:
    """Sort key of running sequences (``.id``, ``.prompt``, ``.computed``) in the order the
    server fills a batch with them: the generating slots' tokens first, then each slot still
    reading its prompt, in slot order (``update_slots``), until ``n_batch`` tokens. So when
    prompts overflow the batch, the lower slot goes first, not the earlier request."""
    return lambda s: (s.computed < s.prompt, slots.slot_of[s.id])


def batch_order(pieces: list[Piece]) -> list[Piece]:
    """The server's batch: generating slots first, then prompts, each in slot order."""
    return sorted(pieces, key=lambda p: (not p.decode, p.slot))


def ubatches(pieces: list[Piece], n_ubatch: int) -> list[list[Piece]]:
    """``split_equal(n_ubatch, sequential=true)`` over a batch in server order: each ubatch
    takes, scanning the batch, the sequences whose slot follows the previous one taken, and
    ``min(tokens left of any of them, n_ubatch // their count)`` tokens of each."""
    if n_ubatch < 1:
        raise ValueError("n_ubatch must be >= 1")
    left = [p.n for p in pieces]
    done = [0] * len(pieces)
    out: list[list[Piece]] = []
    while any(left):
        chosen: list[int] = []
        for i, p in enumerate(pieces):
            if left[i] and (not chosen or p.slot == pieces[chosen[-1]].slot + 1):
                chosen.append(i)
        k = min(min(left[i] for i in chosen), max(1, n_ubatch // len(chosen)))
        part = []
        for i in chosen:
            p = pieces[i]
            last = left[i] == k
            part.append(Piece(p.slot, k, p.context + done[i], p.decode, p.samples and last))
            left[i] -= k
            done[i] += k
        out.append(part)
    return out


def decode_groups(slots: list[int]) -> list[list[int]]:
    """Indices into ``slots`` (generating slots, one token each) grouped into the ubatches
    ``ubatches`` makes of them: runs of consecutive slot ids, in slot order."""
    order = sorted(range(len(slots)), key=lambda i: slots[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and slots[i] == slots[groups[-1][-1]] + 1:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
