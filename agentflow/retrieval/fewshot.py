"""Few-shot examples for SQL generation: the pool questions most like the asked one.

Similarity is taken on *masked* questions, as DAIL-SQL does: schema words, names and numbers
are replaced by placeholders, so "How many singers are older than 30?" meets "How many
employees are older than 50?" (same query shape) rather than any question that happens to
mention singers. TF-IDF over words and word pairs is enough for that and builds in well under
a second for Spider's train split; there is no model to load. With a draft SQL
(``sql_hint``) the ranking also prefers examples whose gold SQL has the same skeleton.

The pool must come from a split other than the one evaluated (``ensure_disjoint`` checks).
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow.retrieval.text import fold, split_identifier, stem

_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|‘[^’]*’|(?<![\w])'[^']*'(?![\w])")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,:/-]\d+)*%?")
_TOKEN = re.compile(r"<[a-z]>|[^\W_]+", re.UNICODE)
_SQL_TOKEN = re.compile(r"'(?:[^']|'')*'|\"[^\"]*\"|`[^`]*`|\[[^\]]*\]|\d+(?:\.\d+)?|\w+|[^\s\w]")
_SQL_KEYWORDS = frozenset("""
select from where group by order having limit join inner left right outer full cross on as and
or not in exists between like is null distinct union intersect except all any count sum avg min
max asc desc case when then else end cast with offset natural using iif substr strftime abs
round length lower upper coalesce ifnull nullif instr
""".split())
_QUESTION_WORDS = frozenset("""
what which who whom whose when where why how many much is are was were do does did the a an of
in on for to by with and or not no than more less most least each every all any both either
only at from between before after above below top first last same different average total
number count maximum minimum largest smallest highest lowest greatest order sorted descending
ascending alphabetical list show give find return name names per distinct also have has had
there their them it its that this these those be been being
""".split())


@dataclass(frozen=True)
class FewShot:
    """One retrieved example and how similar it is (cosine of masked questions, 0..1)."""

    example: Any  # agentflow.datasets.Example
    score: float
    question_score: float
    skeleton_score: float | None = None


class FewShotPool:
    """Examples (e.g. Spider train) indexed for similarity search on masked questions."""

    def __init__(self, examples: Sequence[Any], *,
                 schema_words: dict[str, frozenset[str]] | None = None):
        self.examples = list(examples)
        self._schema_words = dict(schema_words or {})
        docs = [_features(mask_question(e.question, self._schema_words.get(e.db_id)))
                for e in self.examples]
        self._vocab: dict[str, int] = {}
        df: Counter[str] = Counter()
        for doc in docs:
            df.update(doc.keys())
        n = len(docs)
        self._idf = {t: math.log((1 + n) / (1 + c)) + 1.0 for t, c in df.items()}
        postings: dict[int, tuple[list[int], list[float]]] = {}
        for i, doc in enumerate(docs):
            vec = _weights(doc, self._idf)
            for term, w in vec.items():
                tid = self._vocab.setdefault(term, len(self._vocab))
                ids, ws = postings.setdefault(tid, ([], []))
                ids.append(i)
                ws.append(w)
        self._post = {t: (np.asarray(ids, np.int32), np.asarray(ws, np.float32))
                      for t, (ids, ws) in postings.items()}
        self._db_ids = np.asarray([e.db_id for e in self.examples], dtype=object)
        self._skeletons: list[frozenset[str]] | None = None

    # ------------------------------------------------------------------------- building
    @classmethod
    def from_dataset(cls, dataset: Any, *, exclude_db_ids: Iterable[str] = ()) -> FewShotPool:
        """A pool over a dataset's examples, masking each with its database's schema words."""
        excluded = set(exclude_db_ids)
        words = {db_id: schema_words_from_tables_json(entry.tables_json)
                 for db_id, entry in dataset.databases.items() if entry.tables_json}
        examples = [e for e in dataset.examples if e.db_id not in excluded]
        return cls(examples, schema_words=words)

    @classmethod
    def for_dataset(cls, dataset: Any) -> FewShotPool:
        """``from_dataset`` with a per-process cache keyed by the dataset's folder and split."""
        root = getattr(dataset, "root", None)
        key = (str(root), getattr(dataset, "split", ""), len(dataset.examples)) if root else \
            ("object", id(dataset))
        with _LOCK:
            pool = _POOLS.get(key)
            if pool is None:
                pool = cls.from_dataset(dataset)
                _POOLS[key] = pool
            return pool

    def ensure_disjoint(self, evaluated: Any) -> None:
        """Raise if any question of ``evaluated`` (a Dataset or examples) is in the pool."""
        items = getattr(evaluated, "examples", evaluated)
        mine = {(e.db_id, fold(e.question).strip()) for e in self.examples}
        leaked = [e for e in items if (e.db_id, fold(e.question).strip()) in mine]
        if leaked:
            raise ValueError(f"{len(leaked)} evaluated questions are in the few-shot pool "
                             f"(first: {leaked[0].question!r}); build the pool from another split")

    def __len__(self) -> int:
        return len(self.examples)

    # --------------------------------------------------------------------------- queries
    def query(self, question: str, k: int = 4, *, db: Any = None,
              schema_words: Iterable[str] | None = None, exclude_db_ids: Iterable[str] = (),
              sql_hint: str | None = None, skeleton_weight: float = 0.3) -> list[FewShot]:
        """The ``k`` most similar examples, best first; ties go to the earlier example.

        ``db`` (or ``schema_words``) masks the asked question's schema words the way pool
        questions were masked. ``sql_hint``, a draft SQL, mixes in skeleton similarity of the
        gold SQL with weight ``skeleton_weight``.
        """
        if k <= 0 or not self.examples:
            return []
        if schema_words is not None:
            words: frozenset[str] | None = frozenset(
                stem(w) for n in schema_words for w in split_identifier(n) if len(w) > 1)
        else:
            words = schema_words_from_db(db) if db is not None else None
        vec = _weights(_features(mask_question(question, words)), self._idf)
        scores = np.zeros(len(self.examples), np.float32)
        for term, w in vec.items():
            tid = self._vocab.get(term)
            if tid is not None:
                ids, ws = self._post[tid]
                scores[ids] += w * ws
        excluded = set(exclude_db_ids)
        if excluded:
            scores[np.isin(self._db_ids, list(excluded))] = -1.0
        q_scores = scores
        hint = sql_skeleton(sql_hint) if sql_hint else None
        if hint is not None:
            shortlist = _top(scores, max(10 * k, 50))
            skel = self._skeleton_list()
            mixed = np.full(len(self.examples), -1.0, np.float32)
            for i in shortlist:
                if scores[i] >= 0:
                    mixed[i] = ((1 - skeleton_weight) * scores[i]
                                + skeleton_weight * _jaccard(hint, skel[i]))
            scores = mixed
        out = []
        for i in _top(scores, k):
            if scores[i] < 0:
                break
            skel_score = _jaccard(hint, self._skeleton_list()[i]) if hint is not None else None
            out.append(FewShot(self.examples[i], round(float(scores[i]), 4),
                               round(float(q_scores[i]), 4), skel_score))
        return out

    def _skeleton_list(self) -> list[frozenset[str]]:
        if self._skeletons is None:
            self._skeletons = [sql_skeleton(e.gold_sql) for e in self.examples]
        return self._skeletons


_LOCK = threading.Lock()
_POOLS: dict[tuple, FewShotPool] = {}


def _top(scores: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` highest scores, ties broken by index (stable)."""
    order = np.argsort(-scores, kind="stable")
    return [int(i) for i in order[:k]]


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return round(len(a & b) / len(a | b), 4)


# -------------------------------------------------------------------------------- masking
def mask_question(question: str, schema_words: frozenset[str] | None = None) -> list[str]:
    """Question words with values as <v>, numbers as <n> and schema words as <s>."""
    text = _QUOTED.sub(" <v> ", question)
    text = _NUMBER.sub(" <n> ", text)
    out: list[str] = []
    sentence_start = True
    for m in re.finditer(r"<[vn]>|[^\s]+", text):
        raw = m.group(0)
        if raw in ("<v>", "<n>"):
            out.append(raw)
            sentence_start = False
            continue
        for tok in _TOKEN.findall(raw):
            low = fold(tok)
            if not sentence_start and tok[:1].isupper() and low not in _QUESTION_WORDS:
                out.append("<v>")
            elif schema_words and low not in _QUESTION_WORDS and stem(low) in schema_words:
                out.append("<s>")
            else:
                out.append(low)
            sentence_start = False
        if raw.endswith((".", "?", "!")):
            sentence_start = True
    # runs of the same placeholder are one slot: 'Italo Calvino' is one value
    collapsed: list[str] = []
    for tok in out:
        if not (collapsed and tok.startswith("<") and collapsed[-1] == tok):
            collapsed.append(tok)
    return collapsed


def _features(tokens: Sequence[str]) -> Counter[str]:
    feats: Counter[str] = Counter(tokens)
    feats.update(f"{a} {b}" for a, b in zip(tokens, tokens[1:]))
    return feats


def _weights(feats: Counter[str], idf: dict[str, float]) -> dict[str, float]:
    """Sublinear TF x IDF, L2-normalised; unseen terms have no weight."""
    vec = {t: (1.0 + math.log(c)) * idf[t] for t, c in feats.items() if t in idf}
    norm = math.sqrt(sum(w * w for w in vec.values()))
    return {t: w / norm for t, w in vec.items()} if norm else {}


def schema_words_from_tables_json(entry: dict) -> frozenset[str]:
    """Stemmed words of a Spider/BIRD ``tables.json`` entry's table and column names."""
    names: list[str] = []
    for key in ("table_names_original", "table_names"):
        names.extend(entry.get(key) or [])
    for key in ("column_names_original", "column_names"):
        names.extend(c[1] for c in entry.get(key) or [] if c and c[1] != "*")
    return frozenset(stem(w) for n in names for w in split_identifier(n) if len(w) > 1)


_DB_WORDS: dict[str, frozenset[str]] = {}


def schema_words_from_db(db: Any) -> frozenset[str]:
    key = f"{getattr(db, 'id', '')}:{getattr(db, 'path', '')}"
    words = _DB_WORDS.get(key)
    if words is None:
        names = [t.name for t in db.schema().tables]
        names += [c.name for t in db.schema().tables for c in t.columns]
        words = frozenset(stem(w) for n in names for w in split_identifier(n) if len(w) > 1)
        _DB_WORDS[key] = words
    return words


# ------------------------------------------------------------------------------ skeletons
def sql_skeleton(sql: str) -> frozenset[str]:
    """The query's shape as a set of keyword n-grams: identifiers and literals become '_'.

    Regex-based rather than sqlglot: parsing 6k gold queries with sqlglot takes seconds, and
    a skeleton only needs the keyword sequence.
    """
    toks: list[str] = []
    for tok in _SQL_TOKEN.findall(sql or ""):
        low = tok.lower()
        if low in _SQL_KEYWORDS:
            toks.append(low)
        elif tok in ("(", ")", ",", "*", "=", "<", ">", "!", "-", "+", "/"):
            toks.append(tok)
        elif not toks or toks[-1] != "_":
            toks.append("_")
    grams = set(toks)
    grams.update(f"{a} {b}" for a, b in zip(toks, toks[1:]))
    grams.update(f"{a} {b} {c}" for a, b, c in zip(toks, toks[1:], toks[2:]))
    return frozenset(grams)
