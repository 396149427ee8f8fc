"""The learned length model predicts the same floats as it did before its stage rings.

``ReferenceLengthModel`` keeps the model as it was (verbatim): one window matrix of
embeddings, the stage's rows gathered out of it for every product, and each stage baseline
re-sorted from the window at every rebuild. Seeded sequences of
observations and predictions — small windows that wrap many times, stages that fill the
whole window and leave it again, rings that grow, empty and repeated key texts, prompt
lengths known or not, output caps, priors whose atoms the outputs hit — go through both,
and every prediction and stage baseline must have the same atoms and probabilities, bit for
bit.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.lengths.learned import _CHUNK_ROWS, LearnedLengthModel

# -------------------------------------------------------------- the model, as it was


def _reference_dot(rows, matrix, q):
    out = np.empty(rows.size, dtype=np.float32)
    for start in range(0, rows.size, _CHUNK_ROWS):
        block = rows[start:start + _CHUNK_ROWS]
        np.dot(matrix[block], q, out=out[start:start + block.size])
    return out


class ReferenceLengthModel(LearnedLengthModel):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._emb = np.zeros((self.window, int(self.embedder.dim)), dtype=np.float32)

    def observe(self, stage, key_text, output_tokens, input_tokens=None):
        slot = self._next
        super().observe(stage, key_text, output_tokens, input_tokens)
        self._emb[slot] = self._embed(key_text)

    def _baseline(self, stage, sid):
        cached = self._baselines.get(sid)
        if cached is not None:
            return cached
        prior = self.prior(stage)
        outs = self._out[:self._count][self._stage[:self._count] == sid]
        dist = Distribution._from_atoms(
            np.concatenate((outs, prior.values)),
            np.concatenate((np.ones(outs.size), prior.probs * self.stage_prior_weight)),
            self.max_support)
        self._baselines[sid] = dist
        return dist

    def predict(self, stage, key_text, input_tokens=None, *, max_tokens=None):
        sid = self._stage_ids.get(stage)
        if sid is None or self.k == 0:
            dist = self.stage_distribution(stage)
            return dist.clip(max_tokens) if max_tokens is not None else dist
        q = self._embed(key_text)
        with self._lock:
            baseline = self._baseline(stage, sid)
            rows = (self._stage[:self._count] == sid).nonzero()[0]
            if q.any():
                sims = _reference_dot(rows, self._emb, q).astype(np.float64)
            else:
                sims = np.ones(rows.size)
            if input_tokens is not None:
                factor = np.exp(np.abs(self._log_in[rows] - math.log1p(input_tokens))
                                * (-1.0 / self.input_scale))
                factor[np.isnan(factor)] = 1.0
                sims *= factor
            ok = (sims >= self.min_similarity) & (sims > 0)
            if not ok.any():
                dist = baseline
            else:
                rows, sims = rows[ok], sims[ok]
                if rows.size > self.k:
                    recency = (self._seq[rows] - self._observed) * (1e-9 / self.window)
                    top = (-(sims + recency)).argpartition(self.k - 1)[:self.k]
                    rows, sims = rows[top], sims[top]
                dist = Distribution._from_atoms(
                    np.concatenate((self._out[rows], baseline.values)),
                    np.concatenate((sims, baseline.probs * self.prior_strength)),
                    self.max_support)
        return dist.clip(max_tokens) if max_tokens is not None else dist


# ---------------------------------------------------------------------------- the tests


def _same(a: Distribution, b: Distribution) -> None:
    assert a.values.tobytes() == b.values.tobytes(), (a, b)
    assert a.probs.tobytes() == b.probs.tobytes(), (a, b)


@pytest.mark.parametrize("seed", range(8))
def test_predictions_are_the_floats_of_the_window_matrix(seed):
    rng = random.Random(seed)
    window = rng.choice([1, 5, 70, 300, 700])
    new, old = LearnedLengthModel(window=window), ReferenceLengthModel(window=window)
    if seed % 2:  # a prior whose atoms the outputs hit exactly, with uneven weights
        for m in (new, old):
            m.set_prior("revise", Distribution([5, 80, 81, 700], [0.1, 0.2, 0.3, 0.4]))
    # few stages, one of them dominant for a while, so a stage fills the whole window
    stages = ["revise", "evaluate", "generate_candidate", "x"][:rng.randint(1, 4)]
    keys = ["", *(f"question {i}" for i in range(rng.choice([1, 3, 40])))]
    predicted = 0
    for step in range(2500):
        heavy = stages[(step // 400) % len(stages)]
        stage = heavy if rng.random() < 0.7 else rng.choice(stages)
        if rng.random() < 0.55:
            args = (stage, rng.choice(keys), rng.choice([5, 80, 80, 700]),
                    rng.choice([None, 900, 1500, rng.randint(1, 5000)]))
            new.observe(*args)
            old.observe(*args)
        elif rng.random() < 0.15:
            _same(new.stage_distribution(stage), old.stage_distribution(stage))
        else:
            key = rng.choice(keys)
            prompt = rng.choice([None, 900, rng.randint(1, 5000)])
            cap = rng.choice([None, None, 50])
            _same(new.predict(stage, key, prompt, max_tokens=cap),
                  old.predict(stage, key, prompt, max_tokens=cap))
            predicted += 1
    assert predicted > 900
    assert new.observed > window  # the window wrapped (at 300 and 700: rows of 2+ blocks)


def test_a_stage_ring_holds_its_rows_in_slot_order_as_it_grows_and_wraps():
    m = LearnedLengthModel(window=200)
    rng = random.Random(3)
    key_at: dict[int, str] = {}  # window slot -> the key text observed there
    both = 0
    for _ in range(1500):
        key = f"q{rng.randint(0, 30)}"
        key_at[m._next] = key
        m.observe(rng.choice(["a", "a", "a", "b"]), key, 10.0, 100)
        for sid in m._stage_ids.values():
            rows = (m._stage[:m._count] == sid).nonzero()[0]
            current, previous = m._stage_rows(sid, rows)
            held = np.concatenate((current, previous))
            assert held.shape == (rows.size, m.embedder.dim)
            assert all(np.array_equal(held[j], m._embed(key_at[r]))
                       for j, r in enumerate(rows.tolist()))
            both += previous.shape[0] > 0 and current.shape[0] > 0
    assert both > 100  # rows of two laps at once, again and again
