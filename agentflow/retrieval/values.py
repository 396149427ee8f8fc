"""Find the database values a question names: 'Calvino' -> authors.name = 'Italo Calvino'.

Why a word index and not MinHash-LSH (what CHESS uses) or a full fuzzy scan: measured on a
synthetic 300k-value column, datasketch's MinHash over character 3-grams costs ~0.4 ms per
value to build (about two minutes for 300k values) and its low-threshold LSH returns a large
share of the index as candidates; a rapidfuzz scan over every value costs 60-400 ms per
keyword. This index builds 300k values in ~2 s and answers in ~1-2 ms per keyword
(``tests/retrieval/test_values.py`` holds it to that at 100k/300k). Values are mostly short
names and labels, so an inverted index from (stemmed) words to values finds candidates
directly, rapidfuzz tolerates typos at the *word* level (the vocabulary is far smaller than
the set of values), and a character-level ratio only re-ranks the few best candidates.
The index is built once per database file and cached on disk as plain numpy arrays.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rapidfuzz import fuzz, process

from agentflow.retrieval.text import norm_key, split_identifier, stem

# Bump when what the index stores, or how it is built, changes: old cache files are ignored.
FORMAT_VERSION = 2

DEFAULT_MAX_VALUE_LEN = 100
DEFAULT_MAX_VALUES_PER_COLUMN = 250_000

_TEXT_TYPES = ("CHAR", "TEXT", "CLOB", "STRING", "VARCHAR", "NAME")
# Last word of a column name that marks keys, hashes and locators: never looked up by value.
_KEYLIKE_WORDS = frozenset({"id", "ids", "uuid", "guid", "key", "pk", "fk", "hash", "md5", "sha",
                            "sha1", "sha256", "checksum", "token", "url", "uri", "href", "link",
                            "path", "password"})
_DATE_LIKE = re.compile(r"^\d{4}[-/.]\d{1,2}[-/.]\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?"
                        r"(Z|[+-]\d{2}:?\d{2})?$|^\d{1,2}:\d{2}(:\d{2})?$")


@dataclass(frozen=True)
class ValueMatch:
    """One stored value that resembles a keyword; ``score`` is 1.0 for an exact match."""

    table: str
    column: str
    value: str
    score: float
    keyword: str


@dataclass
class _Arrays:
    """The index proper, as flat arrays so it saves and loads without pickle."""

    columns: list[tuple[str, str]]
    entry_text: list[str]        # original value of each (column, value) entry
    entry_col: np.ndarray        # int32, column of each entry
    entry_norm: np.ndarray       # int32, normalised value of each entry (sorted by it)
    norms: list[str]             # distinct normalised values (norm_key)
    norm_entry_start: np.ndarray  # int64 CSR: entries of norm i are [start[i], start[i+1])
    norm_weight: np.ndarray      # float32, sum of idf over the distinct words of each norm
    vocab: list[str]             # distinct stemmed words, sorted
    idf: np.ndarray              # float32 per vocab word
    post_start: np.ndarray       # int64 CSR over postings
    postings: np.ndarray         # int32 norm ids, grouped by vocab word


@dataclass
class ValueIndex:
    """Distinct text values of a database's text columns, searchable by keyword.

    Build with ``ValueIndex.build(db)`` (disk-cached) or ``ValueIndex.for_database(db)`` (also
    cached in process); ``from_values`` indexes given values without a database.
    """

    arrays: _Arrays
    skipped: dict[str, str] = field(default_factory=dict)  # "table.column" -> why not indexed
    _norm_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _vocab_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _blocks: dict[tuple[int, str], list[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        a = self.arrays
        self._norm_ids = {n: i for i, n in enumerate(a.norms)}
        self._vocab_ids = {w: i for i, w in enumerate(a.vocab)}
        # Typo candidates are blocked by (length, first letter) and (length, last letter): a
        # typo rarely hits both ends, and the blocks are small enough to scan in microseconds.
        blocks: dict[tuple[int, str], list[str]] = {}
        for w in a.vocab:
            if w.isalpha() and len(w) >= 3:
                blocks.setdefault((len(w), "^" + w[0]), []).append(w)
                blocks.setdefault((len(w), w[-1] + "$"), []).append(w)
        self._blocks = blocks

    # ----------------------------------------------------------------------------- building
    @classmethod
    def from_values(cls, values: Mapping[tuple[str, str], Iterable[str]],
                    *, max_value_len: int = DEFAULT_MAX_VALUE_LEN) -> ValueIndex:
        """Index ``{(table, column): values}`` as given (no key/date filtering)."""
        columns: list[tuple[str, str]] = []
        entries: list[tuple[str, int, str]] = []  # (norm, column id, text)
        for col_id, (key, vals) in enumerate(sorted(values.items())):
            columns.append(key)
            seen: set[str] = set()
            for v in vals:
                if not isinstance(v, str) or len(v) > max_value_len or v in seen:
                    continue
                seen.add(v)
                n = norm_key(v)
                if n:
                    entries.append((n, col_id, v))
        return cls(_build_arrays(columns, entries))

    @classmethod
    def build(cls, db, *, max_value_len: int = DEFAULT_MAX_VALUE_LEN,
              max_values_per_column: int = DEFAULT_MAX_VALUES_PER_COLUMN,
              cache: bool = True, timeout_s: float = 120.0) -> ValueIndex:
        """Index ``db``'s text values, reusing the on-disk cache when the file is unchanged."""
        params = f"{max_value_len}|{max_values_per_column}"
        path = _cache_path(db, params) if cache else None
        if path is not None and path.is_file():
            try:
                return _load(path)
            except Exception:  # a truncated or foreign file: rebuild it
                pass
        values, skipped = collect_values(db, max_value_len=max_value_len,
                                         max_values_per_column=max_values_per_column,
                                         timeout_s=timeout_s)
        index = cls.from_values(values, max_value_len=max_value_len)
        index.skipped = skipped
        if path is not None:
            with contextlib.suppress(OSError):  # a read-only cache only costs a rebuild
                _save(index, path)
        return index

    @classmethod
    def for_database(cls, db, **kwargs) -> ValueIndex:
        """``build`` with a per-process cache: pipelines call this once per question."""
        params = "|".join(f"{k}={kwargs[k]}" for k in sorted(kwargs))
        key = (_file_identity(db) or f"db:{db.id}:{id(db)}", params)
        with _PROCESS_LOCK:
            lock = _KEY_LOCKS.setdefault(key, threading.Lock())
        with lock:
            index = _PROCESS_CACHE.get(key)
            if index is None:
                index = cls.build(db, **kwargs)
                _PROCESS_CACHE[key] = index
            return index

    # ----------------------------------------------------------------------------- queries
    @property
    def size(self) -> int:
        """Number of indexed (column, value) entries."""
        return len(self.arrays.entry_text)

    @property
    def columns(self) -> list[tuple[str, str]]:
        return list(self.arrays.columns)

    def lookup(self, keywords: Sequence[str], k: int = 10, *,
               min_score: float = 0.45) -> list[ValueMatch]:
        """Values resembling each keyword: up to ``k`` per keyword, best first overall.

        A value reached from several keywords is reported once, with its best score. Scores:
        1.0 for an exact (case/accent/punctuation-insensitive) match; otherwise the share of the
        keyword's words found in the value and of the value's words found in the keyword
        (rarer words count more; typos and prefixes count a little less than exact words),
        lightly re-ranked by character similarity.
        """
        best: dict[int, ValueMatch] = {}
        for keyword in dict.fromkeys(k_.strip() for k_ in keywords):
            if not keyword:
                continue
            for entry, score in self._lookup_one(keyword, k, min_score):
                a = self.arrays
                table, column = a.columns[int(a.entry_col[entry])]
                match = ValueMatch(table, column, a.entry_text[entry], round(score, 4), keyword)
                if entry not in best or best[entry].score < match.score:
                    best[entry] = match
        return sorted(best.values(), key=lambda m: (-m.score, m.table, m.column, m.value))

    def _lookup_one(self, keyword: str, k: int, min_score: float) -> list[tuple[int, float]]:
        a = self.arrays
        kw_norm = norm_key(keyword)
        kw_stems = list(dict.fromkeys(stem(w) for w in kw_norm.split()))
        if not kw_stems:
            return []
        # 1. keyword word -> matching vocabulary words with a similarity in (0, 1]
        matched: dict[int, float] = {}     # vocab id -> best similarity to any keyword word
        per_word: list[tuple[float, dict[int, float]]] = []
        mean_idf = float(a.idf.mean()) if len(a.idf) else 1.0
        for w in kw_stems:
            sims = self._similar_words(w)
            exact = self._vocab_ids.get(w)
            if exact is not None:
                weight = float(a.idf[exact])
            elif sims:
                weight = float(max(a.idf[v] for v in sims))
            else:
                weight = mean_idf
            per_word.append((weight, sims))
            for v, s in sims.items():
                if s > matched.get(v, 0.0):
                    matched[v] = s
        exact_norm = self._norm_ids.get(kw_norm)
        if kw_norm.replace(" ", "").isdigit():
            # A bare number only means itself: '3' is not a partial match of '32.3'.
            matched = {}
            per_word = [(1.0, {})]
        if not matched and exact_norm is None:
            return []
        # 2. candidate values: postings of the matched words, rarest first, capped
        order = sorted(matched, key=lambda v: (-float(a.idf[v]), v))
        chunks, total = [], 0
        for v in order:
            lo, hi = int(a.post_start[v]), int(a.post_start[v + 1])
            if total and total + (hi - lo) > _MAX_CANDIDATES:
                continue
            chunks.append(a.postings[lo:hi])
            total += hi - lo
        if exact_norm is not None:
            chunks.append(np.array([exact_norm], dtype=np.int32))
        cand = np.unique(np.concatenate(chunks)) if chunks else np.zeros(0, np.int32)
        # 3. coarse score: coverage of the keyword by the value and of the value by the keyword
        total_weight = sum(wt for wt, _ in per_word)
        kw_cov = np.zeros(len(cand), np.float32)
        for weight, sims in per_word:
            got = np.zeros(len(cand), np.float32)
            for v, s in sims.items():
                pos = _positions(cand, a.postings[a.post_start[v]:a.post_start[v + 1]])
                np.maximum.at(got, pos, s)
            kw_cov += weight * got
        kw_cov /= total_weight
        val_hit = np.zeros(len(cand), np.float32)
        for v, s in matched.items():
            pos = _positions(cand, a.postings[a.post_start[v]:a.post_start[v + 1]])
            np.add.at(val_hit, pos, float(a.idf[v]) * s)
        val_cov = np.minimum(val_hit / np.maximum(a.norm_weight[cand], 1e-6), 1.0)
        coarse = 0.65 * kw_cov + 0.35 * val_cov
        # 4. re-rank the best few by character similarity; exact matches score 1.0
        top = [int(i) for i in np.argsort(-coarse, kind="stable")[:max(4 * k, 32)]]
        if exact_norm is not None:
            top.append(int(np.searchsorted(cand, exact_norm)))
        scored: list[tuple[float, int]] = []
        for i in dict.fromkeys(top):
            n = int(cand[i])
            if n == exact_norm:
                score = 1.0
            else:
                char = fuzz.ratio(kw_norm, a.norms[n]) / 100.0
                score = min(0.99, 0.85 * float(coarse[i]) + 0.15 * char)
            if score >= min_score:
                scored.append((score, n))
        scored.sort(key=lambda t: (-t[0], a.norms[t[1]]))
        out: list[tuple[int, float]] = []
        for score, n in scored:
            for e in range(int(a.norm_entry_start[n]), int(a.norm_entry_start[n + 1])):
                out.append((e, score))
            if len(out) >= k:
                break
        return out[:k]

    def _similar_words(self, w: str) -> dict[int, float]:
        """Vocabulary words equal to, a typo of, or extending ``w``: id -> similarity."""
        sims: dict[int, float] = {}
        exact = self._vocab_ids.get(w)
        if exact is not None:
            sims[exact] = 1.0
        if len(w) < 4 or not w.isalpha():
            return sims
        if exact is None:
            # typos: words of about the same length within an edit or two, sharing an end
            cutoff = 80 if len(w) <= 6 else 84
            found: list[tuple[float, str]] = []
            for n in range(len(w) - 2, len(w) + 3):
                for block in ((n, "^" + w[0]), (n, w[-1] + "$")):
                    choices = self._blocks.get(block)
                    if choices:
                        found.extend((score, cand) for cand, score, _ in process.extract(
                            w, choices, scorer=fuzz.ratio, score_cutoff=cutoff,
                            limit=_MAX_FUZZY))
            for score, cand in sorted(found, key=lambda t: (-t[0], t[1]))[:_MAX_FUZZY]:
                vid = self._vocab_ids[cand]
                # squared: a typo of the whole value should rank below an exact word inside one
                sims[vid] = max(sims.get(vid, 0.0), 0.9 * (score / 100.0) ** 2)
        # prefixes: 'calv' -> 'calvino' (a partial word counts less the more is missing)
        vocab = self.arrays.vocab
        i = bisect.bisect_left(vocab, w)
        for cand in vocab[i:i + _MAX_PREFIX]:
            if not cand.startswith(w):
                break
            vid = self._vocab_ids[cand]
            sims[vid] = max(sims.get(vid, 0.0), 0.6 + 0.3 * len(w) / len(cand))
        return sims


_MAX_CANDIDATES = 20_000
_MAX_FUZZY = 8
_MAX_PREFIX = 8

_PROCESS_LOCK = threading.Lock()
_KEY_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_PROCESS_CACHE: dict[tuple[str, str], ValueIndex] = {}


def _positions(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Where each of ``ids`` sits in ``sorted_ids``; ids left out of the candidates are dropped."""
    pos = np.searchsorted(sorted_ids, ids)
    ok = pos < len(sorted_ids)
    pos, ids = pos[ok], ids[ok]
    return pos[sorted_ids[pos] == ids]


# --------------------------------------------------------------------------------- building
def _build_arrays(columns: list[tuple[str, str]], entries: list[tuple[str, int, str]]) -> _Arrays:
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    norms: list[str] = []
    entry_norm = np.empty(len(entries), np.int32)
    starts: list[int] = []
    for i, (n, _, _) in enumerate(entries):
        if not norms or norms[-1] != n:
            norms.append(n)
            starts.append(i)
        entry_norm[i] = len(norms) - 1
    starts.append(len(entries))
    # words of each distinct value -> postings
    vocab_ids: dict[str, int] = {}
    pairs_word: list[int] = []
    pairs_norm: list[int] = []
    for ni, n in enumerate(norms):
        for w in set(stem(t) for t in n.split()):
            wid = vocab_ids.setdefault(w, len(vocab_ids))
            pairs_word.append(wid)
            pairs_norm.append(ni)
    # renumber vocab in sorted order (prefix search uses bisect)
    vocab = sorted(vocab_ids)
    remap = np.empty(len(vocab_ids), np.int32)
    for new, w in enumerate(vocab):
        remap[vocab_ids[w]] = new
    pw = remap[np.asarray(pairs_word, np.int32)] if pairs_word else np.zeros(0, np.int32)
    pn = np.asarray(pairs_norm, np.int32)
    order = np.lexsort((pn, pw))
    pw, pn = pw[order], pn[order]
    df = np.bincount(pw, minlength=len(vocab)).astype(np.float64)
    post_start = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
    idf = np.log1p(max(len(norms), 1) / np.maximum(df, 1.0)).astype(np.float32)
    norm_weight = np.bincount(pn, weights=idf[pw].astype(np.float64),
                              minlength=len(norms)).astype(np.float32)
    return _Arrays(
        columns=list(columns), entry_text=[e[2] for e in entries],
        entry_col=np.asarray([e[1] for e in entries], np.int32), entry_norm=entry_norm,
        norms=norms, norm_entry_start=np.asarray(starts, np.int64), norm_weight=norm_weight,
        vocab=vocab, idf=idf, post_start=post_start, postings=pn.astype(np.int32))


def is_text_type(declared: str) -> bool:
    declared = (declared or "").upper()
    return not declared or any(t in declared for t in _TEXT_TYPES)


def is_key_like(table, column) -> bool:
    """Surrogate keys, hashes and locators: matching question words against them adds noise.

    A key column that holds words stays in: Spider keys tables by names and languages
    (``countrylanguage`` has ``PRIMARY KEY (CountryCode, Language)``), and questions name them.
    """
    parts = split_identifier(column.name)
    if parts and parts[-1] in _KEYLIKE_WORDS:
        return True
    is_key = column.primary_key or any(
        column.name.lower() in (c.lower() for c in fk.columns) for fk in table.foreign_keys)
    return is_key and "INT" in (column.type or "").upper()


def collect_values(db, *, max_value_len: int = DEFAULT_MAX_VALUE_LEN,
                   max_values_per_column: int = DEFAULT_MAX_VALUES_PER_COLUMN,
                   timeout_s: float = 120.0) -> tuple[dict[tuple[str, str], list[str]],
                                                      dict[str, str]]:
    """Distinct short text values of every text, non-key column (most frequent first when
    capped), and why the other columns were left out."""
    from agentflow.sql.schema import quote_ident as q
    from agentflow.sql.schema import sampled_source

    values: dict[tuple[str, str], list[str]] = {}
    skipped: dict[str, str] = {}
    for table in db.schema().tables:
        for column in table.columns:
            name = f"{table.name}.{column.name}"
            if not is_text_type(column.type):
                continue
            if is_key_like(table, column):
                skipped[name] = "key-like column"
                continue
            col = q(column.name)
            # Big PostgreSQL tables are sampled (frequent values survive a sample).
            sql = (f"SELECT {col} FROM {sampled_source(db, table, 100_000)} "
                   f"WHERE {col} IS NOT NULL "
                   f"AND length({col}) <= {int(max_value_len)} GROUP BY {col} "
                   f"ORDER BY count(*) DESC, {col} LIMIT {int(max_values_per_column)}")
            result = db.try_execute(sql, timeout_s=timeout_s, max_rows=max_values_per_column)
            if not hasattr(result, "rows"):
                skipped[name] = f"could not read values: {result}"
                continue
            vals = [r[0] for r in result.rows if isinstance(r[0], str) and r[0].strip()]
            if not vals:
                continue
            sample = vals[:50]
            if sum(bool(_DATE_LIKE.match(v.strip())) for v in sample) >= 0.9 * len(sample):
                skipped[name] = "date/time values"
                continue
            values[(table.name, column.name)] = vals
    return values, skipped


# ---------------------------------------------------------------------------- disk cache
def _file_identity(db) -> str | None:
    path = getattr(db, "path", None)
    if path is None:
        return None
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return f"{Path(path).resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _cache_path(db, params: str) -> Path | None:
    from agentflow.datasets.types import cache_dir

    ident = _file_identity(db)
    if ident is None:
        return None
    digest = hashlib.sha1(f"{ident}|{params}|v{FORMAT_VERSION}".encode()).hexdigest()[:20]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", str(db.id))[:60]
    return cache_dir() / "values" / f"{safe}-{digest}.npz"


def _pack(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    if encoded:
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return np.frombuffer(b"".join(encoded), np.uint8), offsets


def _unpack(blob: np.ndarray, offsets: np.ndarray) -> list[str]:
    data = blob.tobytes()
    off = offsets.tolist()
    return [data[off[i]:off[i + 1]].decode("utf-8", "surrogatepass") for i in range(len(off) - 1)]


def _save(index: ValueIndex, path: Path) -> None:
    """Write to a temporary file and rename: concurrent builders never see half a file."""
    a = index.arrays
    arrays: dict[str, np.ndarray] = {}
    for name in ("entry_text", "norms", "vocab"):
        arrays[f"{name}_blob"], arrays[f"{name}_off"] = _pack(getattr(a, name))
    arrays["col_blob"], arrays["col_off"] = _pack([f"{t}\x00{c}" for t, c in a.columns])
    skipped = [f"{k}\x00{v}" for k, v in sorted(index.skipped.items())]
    arrays["skip_blob"], arrays["skip_off"] = _pack(skipped)
    for name in ("entry_col", "entry_norm", "norm_entry_start", "norm_weight", "idf",
                 "post_start", "postings"):
        arrays[name] = getattr(a, name)
    arrays["version"] = np.array([FORMAT_VERSION], np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            buf = io.BytesIO()
            np.savez(buf, allow_pickle=False, **arrays)
            fh.write(buf.getvalue())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _pair(packed: str) -> tuple[str, str]:
    first, second = packed.split("\x00", 1)
    return first, second


def _load(path: Path) -> ValueIndex:
    with np.load(path, allow_pickle=False) as z:
        if int(z["version"][0]) != FORMAT_VERSION:
            raise ValueError("stale value index format")
        cols = [_pair(s) for s in _unpack(z["col_blob"], z["col_off"])]
        skipped = dict(_pair(s) for s in _unpack(z["skip_blob"], z["skip_off"]))
        arrays = _Arrays(
            columns=cols, entry_text=_unpack(z["entry_text_blob"], z["entry_text_off"]),
            entry_col=z["entry_col"], entry_norm=z["entry_norm"],
            norms=_unpack(z["norms_blob"], z["norms_off"]),
            norm_entry_start=z["norm_entry_start"], norm_weight=z["norm_weight"],
            vocab=_unpack(z["vocab_blob"], z["vocab_off"]), idf=z["idf"],
            post_start=z["post_start"], postings=z["postings"])
    return ValueIndex(arrays, skipped=skipped)

