"""A bounded LRU of saved KV states keyed by the token sequence they hold.

Why: llama.cpp keeps one KV cache per context, so two queries whose calls interleave evict each
other's schema prefix and every call re-reads ~1k prompt tokens (seconds on a CPU). Saving the
context's sequence state before it is overwritten, and restoring the saved state with the
longest common prefix for the next prompt, turns that re-read into a ~10 MB memcpy.

llama-cpp-python ships ``LlamaRAMCache`` for this, but its ``save_state`` also copies the
logits buffer (n_batch x n_vocab floats: 512 MB for Gemma 3's 262k vocabulary, measured 1.5 s
to save and 3 s to load) and does not count it against the byte bound. This cache stores only
the sequence's KV bytes (``llama_state_seq_get_data``), and counts what it stores.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SavedState:
    tokens: np.ndarray  # int32 token ids whose KV the state holds, in order
    data: bytes  # opaque llama.cpp sequence state

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.tokens.nbytes


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two token arrays (vectorised: called per
    cached entry on every prompt)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class PrefixStateCache:
    """LRU of ``SavedState`` bounded by total bytes."""

    def __init__(self, capacity_bytes: int):
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[int, SavedState] = OrderedDict()
        self._next_key = 0
        self._size = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._size

    def best(self, tokens: np.ndarray) -> tuple[int, SavedState] | None:
        """The entry sharing the longest prefix with ``tokens`` (and that length), or None."""
        best_len, best_key = 0, None
        for key, entry in self._entries.items():
            n = common_prefix_len(entry.tokens, tokens)
            if n > best_len:
                best_len, best_key = n, key
        if best_key is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(best_key)
        return best_len, self._entries[best_key]

    def put(self, state: SavedState) -> None:
        """Store ``state``; entries whose tokens are a prefix of it hold nothing it does not,
        so they are dropped. Oldest entries go when over capacity; a state larger than the
        whole capacity is not stored."""
        if state.nbytes > self.capacity_bytes:
            return
        for key in [k for k, e in self._entries.items()
                    if len(e.tokens) <= len(state.tokens)
                    and common_prefix_len(e.tokens, state.tokens) == len(e.tokens)]:
            self._size -= self._entries.pop(key).nbytes
        self._entries[self._next_key] = state
        self._next_key += 1
        self._size += state.nbytes
        while self._size > self.capacity_bytes:
            _, old = self._entries.popitem(last=False)
            self._size -= old.nbytes
