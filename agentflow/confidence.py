"""How sure an answer is, from evidence the pipeline really gathered.

A small CPU model is wrong often, and a wrong answer that comes back as a green ``done`` is worse
than one that says "I am not sure". The score here is not a probability learned from data: it is
a transparent rule over signals each pipeline actually observes, so every point of it can be
explained to the user in one of its ``reasons``:

* agreement: independently sampled candidates that return the same rows are evidence; the
  share of all candidates in the chosen result cluster is the base of the score. A pipeline
  with one candidate cannot observe agreement at all and says so (its score is capped below
  ``high``).
* execution: SQL that never ran successfully is no answer (score 0); each error the pipeline
  had to repair before the SQL ran lowers the score a little.
* unit tests: the model's verdicts on the disagreeing clusters count only when the tests were
  really written; missing tests are reported as missing, never as passed.
* plausibility: an empty result, an all-NULL result, a "how many" question answered without
  counting (e.g. ``SELECT * FROM stores WHERE store_id = 1``), ``SELECT *`` for a question that
  asks for something specific (``agentflow.answer_shape``), or a result cut at the row cap are
  signs of a wrong query; candidates that agree only on ``SELECT *`` are no agreement.
* teaching: a result produced by the SQL taught for this question (or a measured paraphrase
  of it, ``agentflow.retrieval.paraphrase``) is the user's own answer.

Whether the score means anything is measured, not assumed:
``agentflow bench confidence_calibration`` reports accuracy per level and the AUROC of the
score against correctness on Spider dev.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Level = Literal["high", "medium", "low"]
LEVELS: tuple[Level, ...] = ("high", "medium", "low")

# Level boundaries on the score (inclusive lower bounds).
HIGH_AT = 0.75
MEDIUM_AT = 0.45
# The default min_confidence (``AgentFlowConfig.min_confidence``): a low answer comes back
# "unsure" (best guess attached), not a green "done". Chosen by measurement
# (``agentflow bench confidence_calibration --fit``, docs/accuracy.md): on Spider dev (chess,
# embedded model) the lowest threshold whose done answers are right at least half the time
# lies between the scores 0.383 and 0.667, where no answer scored; the medium cut is the one
# such value a user can read off the level. Lower it per call (0: every answer is done) or
# in the config (null: no threshold).
DEFAULT_MIN_CONFIDENCE = MEDIUM_AT

# With one candidate nothing cross-checks the SQL: the best such an answer can be is medium.
SINGLE_CANDIDATE_BASE = 0.6
EMPTY_FACTOR = 0.5
ALL_NULL_FACTOR = 0.6
IMPLAUSIBLE_FACTOR = 0.4
REPAIR_FACTOR = 0.9
TESTS_PASSED_BONUS = 0.1
TESTS_FAILED_FACTOR = 0.8
# The result was cut at the row cap: what the user sees is not all of it, and a query that
# returns that many rows rarely answers a question (most ask for a value or a short list).
TRUNCATED_FACTOR = 0.7
# Candidates that agree only because each wrote SELECT * agree on nothing the question asked.
DEGENERATE_AGREEMENT_BASE = 0.15
# A taught SQL for this question (exactly, or a measured paraphrase) produced the result: the
# user's own answer. Not fitted (no taught pairs in the calibration data): a stated rule.
TAUGHT_EXACT_SCORE = 0.9
TAUGHT_PARAPHRASE_SCORE = 0.8

_COUNT_QUESTION = re.compile(r"\b(how many|number of|count of|count the|total number)\b", re.I)
_GROUPED_QUESTION = re.compile(r"\b(each|every|per|for all|by)\b", re.I)


@dataclass(frozen=True)
class Signals:
    """What a pipeline observed about its answer. ``None`` means "not observable here"."""

    question: str
    sql: str | None
    executed: bool  # the final SQL ran without error
    rows: Sequence[Sequence[Any]] = ()
    columns: Sequence[str] = ()
    n_candidates: int = 1  # independent attempts at the SQL
    chosen_cluster: int | None = None  # candidates whose result equals the chosen one's
    n_clusters: int | None = None  # distinct results among executable candidates
    repairs: int = 0  # failed/empty executions that a revision round had to fix
    unit_tests: Sequence[str] | None = None  # None: none were needed; []: wanted, none written
    tests_passed: bool | None = None  # the chosen cluster's verdict (None: not evaluated)
    other_clusters_passed: int = 0  # rival clusters that passed the same tests
    truncated: bool = False
    dialect: str = "sqlite"
    # Members of the chosen cluster that are not degenerate (SELECT * for a specific
    # question); None: not counted (every member votes).
    votes: int | None = None
    # The chosen result came from a taught SQL: its question's similarity (1.0: the same).
    taught_similarity: float | None = None


@dataclass(frozen=True)
class Confidence:
    score: float
    level: Level
    reasons: list[str] = field(default_factory=list)
    # The observed signals as numbers (agreement share, empty, degenerate, ...): what the
    # calibration benchmark fits and analyses.
    features: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def level_of(score: float) -> Level:
    if score >= HIGH_AT:
        return "high"
    return "medium" if score >= MEDIUM_AT else "low"


def assess(s: Signals) -> Confidence:
    """The score, its level and one reason per signal that moved it."""
    reasons: list[str] = []
    features: dict[str, float] = {"executed": float(bool(s.sql and s.executed))}
    if not s.sql:
        return Confidence(0.0, "low", ["no SQL was written"], features)
    if not s.executed:
        return Confidence(0.0, "low", ["the SQL does not execute"], features)
    from agentflow.answer_shape import degenerate

    trivial = degenerate(s.question, s.sql, s.dialect)
    agreeing = s.chosen_cluster or 1
    votes = agreeing if s.votes is None else min(s.votes, agreeing)
    features.update(single=float(s.n_candidates <= 1), candidates=float(s.n_candidates),
                    share=(votes / s.n_candidates if s.n_candidates > 1 else 0.0),
                    degenerate=float(bool(trivial)))
    if s.n_candidates <= 1:
        score = SINGLE_CANDIDATE_BASE
        reasons.append("one candidate only: no second attempt to agree or disagree with it, "
                       "so this pipeline cannot tell a consistent answer from a lucky one")
    elif votes == 0:
        score = DEGENERATE_AGREEMENT_BASE
        reasons.append(f"{agreeing} of {s.n_candidates} candidates agree, but only on SELECT *: "
                       "identical trivial answers are not evidence")
    else:
        share = votes / s.n_candidates
        score = 0.1 + 0.85 * share
        if agreeing == s.n_candidates and votes == agreeing:
            reasons.append(f"all {s.n_candidates} candidates return the same result")
        else:
            clusters = (f" ({s.n_clusters} different results)" if (s.n_clusters or 0) > 1
                        else "; the others did not run")
            reasons.append(f"{votes} of {s.n_candidates} candidates agree{clusters}"
                           + (f"; {agreeing - votes} more only by SELECT *"
                              if votes < agreeing else ""))

    if s.unit_tests is not None:
        features["tests_missing"] = float(not s.unit_tests)
        if not s.unit_tests:
            reasons.append("the candidates disagree and the model wrote no usable unit test: "
                           "the choice was not checked")
        elif s.tests_passed is True and s.other_clusters_passed == 0:
            score += TESTS_PASSED_BONUS
            features["tests_passed_alone"] = 1.0
            reasons.append(f"only the chosen result passed the model's {len(s.unit_tests)} "
                           "unit test(s)")
        elif s.tests_passed is True:
            reasons.append(f"the chosen result passed the unit tests, but so did "
                           f"{s.other_clusters_passed} rival result(s)")
        elif s.tests_passed is False:
            score *= TESTS_FAILED_FACTOR
            features["tests_failed"] = 1.0
            reasons.append("no result passed the model's unit tests")

    if s.taught_similarity is not None:
        features["taught"] = s.taught_similarity
        exact = s.taught_similarity >= 1.0
        score = max(score, TAUGHT_EXACT_SCORE if exact else TAUGHT_PARAPHRASE_SCORE)
        reasons.append("the SQL taught for this question returns this result" if exact else
                       f"the SQL taught for a paraphrase of this question (similarity "
                       f"{s.taught_similarity:.2f}) returns this result")

    if s.repairs:
        features["repairs"] = float(s.repairs)
        score *= REPAIR_FACTOR ** s.repairs
        reasons.append(f"{s.repairs} failed or empty execution(s) had to be repaired first")

    if not s.rows:
        features["empty"] = 1.0
        score *= EMPTY_FACTOR
        reasons.append("the result is empty")
    elif all(v is None for row in s.rows for v in row):
        features["all_null"] = 1.0
        score *= ALL_NULL_FACTOR
        reasons.append("every value in the result is NULL")

    implausible = [why for why in (trivial, implausibility(s.question, s.sql, s.rows, s.dialect))
                   if why]
    if implausible:  # one factor however many ways the shape is wrong
        features["implausible"] = 1.0
        score *= IMPLAUSIBLE_FACTOR
        reasons.extend(implausible)
    if s.truncated:
        features["truncated"] = 1.0
        score *= TRUNCATED_FACTOR
        reasons.append("the result was cut at the row cap: it is not all there, and so many "
                       "rows rarely answer a question")

    score = round(min(1.0, max(0.0, score)), 3)
    return Confidence(score, level_of(score), reasons, features)


def implausibility(question: str, sql: str, rows: Sequence[Sequence[Any]],
                   dialect: str = "sqlite") -> str | None:
    """Why the result cannot be the answer to the question's form, or None.

    Only one form is checked, the one small models get wrong most visibly: a count question
    ("how many ...", "number of ...") must be answered by counting or summing; without a
    grouping word ("each", "per", ...) the answer is one row with a number in it."""
    if not _COUNT_QUESTION.search(question):
        return None
    if not _counts(sql, dialect):
        return "a 'how many' question answered without COUNT or SUM"
    if _GROUPED_QUESTION.search(question) or not rows:
        return None
    if len(rows) != 1:
        return f"a 'how many' question answered with {len(rows)} rows instead of one number"
    if not any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in rows[0]):
        return "a 'how many' question answered without a number"
    return None


def _counts(sql: str, dialect: str) -> bool:
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except Exception:  # sqlglot raises several error types; fall back to the text
        return bool(re.search(r"\b(count|sum)\s*\(", sql, re.I))
    return tree is not None and tree.find(exp.Count, exp.Sum) is not None


# ------------------------------------------------------------------------------ threshold
UNSURE = "unsure"


def unsure_message(confidence: dict[str, Any], threshold: float) -> str:
    """The error text of an answer held back as "not sure" (its SQL and rows stay attached)."""
    why = "; ".join(confidence.get("reasons") or []) or "no supporting evidence"
    return (f"not sure: confidence {confidence['score']:.2f} is below the threshold "
            f"{threshold:.2f} ({why}); the best guess is attached")


def below(confidence: dict[str, Any] | None, threshold: float | None) -> bool:
    """Whether an answer's confidence falls under ``threshold`` (None: no threshold)."""
    if threshold is None or confidence is None:
        return False
    return float(confidence["score"]) < threshold


def validate_threshold(value: float | None) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise ValueError(f"min_confidence must be a number between 0 and 1, got {value!r}")
    return float(value)
