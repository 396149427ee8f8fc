"""Is this the question a user already taught? Similarity of two questions *as asked*.

Few-shot retrieval (``fewshot.py``) masks values and schema words on purpose: it looks for
questions of the same *shape*. Deciding that a taught SQL answers the asked question needs the
opposite: the same words, and exactly the same values. "How many singers are older than 30?"
and "How many singers are older than 40?" have the same shape and different answers.

``question_similarity`` is the Dice overlap of the two questions' content stems (only words
without meaning for the SQL dropped, light stemming), averaged with the same overlap of
adjacent stem pairs, and 0 whenever the literal values differ (numbers and quoted strings must
be the same sets). ``PARAPHRASE_THRESHOLD`` is measured, not guessed:
``agentflow bench paraphrase_threshold`` takes every question of a Spider split, finds the
best-scoring other question of its database, and counts the match right when both have the same
gold SQL (Spider asks most queries twice in other words); it prints precision and recall per
threshold on train and on dev.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentflow.retrieval.text import fold, stem, words

# Measured on Spider train (see the module docstring): the lowest threshold whose top-1 match
# has a gold SQL identical to the asked question's in >= 95% of the cases it accepts.
PARAPHRASE_THRESHOLD = 0.85

_QUOTED = re.compile(r"\"([^\"]*)\"|“([^”]*)”|‘([^’]*)’|(?<![\w])'([^']*)'(?![\w])")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:[.,:/-]\d+)*%?")
# Only words that carry no meaning for the SQL are dropped: articles, auxiliaries, pronouns
# and the verbs of asking ("show", "list", "what are"). Words that change the query stay,
# unlike in retrieval's stop list: "not", "no", "without", "most", "each", "both", "or",
# "number", "average" (measured: dropping them matched "names of stadiums without concerts"
# to "number of concerts in each stadium").
_DROPPED = frozenset("""
a an the of is are was were be been being what which who whom whose do does did that this these
those there their its it they them please me us you your give show list find return tell display
all to for in on as by from with
""".split())
_SYNONYMS = {"how": "number", "many": "number", "count": "number", "names": "name"}


@dataclass(frozen=True)
class Match:
    """A taught question close enough to the asked one, and how close (0..1)."""

    question: str
    sql: str
    similarity: float
    exact: bool


def normalise(question: str) -> str:
    """The exact-match key: folded words joined by single spaces (punctuation ignored)."""
    return " ".join(words(question))


def literal_values(question: str) -> frozenset[str]:
    """Numbers and quoted strings of a question, folded: they must match exactly."""
    quoted = {fold(next(g for g in m.groups() if g is not None)).strip()
              for m in _QUOTED.finditer(question)}
    numbers = {n.rstrip("%").replace(",", "") for n in _NUMBER.findall(question)}
    return frozenset(quoted | numbers)


def content_stems(question: str) -> list[str]:
    """The question's meaningful words in order, stemmed, values removed."""
    text = _QUOTED.sub(" ", question)
    text = _NUMBER.sub(" ", text)
    return [_SYNONYMS.get(w, stem(w)) for w in words(text) if w not in _DROPPED and len(w) > 1]


def _dice(a: frozenset[str], b: frozenset[str]) -> float:
    return 2 * len(a & b) / (len(a) + len(b)) if a or b else 1.0


def question_similarity(asked: str, taught: str) -> float:
    """1.0 for the same question (ignoring case and punctuation), 0.0 when a value differs,
    otherwise the mean Dice overlap of content stems and of adjacent stem pairs."""
    if normalise(asked) == normalise(taught):
        return 1.0
    if literal_values(asked) != literal_values(taught):
        return 0.0
    a, b = content_stems(asked), content_stems(taught)
    if not a or not b:
        return 0.0
    # Words alone miss who does what ("singers per concert" vs "concerts per singer"): the
    # overlap of adjacent word pairs counts as much as the overlap of words.
    words_overlap = _dice(frozenset(a), frozenset(b))
    pairs_overlap = _dice(frozenset(zip(a, a[1:])), frozenset(zip(b, b[1:])))  # type: ignore[arg-type]
    # 1.0 is kept for the same question: other words with the same stems are a paraphrase.
    return min(0.99, round((words_overlap + pairs_overlap) / 2, 4))


def best_match(asked: str, taught: list[tuple[str, str]],
               threshold: float = PARAPHRASE_THRESHOLD) -> Match | None:
    """The taught (question, sql) pair most similar to ``asked`` at or above ``threshold``;
    ties go to the earlier pair."""
    best: Match | None = None
    for question, sql in taught:
        score = question_similarity(asked, question)
        if score >= threshold and (best is None or score > best.similarity):
            best = Match(question, sql, score, exact=score >= 1.0)
    return best


__all__ = ["Match", "PARAPHRASE_THRESHOLD", "best_match", "content_stems", "literal_values",
           "normalise", "question_similarity"]
