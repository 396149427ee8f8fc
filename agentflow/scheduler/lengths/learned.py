"""The ``learned`` length model: a distribution from stage priors plus SageSched's semantic
history.

No trained model: it keeps a sliding window of recent calls (embedding of the key
text, stage, prompt length, observed output tokens) and predicts a new call's output length as
the empirical distribution of its most similar past calls of the same stage.

What gets embedded is *what differs between calls*: the caller passes the user's question as
``key_text`` (embedded once per query, then served from the embedder's LRU cache) and the stage
name, which is kept as an exact id rather than mixed into the text. The long prompt is never
embedded: it is mostly shared boilerplate (schema, instructions), so it would make every call of
a stage look alike and cost tens of milliseconds per call.

Prediction rule for a call of stage ``s`` (all constants are constructor arguments):

1. Similarity to each past call of stage ``s`` in the window is the cosine of the key
   embeddings, multiplied, when both prompt lengths are known, by
   ``exp(-|log(1 + I) - log(1 + I_j)| / input_scale)``: a prompt twice as long counts as
   markedly less similar (prompt length tracks the amount of context, the number of candidates
   and the round of a loop, all of which move output length). Calls of other stages never
   count: their lengths live on different scales. An empty key text (no question known)
   embeds to zero and is treated as text-neutral: every entry of the stage scores 1 before
   the prompt-length factor.
2. Neighbours: the ``k`` most similar with similarity >= ``min_similarity`` (ties go to the
   most recent), each weighted by its similarity. ``n_eff`` = the sum of those weights.
3. Stage baseline B: the stage's static prior with pseudo-count ``stage_prior_weight`` mixed
   with every observation of the stage in the window (weight 1 each). With no history this is
   the prior; after a few dozen calls it is the stage's recent empirical distribution.
4. Prediction = (neighbours with their weights + B with weight ``prior_strength``), normalised:
   the baseline's share is ``prior_strength / (n_eff + prior_strength)``, so it dominates when
   neighbours are few or weak and fades when many close neighbours agree — and it keeps the
   tails of the stage in every prediction, which is what keeps P90 honest.
5. Compressed to ``max_support`` atoms and, when the caller gives ``max_tokens``, clipped to
   it (a call cannot write more than its cap).

Cost: one chunked matrix-vector product over the stage's rows of the window (see ``_dot``), a
partial sort and a ~100-atom compression: about a hundred microseconds for 2,000 entries.

Why each stage keeps its own copy of its embeddings (``_StageRing``): the product reads the
stage's rows in window-slot order, and gathering them out of the window's matrix (a fancy-index
copy, ~2 KB a row) cost more than the product itself, at every call ready. The window is a
ring, so in slot order a stage's rows are those of the window's current lap, then those of
the previous lap, each in arrival order: two contiguous slices of a ring of the stage's own
embeddings (stored twice over, so no slice wraps). The product reads the same rows in the same
blocks — only a block that spans both slices is copied — so it gives the same floats.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from statistics import NormalDist

import numpy as np

from agentflow.scheduler import price_kernel
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.embedders import CachedEmbedder, Embedder, HashingEmbedder
from agentflow.scheduler.lengths.base import LengthModel

# OpenBLAS runs a large float32 matrix-vector product multi-threaded; on a busy 2-core host that
# costs milliseconds of spinning, while blocks of this many rows stay on the single-thread path.
_CHUNK_ROWS = 256


def lognormal_prior(median: float, sigma: float = 0.8, *, atoms: int = 16,
                    cap: float | None = None) -> Distribution:
    """A broad prior: ``atoms`` equal-probability atoms at the mid-quantiles of a log-normal
    with this median and log-space spread, rounded to whole tokens (at least 1). Log-normal
    because output lengths are positive, right-skewed and vary by ratios, not offsets."""
    if median <= 0 or sigma < 0:
        raise ValueError("need median > 0 and sigma >= 0")
    nd = NormalDist()
    z = np.array([nd.inv_cdf((i + 0.5) / atoms) for i in range(atoms)])
    values = np.maximum(np.round(median * np.exp(sigma * z)), 1.0)
    if cap is not None:
        values = np.minimum(values, cap)
    return Distribution(values, np.full(atoms, 1.0 / atoms))


# (median output tokens, log-space sigma). Medians are the stage sizes DESIGN.md reports for
# CHESS with Llama-3.1-70B on BIRD; HexGen-Flow trace step names and agentflow's own stage names
# both appear. agentflow's names get wider spreads: they run on whatever model is configured.
DEFAULT_STAGE_PRIORS: Mapping[str, tuple[float, float]] = {
    # HexGen-Flow trace steps
    "Information Retriever": (5.0, 0.8),  # agent tool-picking
    "unit_tester": (5.0, 0.8),  # agent tool-picking
    "extract_keywords": (45.0, 0.8),
    "generate_candidate_llama-agent": (680.0, 0.6),
    "revise": (80.0, 0.9),
    "generate_unit_test": (90.0, 0.8),
    "evaluate": (22.0, 0.6),
    # agentflow pipeline stages (chess)
    "generate_candidate": (680.0, 1.0),
    "generate_unit_tests": (90.0, 1.0),
}
DEFAULT_PRIOR_SPEC: tuple[float, float] = (64.0, 1.2)  # unknown stage: 64 tokens, x/3.3 per sigma


def default_priors() -> dict[str, Distribution]:
    return {stage: lognormal_prior(m, s) for stage, (m, s) in DEFAULT_STAGE_PRIORS.items()}


def _dot(current: np.ndarray, previous: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``concatenate((current, previous)) @ q`` in blocks of ``_CHUNK_ROWS`` (see the
    constant's comment), copying only the block that spans both (``_StageRing.rows``)."""
    k, n = current.shape[0], current.shape[0] + previous.shape[0]
    out = np.empty(n, dtype=np.float32)
    for start in range(0, n, _CHUNK_ROWS):
        stop = min(start + _CHUNK_ROWS, n)
        if stop <= k:
            block = current[start:stop]
        elif start >= k:
            block = previous[start - k:stop - k]
        else:
            block = np.concatenate((current[start:], previous[:stop - k]))
        np.dot(block, q, out=out[start:stop])
    return out


_NO_OUTS = np.zeros(0)


class _StageRing:
    """One stage's embeddings in the window, oldest first, each row stored twice (ring
    positions ``p`` and ``p + cap``), so every run of them in arrival order is one
    contiguous slice. The window evicts its oldest entry, which is the oldest of its stage
    too, so a stage's entries only ever leave from the ring's head."""

    __slots__ = ("buf", "cap", "head", "size", "slots")

    def __init__(self, dim: int, cap: int = 64):
        self.cap = cap
        self.buf = np.zeros((2 * cap, dim), dtype=np.float32)
        self.slots = np.full(cap, -1, dtype=np.int64)  # the window slot at each position
        self.head = 0
        self.size = 0

    def join(self, slot: int, emb: np.ndarray) -> None:
        pos = (self.head + self.size) % self.cap
        self.buf[pos] = self.buf[pos + self.cap] = emb
        self.slots[pos] = slot
        self.size += 1

    def grown(self, cap: int) -> _StageRing:
        """The same rows, oldest first from position 0, in a ring of ``cap`` rows."""
        out, n = _StageRing(self.buf.shape[1], cap), self.size
        out.buf[:n] = out.buf[cap:cap + n] = self.buf[self.head:self.head + n]
        out.slots[:n] = np.roll(self.slots, -self.head)[:n]
        out.size = n
        return out

    def leave(self, slot: int) -> None:
        if self.size == 0 or self.slots[self.head] != slot:
            raise AssertionError(f"slot {slot} is not the oldest of its stage's ring")
        self.slots[self.head] = -1
        self.head = (self.head + 1) % self.cap
        self.size -= 1

    def rows(self, current: int) -> tuple[np.ndarray, np.ndarray]:
        """The stage's rows in window-slot order, as two slices: the ``current`` newest
        (the window's current lap: the low slots), then the rest (the previous lap)."""
        head, end = self.head, self.head + self.size
        return self.buf[end - current:end], self.buf[head:end - current]


class LearnedLengthModel(LengthModel):
    """Predicts a call's output-token distribution from its stage, key text and prompt length;
    learns online from ``observe``. Thread-safe (one lock; every operation is short)."""

    def __init__(self, embedder: Embedder | None = None, *, window: int = 2000, k: int = 16,
                 min_similarity: float = 0.2, prior_strength: float = 2.0,
                 stage_prior_weight: float = 4.0, input_scale: float = 0.25,
                 priors: Mapping[str, Distribution] | None = None,
                 default_prior: Distribution | None = None, max_support: int = 32):
        if window < 1 or k < 0 or prior_strength <= 0 or stage_prior_weight <= 0:
            raise ValueError("need window >= 1, k >= 0, positive prior weights")
        if input_scale <= 0:
            raise ValueError("input_scale must be positive")
        self.embedder: Embedder = embedder if embedder is not None else HashingEmbedder()
        self.window = int(window)
        self.k = int(k)
        self.min_similarity = float(min_similarity)
        self.prior_strength = float(prior_strength)
        self.stage_prior_weight = float(stage_prior_weight)
        self.input_scale = float(input_scale)
        self.max_support = int(max_support)
        self._priors: dict[str, Distribution] = default_priors() if priors is None \
            else dict(priors)
        self._default_prior = default_prior or lognormal_prior(*DEFAULT_PRIOR_SPEC)
        dim = int(self.embedder.dim)
        self._dim = dim
        self._rings: dict[int, _StageRing] = {}  # each stage's embeddings (``_StageRing``)
        self._sorted_outs: dict[int, np.ndarray] = {}  # each stage's outputs, ascending
        self._stage = np.full(self.window, -1, dtype=np.int32)
        self._out = np.zeros(self.window, dtype=np.float64)
        self._log_in = np.full(self.window, np.nan, dtype=np.float64)
        self._nan_in = 0  # entries of the window without a known prompt length
        self._seq = np.zeros(self.window, dtype=np.int64)
        self._next = 0
        self._count = 0
        self._observed = 0
        self._stage_ids: dict[str, int] = {}
        self._baselines: dict[int, Distribution] = {}
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ priors
    def prior(self, stage: str) -> Distribution:
        """The static prior of a stage (the configured one, else the broad default)."""
        return self._priors.get(stage, self._default_prior)

    def set_prior(self, stage: str, prior: Distribution) -> None:
        """Replace a stage's prior, e.g. from a pipeline's own hint of its output size."""
        with self._lock:
            self._priors[stage] = prior
            sid = self._stage_ids.get(stage)
            if sid is not None:
                self._baselines.pop(sid, None)

    def stage_distribution(self, stage: str) -> Distribution:
        """Baseline B of the module docstring: the prior mixed with the stage's window."""
        with self._lock:
            sid = self._stage_ids.get(stage)
            if sid is None:
                return self.prior(stage).compress(self.max_support)
            return self._baseline(stage, sid)

    def _baseline(self, stage: str, sid: int) -> Distribution:
        cached = self._baselines.get(sid)
        if cached is not None:
            return cached
        # The stage's outputs are kept sorted (``_sorted_outs``), so the prior's atoms are
        # merged in after the equal outputs: the order (and so the weights' sums) that a
        # stable sort of the outputs followed by the prior gives, without sorting again
        # at every rebuild (one per observation of the stage).
        prior = self.prior(stage)
        outs = self._sorted_outs.get(sid, _NO_OUTS)
        fast = price_kernel.baseline(outs, prior.values, prior.probs, self.stage_prior_weight,
                                     self.max_support)  # the merge and atoms in one pass
        if fast is not None:
            dist = Distribution._trusted(fast[0], fast[1]) if fast[2] \
                else Distribution(fast[0], fast[1])
            self._baselines[sid] = dist
            return dist
        n, k = outs.size, prior.values.size
        at = outs.searchsorted(prior.values, side="right") + np.arange(k)  # merged places
        values, weights = np.empty(n + k), np.ones(n + k)
        rest = np.ones(n + k, dtype=bool)
        rest[at] = False
        values[rest] = outs
        values[at] = prior.values
        weights[at] = prior.probs * self.stage_prior_weight
        dist = Distribution._from_sorted_atoms(values, weights, self.max_support)
        self._baselines[sid] = dist
        return dist

    # ------------------------------------------------------------------ history
    def __len__(self) -> int:
        return self._count

    @property
    def observed(self) -> int:
        """Observations ever made (the window holds the last ``window`` of them)."""
        return self._observed

    def stage_count(self, stage: str) -> int:
        sid = self._stage_ids.get(stage)
        return 0 if sid is None else int(np.count_nonzero(self._stage[:self._count] == sid))

    def _embed(self, key_text: str) -> np.ndarray:
        if isinstance(self.embedder, CachedEmbedder):
            return self.embedder.embed_one(key_text)
        first: np.ndarray = np.asarray(self.embedder.embed([key_text]), dtype=np.float32)[0]
        return first

    def observe(self, stage: str, key_text: str, output_tokens: float,
                input_tokens: int | None = None) -> None:
        """Record a finished call; the oldest entry leaves the window when it is full."""
        if output_tokens < 0 or not math.isfinite(output_tokens):
            raise ValueError(f"output_tokens must be finite and non-negative, got {output_tokens}")
        emb = self._embed(key_text)
        with self._lock:
            sid = self._stage_ids.setdefault(stage, len(self._stage_ids))
            slot = self._next
            evicted = int(self._stage[slot])
            if evicted >= 0:
                self._rings[evicted].leave(slot)
                self._sorted_outs[evicted] = price_kernel.sorted_remove(
                    self._sorted_outs[evicted], float(self._out[slot]))
            self._sorted_outs[sid] = price_kernel.sorted_insert(
                self._sorted_outs.get(sid, _NO_OUTS), float(output_tokens))
            ring = self._rings.get(sid)
            if ring is None:
                ring = self._rings[sid] = _StageRing(self._dim, min(64, self.window))
            elif ring.size == ring.cap:  # full: twice the room
                ring = self._rings[sid] = ring.grown(min(2 * ring.cap, self.window))
            ring.join(slot, emb)
            self._stage[slot] = sid
            self._out[slot] = float(output_tokens)
            if evicted >= 0 and math.isnan(self._log_in[slot]):
                self._nan_in -= 1
            if input_tokens is None:
                self._log_in[slot] = np.nan
                self._nan_in += 1
            else:
                self._log_in[slot] = math.log1p(input_tokens)
            self._seq[slot] = self._observed
            self._observed += 1
            self._next = (slot + 1) % self.window
            self._count = min(self._count + 1, self.window)
            self._baselines.pop(sid, None)
            if evicted >= 0:
                self._baselines.pop(evicted, None)

    def _stage_rows(self, sid: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The embeddings of window slots ``rows`` (all of stage ``sid``'s, ascending), as
        the two slices of its ring that hold them in that order: the slots below the
        window's next one are the current lap's (all of them while it has not wrapped)."""
        return self._rings[sid].rows(int(rows.searchsorted(self._next)))

    # ------------------------------------------------------------------ prediction
    def predict(self, stage: str, key_text: str, input_tokens: int | None = None, *,
                max_tokens: int | None = None) -> Distribution:
        """The output-token distribution of a call (rule in the module docstring)."""
        sid = self._stage_ids.get(stage)
        if sid is None or self.k == 0:
            dist = self.stage_distribution(stage)
            return dist.clip(max_tokens) if max_tokens is not None else dist
        q = self._embed(key_text)
        with self._lock:
            baseline = self._baseline(stage, sid)
            # method forms of flatnonzero/any/argpartition and ufuncs writing in place: the
            # same operations, and so the same floats, without numpy's Python-level wrappers
            # and temporaries (this runs for every call)
            compiled = price_kernel.enabled()  # the same steps as loops (price_kernel)
            factor = None
            if compiled:
                rows, factor = price_kernel.stage_rows(
                    self._stage, self._count, sid, self._log_in,
                    0.0 if input_tokens is None else math.log1p(input_tokens),
                    -1.0 / self.input_scale, input_tokens is not None)
                if input_tokens is None:
                    factor = None
                else:
                    np.exp(factor, out=factor)
            else:
                rows = (self._stage[:self._count] == sid).nonzero()[0]
                if input_tokens is not None:
                    factor = self._log_in[rows]
                    factor -= math.log1p(input_tokens)
                    np.abs(factor, out=factor)
                    factor *= -1.0 / self.input_scale
                    np.exp(factor, out=factor)
            fix_nan = factor is not None and bool(self._nan_in)
            if q.any():
                if fix_nan:  # an entry without a known prompt length counts fully
                    assert factor is not None
                    factor[np.isnan(factor)] = 1.0
                    fix_nan = False
                sims = _dot(*self._stage_rows(sid, rows), q).astype(np.float64)
                if factor is not None:
                    sims *= factor
            elif factor is not None:  # no key text: 1.0 * factor is factor, bit for bit
                sims = factor
            else:  # no key text: the text says nothing, so prompt length and recency decide
                sims = np.ones(rows.size)
            if compiled:
                return self._neighbours(rows, sims, fix_nan, baseline, max_tokens)
            if fix_nan:
                sims[np.isnan(sims)] = 1.0
            # a positive floor already rules out similarities <= 0 (and NaN fails both)
            ok = sims >= self.min_similarity
            if self.min_similarity <= 0:
                ok &= sims > 0
            if not ok.any():
                dist = baseline
            else:
                if not ok.all():
                    rows, sims = rows[ok], sims[ok]
                if rows.size > self.k:
                    # Ties (identical keys) go to the most recent entries.
                    key = (self._seq[rows] - self._observed) * (1e-9 / self.window)
                    key += sims
                    top = np.negative(key, out=key).argpartition(self.k - 1)[:self.k]
                    rows, sims = rows[top], sims[top]
                dist = self._mixture(rows, sims, baseline)
        return dist.clip(max_tokens) if max_tokens is not None else dist

    def _neighbours(self, rows: np.ndarray, sims: np.ndarray, fix_nan: bool,
                    baseline: Distribution, max_tokens: int | None) -> Distribution:
        """The rest of ``predict`` (the lock held) with the filter and selection key by one
        compiled pass (``price_kernel.neighbours``): the same rows, similarities and keys,
        then numpy's ``argpartition`` and the mixture, as ``predict`` makes them."""
        rows, sims, key = price_kernel.neighbours(
            rows, sims, fix_nan, self.min_similarity, self.min_similarity <= 0, self.k,
            self._seq, self._observed, 1e-9 / self.window)
        if not rows.size:
            dist = baseline
        else:
            top = key.argpartition(self.k - 1)[:self.k] if rows.size > self.k else None
            # the selection, the mixture and its atoms by one compiled pass (the same
            # floats as ``_mixture``'s numpy steps: ``price_kernel.mixture``)
            fast = price_kernel.mixture(self._out, rows, sims, top, baseline.values,
                                        baseline.probs, self.prior_strength, self.max_support)
            if fast is None:
                if top is not None:
                    rows, sims = rows[top], sims[top]
                dist = self._mixture(rows, sims, baseline)
            elif fast[2]:
                dist = Distribution._trusted(fast[0], fast[1])
            else:  # the binned means out of order: as ``_from_sorted_atoms`` falls back
                dist = Distribution(fast[0], fast[1])
        return dist.clip(max_tokens) if max_tokens is not None else dist

    def _mixture(self, rows: np.ndarray, sims: np.ndarray,
                 baseline: Distribution) -> Distribution:
        """The chosen neighbours' outputs weighted by their similarity, mixed with the stage
        baseline at ``prior_strength``: one rule for both ways ``predict`` picks them."""
        return Distribution._from_atoms(
            np.concatenate((self._out[rows], baseline.values)),
            np.concatenate((sims, baseline.probs * self.prior_strength)),
            self.max_support)
