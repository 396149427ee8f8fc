"""Prompt prefixes as chained block hashes, and LRU sets of them.

vLLM's automatic prefix caching keys each full KV block of ``block_size`` tokens by a hash
that covers the block's tokens *and* every block before it (a chain), so two prompts share
block ``i`` only if they agree on everything up to its end. This module is the one place that
turns prompt text into those keys, used twice:

* by the simulated engine (``agentflow.sim.engine``), to decide which leading blocks of an
  admitted prompt are already in its KV cache and skip their prefill;
* by the coordinator's router-side ``PrefixIndex``, an *approximate* per-instance record of
  which prefixes were sent where (as SGLang's cache-aware router and llm-d's precise/approximate
  prefix scorers keep), fed only with the text of dispatched calls — the same events in serving
  and in simulation, never the engine's internals.

Tokens: agentflow traces record prompt text, not token ids, so text is cut into pseudo-tokens
of ``CHARS_PER_TOKEN`` characters (the 4-characters-a-token rule the scripted backend and the
default ``count_tokens`` use). The cut depends only on the text before it, so equal leading
text gives equal leading blocks, as a real tokenizer does (up to a boundary effect of at most
one block, which vLLM has too). Only full blocks are keyed (vLLM caches only full blocks).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence

BLOCK_TOKENS = 16
CHARS_PER_TOKEN = 4


def block_hashes(text: str, block_tokens: int = BLOCK_TOKENS) -> tuple[bytes, ...]:
    """Chained hashes of ``text``'s full blocks: element ``i`` covers blocks ``0..i``."""
    step = block_tokens * CHARS_PER_TOKEN
    data = text.encode("utf-8", "surrogatepass")
    # Cut characters, not bytes: a multi-byte character never straddles two blocks.
    n_full = len(text) // step
    out = []
    h = hashlib.blake2b(digest_size=12)
    if len(data) == len(text):  # ASCII: character offsets are byte offsets
        for i in range(n_full):
            h.update(data[i * step:(i + 1) * step])
            out.append(h.copy().digest())
    else:
        for i in range(n_full):
            h.update(text[i * step:(i + 1) * step].encode("utf-8", "surrogatepass"))
            out.append(h.copy().digest())
    return tuple(out)


def pseudo_tokens(text: str) -> int:
    """Pseudo-token count of ``text`` (the unit ``block_hashes`` cuts in)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def cached_fraction(hit_blocks: int, text_len: int, block_tokens: int = BLOCK_TOKENS) -> float:
    """Share of a prompt's pseudo-tokens covered by ``hit_blocks`` leading blocks: what turns
    a hit into the trace's own token count (recorded with the backend's tokenizer)."""
    if text_len <= 0:
        return 0.0
    return min(1.0, hit_blocks * block_tokens * CHARS_PER_TOKEN / text_len)


class LRUBlocks:
    """A bounded LRU set of block hashes (the router-side view of one instance's cache)."""

    __slots__ = ("capacity", "_blocks")

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("prefix index capacity must be at least one block")
        self.capacity = int(capacity)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, h: bytes) -> bool:
        return h in self._blocks

    def match(self, hashes: Sequence[bytes]) -> int:
        """How many leading blocks of ``hashes`` are held (chained: stop at the first miss)."""
        n = 0
        blocks = self._blocks
        for h in hashes:
            if h not in blocks:
                break
            n += 1
        return n

    def insert(self, hashes: Iterable[bytes]) -> None:
        """Touch (most recently used) or add each block, evicting the least recently used
        beyond capacity. Later blocks of a prompt end up more recent than earlier ones, so
        eviction takes a prompt's tail first and leaves shared heads longest."""
        blocks = self._blocks
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)


class PrefixIndex:
    """Router-side approximate prefix index: per instance, the blocks of the prompts the
    coordinator dispatched there, LRU-bounded by that instance's KV capacity in blocks.

    Approximate by design (as SGLang's router tree and llm-d's approximate scorer): it does
    not see evictions caused by other traffic's decode tokens or preemptions, only the
    dispatch stream, so it may over-estimate a hit; the engine decides the real one."""

    def __init__(self, capacities: dict[str, int], block_tokens: int = BLOCK_TOKENS):
        self.block_tokens = block_tokens
        self._sets = {name: LRUBlocks(max(1, cap)) for name, cap in capacities.items()}

    def matched_blocks(self, hashes: Sequence[bytes], instances: Sequence[str]) -> list[int]:
        if not hashes:
            return [0] * len(instances)
        return [self._sets[n].match(hashes) for n in instances]

    def record(self, instance: str, hashes: Sequence[bytes]) -> None:
        """``instance`` was sent a prompt with these blocks."""
        if hashes:
            self._sets[instance].insert(hashes)

    def forget_instance(self, instance: str) -> None:
        """An instance went down: its cache is gone."""
        s = self._sets[instance]
        self._sets[instance] = LRUBlocks(s.capacity)
