"""Pick the tables and columns a question needs, without an LLM.

A 270M model writes better SQL from a short schema than from a long one, but it cannot write
a query at all over a table that was pruned away; so table selection errs towards recall
(it is cheap to keep a table's keys) and column pruning is where the prompt gets shorter.
Scores are lexical: question (and evidence) words against the words of table and column
names, plus the columns whose stored values the question names. Tables that only serve to
join two chosen tables are added from the foreign-key graph, so the selection always joins.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from rapidfuzz import fuzz

from agentflow.retrieval.text import STOP_WORDS, split_identifier, stem, words

DEFAULT_TABLE_THRESHOLD = 0.5
DEFAULT_COLUMN_THRESHOLD = 0.5
DEFAULT_MIN_COLUMNS = 3
DEFAULT_MAX_COLUMNS_PER_TABLE = 12

# Words that name a column's role more than its content: weak evidence on their own.
_WEAK = frozenset({"id", "name", "code", "type", "date", "number", "no", "num", "desc",
                   "description", "detail", "details", "info", "value", "other", "flag"})
# A few question words that name a column or table by what it measures rather than by its
# name. Generic on purpose (commerce, people, places): matched at 0.8, below a literal word.
_SYNONYM_GROUPS = [
    ("sold sell selling sale sales bought buy buying purchase purchased best-selling copies",
     "order item sale purchase quantity"),
    ("spent spend paid pay revenue turnover", "price amount cost payment total"),
    ("earn earns earned earning earnings income wage wages paid", "salary earning income"),
    ("tall taller tallest short shorter shortest", "height"),
    ("heavy heavier heaviest light lighter lightest weigh weighs weighing weighed", "weight"),
    ("old older oldest young younger youngest", "age birth"),
    ("expensive cheap cheaper cheapest costly", "price cost"),
    ("big bigger biggest large larger largest small smaller smallest", "size area capacity"),
    ("populous populated inhabitants", "population"),
    ("long longer longest lasting", "length duration"),
    ("speak speaks spoke spoken", "language"),
    ("nation nations national nationality", "country nationality"),
    ("located location live lives living situated", "location city country address"),
    ("born", "birth"),
    ("wrote written write writer", "author"),
    ("rated rating stars star", "rating star"),
    ("hired", "hire"),
]
_SYNONYMS: dict[str, frozenset[str]] = {}
for _words, _targets in _SYNONYM_GROUPS:
    for _w in _words.split():
        _SYNONYMS[stem(_w)] = _SYNONYMS.get(stem(_w), frozenset()) | frozenset(
            stem(t) for t in _targets.split())

# Words that make a column a good default to show (what a row *is*), even when unnamed.
_DESCRIPTIVE = ("name", "title", "label")


@dataclass
class SchemaSelection:
    """Chosen tables and, per table, chosen columns (keys included), with the scores.

    ``tables`` goes straight into ``db.schema_prompt(tables=...)``. ``reasons`` says, per
    table, why it is there ("question", "value", "join", "fallback").
    """

    tables: dict[str, list[str]]
    table_scores: dict[str, float] = field(default_factory=dict)
    column_scores: dict[str, dict[str, float]] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    total_columns: int = 0

    @property
    def selected_columns(self) -> int:
        return sum(len(cols) for cols in self.tables.values())

    @property
    def pruning_ratio(self) -> float:
        """Share of the database's columns left out of the prompt."""
        if not self.total_columns:
            return 0.0
        return 1.0 - self.selected_columns / self.total_columns

    def explain(self) -> str:
        lines = []
        for table, cols in self.tables.items():
            scored = ", ".join(f"{c} {self.column_scores.get(table, {}).get(c, 0.0):.2f}"
                               for c in cols)
            lines.append(f"{table} ({self.reasons.get(table, '?')}, "
                         f"{self.table_scores.get(table, 0.0):.2f}): {scored}")
        return "\n".join(lines)


def link_schema(db: Any, question: str, evidence: str = "", *,
                value_matches: Iterable[Any] | None = None,
                max_tables: int | None = None,
                max_columns_per_table: int | None = DEFAULT_MAX_COLUMNS_PER_TABLE,
                min_columns: int = DEFAULT_MIN_COLUMNS,
                table_threshold: float = DEFAULT_TABLE_THRESHOLD,
                column_threshold: float = DEFAULT_COLUMN_THRESHOLD,
                descriptions: Mapping[str, Mapping[str, Any]] | None = None) -> SchemaSelection:
    """Select the schema for ``question`` over ``db`` (anything with ``.schema()``).

    ``value_matches`` are ``ValueMatch``-like objects (``table``, ``column``, ``score``) from
    value lookup; ``descriptions`` maps table -> column -> text (or a BIRD
    ``ColumnDescription``) and lets descriptive names count as column names.
    ``max_columns_per_table`` caps the non-key columns kept per table (``None``: no cap);
    ``max_tables`` caps the tables chosen on their own merit (bridge tables come on top).
    """
    schema = db.schema()
    q = _QuestionWords(question, evidence)
    idf = _name_idf(schema)
    value_hits: dict[tuple[str, str], float] = {}
    name_words = _schema_words(schema)
    for m in value_matches or ():
        key = (m.table.lower(), m.column.lower())
        score = float(m.score)
        # 'countries' partly matching the value 'ford country' says little when the schema
        # itself has a 'country' name: the word is about the schema, not about a value.
        kw = {stem(w) for w in words(getattr(m, "keyword", ""))}
        if score < 0.95 and kw and kw <= name_words:
            score *= 0.5
        value_hits[key] = max(value_hits.get(key, 0.0), score)

    table_scores: dict[str, float] = {}
    column_scores: dict[str, dict[str, float]] = {}
    reasons: dict[str, str] = {}
    for table in schema.tables:
        t_name = _name_score(split_identifier(table.name), q, idf)
        cols: dict[str, float] = {}
        fk_cols = {c.lower() for fk in table.foreign_keys for c in fk.columns}
        best_col = 0.0
        best_value = 0.0
        for column in table.columns:
            names = [split_identifier(column.name)]
            desc = _description(descriptions, table.name, column.name)
            if desc is not None:
                expanded, text = desc
                if expanded:
                    names.append(words(expanded))
            score = max(_name_score(n, q, idf) for n in names)
            if desc is not None and desc[1]:
                score = max(score, 0.6 * _overlap(words(desc[1]), q))
            if column.name.lower() in q.identifiers or \
                    f"{table.name}.{column.name}".lower() in q.identifiers:
                score = 1.0
            value = value_hits.get((table.name.lower(), column.name.lower()), 0.0)
            best_value = max(best_value, value)
            score = max(score, value)
            cols[column.name] = round(score, 4)
            # A column only vouches for its table as far as its words are specific, and a
            # foreign key barely: 'city.CountryCode' names the country table, not the city.
            weight = 0.6 if column.name.lower() in fk_cols else 1.0
            best_col = max(best_col,
                           weight * score * _specificity(split_identifier(column.name)))
        if table.name.lower() in q.identifiers:
            t_name = 1.0
        t_score = max(t_name, best_value, 0.9 * best_col)
        table_scores[table.name] = round(t_score, 4)
        column_scores[table.name] = cols
        reasons[table.name] = ("value" if best_value >= max(t_name, 0.9 * best_col) and
                               best_value > 0 else "question")

    ranked = sorted(schema.tables, key=lambda t: (-table_scores[t.name], t.name))
    chosen = [t.name for t in ranked if table_scores[t.name] >= table_threshold]
    if max_tables is not None:
        chosen = chosen[:max_tables]
    if not chosen and ranked:
        chosen = [ranked[0].name]
        reasons[ranked[0].name] = "fallback"
    chosen = _connect(schema, chosen, reasons)

    selection: dict[str, list[str]] = {}
    for table in schema.tables:  # schema order keeps prompts stable
        if table.name not in chosen:
            continue
        selection[table.name] = _columns_for(table, column_scores[table.name],
                                             reasons[table.name] == "join", column_threshold,
                                             min_columns, max_columns_per_table)
    return SchemaSelection(tables=selection, table_scores=table_scores,
                           column_scores=column_scores,
                           reasons={t: reasons[t] for t in selection},
                           total_columns=sum(len(t.columns) for t in schema.tables))


# ------------------------------------------------------------------------------- scoring
class _QuestionWords:
    """The question's words in the forms names are compared with."""

    def __init__(self, question: str, evidence: str):
        text = f"{question} {evidence}".strip()
        raw = words(text)
        self.stems = [stem(w) for w in raw]
        self.set = set(self.stems)
        # 'home town' meets 'hometown', 'zip code' meets 'zipcode'
        self.set |= {raw[i] + raw[i + 1] for i in range(len(raw) - 1)}
        self.set |= {stem(raw[i] + raw[i + 1]) for i in range(len(raw) - 1)}
        self.synonyms = set().union(*(_SYNONYMS.get(s, frozenset()) for s in self.stems)) \
            if self.stems else set()
        self.content = sorted({s for s, w in zip(self.stems, raw)
                               if w not in STOP_WORDS and len(s) > 2})
        # Names written as identifiers ('returned_on', 'author.name', 'StatusType') are
        # schema references, mostly in BIRD evidence: an exact hit is certain.
        self.identifiers = {m.lower() for m in re.findall(r"[A-Za-z_]\w*(?:\.\w+)?", text)
                            if "_" in m or "." in m
                            or (any(c.isupper() for c in m[1:]) and any(c.islower() for c in m))}
        self.identifiers |= {i.split(".", 1)[0] for i in self.identifiers if "." in i}
        self._cache: dict[str, float] = {}

    def sim(self, token: str) -> float:
        """How well the question contains ``token`` (a stemmed name word): 1, 0.8, 0.7 or 0."""
        hit = self._cache.get(token)
        if hit is not None:
            return hit
        if token in self.set:
            best = 1.0
        elif token in self.synonyms:
            best = 0.8
        else:
            best = 0.0
            for w in self.content:
                p = _common_prefix(token, w)
                if p >= 4 and p >= min(len(token), len(w)) - 3:
                    best = max(best, 0.8)
                elif len(token) >= 5 and len(w) >= 5 and fuzz.ratio(token, w) >= 85:
                    best = max(best, 0.7)
        self._cache[token] = best
        return best


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _name_idf(schema: Any) -> dict[str, float]:
    """Rarity of each name word across the schema's column and table names."""
    df: dict[str, int] = {}
    n = 0
    for table in schema.tables:
        for name in [table.name] + [c.name for c in table.columns]:
            n += 1
            for tok in set(_name_tokens(split_identifier(name))):
                df[tok] = df.get(tok, 0) + 1
    return {tok: math.log1p(n / d) for tok, d in df.items()}


def _schema_words(schema: Any) -> set[str]:
    out: set[str] = set()
    for table in schema.tables:
        for name in [table.name] + [c.name for c in table.columns]:
            out.update(stem(p) for p in split_identifier(name))
    return out


def _name_tokens(parts: Sequence[str]) -> list[str]:
    toks = [stem(p) for p in parts if len(p) > 1 and not p.isdigit()]
    return toks or [stem(p) for p in parts]


def _token_weight(tok: str, idf: Mapping[str, float]) -> float:
    w = idf.get(tok, max(idf.values(), default=1.0))
    return w * (0.5 if tok in _WEAK else 1.0)


def _name_score(parts: Sequence[str], q: _QuestionWords, idf: Mapping[str, float]) -> float:
    """Weighted share of a name's words that the question contains (whole name: 1.0)."""
    toks = _name_tokens(parts)
    if not toks:
        return 0.0
    joined = "".join(parts)
    if joined in q.set or stem(joined) in q.set:
        return 1.0
    total = sum(_token_weight(t, idf) for t in toks)
    got = sum(_token_weight(t, idf) * q.sim(t) for t in toks)
    return got / total if total else 0.0


def _specificity(parts: Sequence[str]) -> float:
    """1.0 for a name made of distinctive words, lower for 'name', 'id', 'type'..."""
    toks = _name_tokens(parts)
    if not toks:
        return 0.0
    strong = [t for t in toks if t not in _WEAK]
    return 1.0 if strong else 0.6


def _overlap(desc_words: Sequence[str], q: _QuestionWords) -> float:
    content = {stem(w) for w in desc_words if w not in STOP_WORDS and len(w) > 2}
    if not content:
        return 0.0
    hits = sum(1 for t in content if t in q.set)
    return min(1.0, hits / min(3, len(content)))


def _description(descriptions: Mapping[str, Mapping[str, Any]] | None, table: str,
                 column: str) -> tuple[str, str] | None:
    if not descriptions:
        return None
    per_table = descriptions.get(table) or descriptions.get(table.lower())
    if not per_table:
        return None
    item = per_table.get(column) or per_table.get(column.lower())
    if item is None:
        return None
    if isinstance(item, str):
        return "", item
    expanded = getattr(item, "column_name", "") or ""
    text = " ".join(filter(None, [getattr(item, "column_description", ""),
                                  getattr(item, "value_description", "")]))
    return expanded, text


# ------------------------------------------------------------------------------ selection
def fk_graph(schema: Any) -> nx.Graph:
    """Undirected join graph: tables as nodes, one edge per pair of tables linked by a FK."""
    graph = nx.Graph()
    by_lower = {t.name.lower(): t.name for t in schema.tables}
    graph.add_nodes_from(t.name for t in schema.tables)
    for table in schema.tables:
        for fk in table.foreign_keys:
            ref = by_lower.get(fk.ref_table.lower())
            if ref is not None and ref != table.name:
                graph.add_edge(table.name, ref)
    return graph


def _connect(schema: Any, chosen: list[str], reasons: dict[str, str]) -> list[str]:
    """Add the tables needed to join the chosen ones (shortest FK paths, best table first)."""
    if len(chosen) < 2:
        return list(chosen)
    graph = fk_graph(schema)
    connected = [chosen[0]]
    for target in chosen[1:]:
        if target in connected:
            continue
        try:
            _, path = nx.multi_source_dijkstra(graph, set(connected), target)
        except nx.NetworkXNoPath:
            connected.append(target)
            continue
        for node in path:
            if node not in connected:
                if node not in chosen:
                    reasons[node] = "join"
                connected.append(node)
    return connected


def _columns_for(table: Any, scores: Mapping[str, float], join_only: bool, threshold: float,
                 min_columns: int, max_columns: int | None) -> list[str]:
    """Keys always; then named or value-matched columns; then the most descriptive ones."""
    fk_cols = {c.lower() for fk in table.foreign_keys for c in fk.columns}
    keys = [c.name for c in table.columns if c.primary_key or c.name.lower() in fk_cols]
    others = [c for c in table.columns if c.name not in keys]
    ranked = sorted(others, key=lambda c: (-scores.get(c.name, 0.0), _default_rank(c.name),
                                           _position(table, c.name)))
    keep = [c.name for c in ranked if scores.get(c.name, 0.0) >= threshold]
    if not join_only:
        for c in ranked:
            if len(keep) >= min_columns:
                break
            if c.name not in keep:
                keep.append(c.name)
    if max_columns is not None:
        keep = keep[:max_columns]
    chosen = set(keep) | set(keys)
    return [c.name for c in table.columns if c.name in chosen]


def _default_rank(name: str) -> int:
    parts = split_identifier(name)
    return 0 if any(p in _DESCRIPTIVE for p in parts) else 1


def _position(table: Any, name: str) -> int:
    return next(i for i, c in enumerate(table.columns) if c.name == name)
