"""Does the confidence score carry information on data it was not tuned on? Fit, split, check.

The score in ``agentflow.confidence`` is a stated rule. Two questions decide whether it can be
trusted, and both need answers the rule was *not* looked at while it was written:

* ranking: does a right answer score higher than a wrong one (AUROC, with a bootstrap interval
  over resampled questions)? A logistic regression fitted on the same signals (the
  ``features`` every score records) on one split says whether a learned weighting would rank
  better on the other split than the rule does.
* the threshold: which ``min_confidence`` turns wrong answers into ``unsure`` rather than a
  green ``done``? It is chosen on the fit split (``choose_threshold``) and its cost is counted on
  the held-out split: wrong answers still ``done``, right answers held back.

Splits are by database (``split_by_database``): a held-out question never shares a schema with a
fitted one, as a user's own database would not. numpy only; the logistic fit is a few Newton
steps with an L2 penalty (a handful of right answers otherwise gives infinite weights).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The signals ``confidence.assess`` records (absent: 0). ``candidates`` is left out: it is the
# pipeline's setting, not an observation about the answer.
FEATURES: tuple[str, ...] = ("executed", "single", "share", "degenerate", "tests_missing",
                             "tests_passed_alone", "tests_failed", "repairs", "empty",
                             "all_null", "implausible", "truncated", "taught")


@dataclass(frozen=True)
class Judged:
    """One answered question: its rule score, recorded signals and whether it is right."""

    example_id: str
    db_id: str
    score: float
    correct: bool
    features: Mapping[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------------------ statistics
def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Mann-Whitney AUROC with ties counted half; None without both classes."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return None
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def bootstrap_auroc(scores: Sequence[float], labels: Sequence[bool], *, rounds: int = 2000,
                    seed: int = 0) -> tuple[float, float] | None:
    """A 95% percentile interval of the AUROC over resampled questions (None when fewer than
    half the resamples hold both right and wrong answers)."""
    rng = random.Random(seed)
    n = len(scores)
    values = []
    for _ in range(rounds):
        idx = [rng.randrange(n) for _ in range(n)]
        value = auroc([scores[i] for i in idx], [labels[i] for i in idx])
        if value is not None:
            values.append(value)
    if len(values) < rounds // 2:
        return None
    values.sort()
    return values[int(0.025 * len(values))], values[int(0.975 * len(values)) - 1]


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """A 95% Wilson interval of the proportion k/n (sensible for k near 0 or n, unlike the
    normal one)."""
    if n <= 0:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


# ------------------------------------------------------------------------------ splitting
def split_by_database(rows: Sequence[Judged], *, fit_share: float = 0.5,
                      seed: int = 0) -> tuple[list[Judged], list[Judged]]:
    """(fit, held-out): whole databases go to one side, chosen by a seeded hash of the name,
    so the split does not depend on which questions happen to be in ``rows``."""
    if not 0 < fit_share < 1:
        raise ValueError(f"fit_share must be between 0 and 1, got {fit_share!r}")

    def side(db: str) -> bool:
        digest = hashlib.sha256(f"{seed}:{db}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < fit_share

    fit = [r for r in rows if side(r.db_id)]
    held = [r for r in rows if not side(r.db_id)]
    return fit, held


# ------------------------------------------------------------------------------ the fit
@dataclass(frozen=True)
class Logistic:
    """P(right | signals) = sigmoid(intercept + weights . features)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    intercept: float
    l2: float

    def predict(self, features: Mapping[str, float]) -> float:
        z = self.intercept + sum(w * float(features.get(n, 0.0))
                                 for n, w in zip(self.names, self.weights, strict=True))
        return float(1.0 / (1.0 + np.exp(-z)))

    def to_dict(self) -> dict[str, Any]:
        return {"intercept": round(self.intercept, 4), "l2": self.l2,
                "weights": {n: round(w, 4) for n, w in zip(self.names, self.weights,
                                                           strict=True)}}


def design(rows: Sequence[Judged], names: Sequence[str] = FEATURES) -> np.ndarray:
    return np.array([[float(r.features.get(n, 0.0)) for n in names] for r in rows],
                    dtype=float).reshape(len(rows), len(names))


def fit_logistic(rows: Sequence[Judged], *, names: Sequence[str] = FEATURES, l2: float = 1.0,
                 steps: int = 50) -> Logistic:
    """L2-penalised logistic regression by Newton's method (the intercept is not penalised).
    Features constant over ``rows`` get weight 0: nothing in the fit split says anything
    about them."""
    if not rows:
        raise ValueError("nothing to fit: no judged answers")
    if l2 <= 0:
        raise ValueError(f"l2 must be positive (a few right answers separate), got {l2!r}")
    x_all = design(rows, names)
    y = np.array([1.0 if r.correct else 0.0 for r in rows])
    varying = [j for j in range(len(names)) if np.ptp(x_all[:, j]) > 0]
    x = np.hstack([np.ones((len(rows), 1)), x_all[:, varying]])
    beta = np.zeros(x.shape[1])
    penalty = np.full(x.shape[1], l2)
    penalty[0] = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(x @ beta)))
        grad = x.T @ (p - y) + penalty * beta
        hess = (x.T * (p * (1 - p))) @ x + np.diag(penalty) + 1e-9 * np.eye(x.shape[1])
        step = np.linalg.solve(hess, grad)
        beta -= step
        if float(np.max(np.abs(step))) < 1e-8:
            break
    weights = [0.0] * len(names)
    for k, j in enumerate(varying):
        weights[j] = float(beta[k + 1])
    return Logistic(tuple(names), tuple(weights), float(beta[0]), l2)


# ------------------------------------------------------------------------------ the threshold
def choose_threshold(scores: Sequence[float], labels: Sequence[bool], *,
                     precision: float = 0.5) -> float | None:
    """The lowest threshold at which the answers kept ``done`` (score >= threshold) are right
    at least ``precision`` of the time: green then means "more likely right than wrong" for the
    default 0.5. Where no threshold reaches that, the one whose done answers are right most
    often (the lowest of equals): the closest the score gets. Candidates are midpoints between
    observed scores, so a threshold never sits exactly on a score the fit split has. None when
    no answer is right (nothing to keep)."""
    values = sorted(set(float(s) for s in scores))
    best: tuple[float, float] | None = None  # (precision, threshold)
    for t in ((a + b) / 2 for a, b in zip(values, values[1:], strict=False)):
        kept = [y for s, y in zip(scores, labels, strict=True) if s >= t]
        if not kept or not any(kept):
            continue
        share = sum(kept) / len(kept)
        if share >= precision:
            return round(t, 3)
        if best is None or share > best[0]:
            best = (share, t)
    return None if best is None else round(best[1], 3)


def at_threshold(scores: Sequence[float], labels: Sequence[bool],
                 threshold: float | None) -> dict[str, int]:
    """What a threshold does: answers kept done (right/wrong) and held back (right/wrong)."""
    t = -1.0 if threshold is None else threshold
    out = {"done_right": 0, "done_wrong": 0, "unsure_right": 0, "unsure_wrong": 0}
    for s, y in zip(scores, labels, strict=True):
        key = ("done_" if s >= t else "unsure_") + ("right" if y else "wrong")
        out[key] += 1
    return out


def by_level(scores: Sequence[float], labels: Sequence[bool]) -> dict[str, Any]:
    """Accuracy per confidence level (the rule's cut points), with Wilson intervals."""
    from agentflow.confidence import LEVELS, level_of

    out: dict[str, Any] = {}
    for level in LEVELS:
        chosen = [y for s, y in zip(scores, labels, strict=True) if level_of(s) == level]
        out[level] = {"n": len(chosen), "correct": sum(chosen),
                      "accuracy": sum(chosen) / len(chosen) if chosen else None,
                      "accuracy_95": wilson(sum(chosen), len(chosen))}
    return out


def evaluate(rows: Sequence[Judged], scores: Sequence[float], threshold: float | None,
             *, levels: bool = False) -> dict[str, Any]:
    """AUROC (with its interval), accuracy and the threshold's effect on ``rows``; with
    ``levels``, accuracy per confidence level too (meaningful for the rule's score only)."""
    labels = [r.correct for r in rows]
    right = sum(labels)
    extra = {"by_level": by_level(scores, labels)} if levels else {}
    return {**extra, "n": len(rows), "correct": right, "databases": len({r.db_id for r in rows}),
            "accuracy": right / len(rows) if rows else None,
            "accuracy_95": wilson(right, len(rows)),
            "auroc": auroc(scores, labels),
            "auroc_95": bootstrap_auroc(scores, labels) if rows else None,
            "threshold": threshold, **at_threshold(scores, labels, threshold)}


def fit_and_check(rows: Sequence[Judged], *, fit_share: float = 0.5, seed: int = 0,
                  l2: float = 1.0, precision: float = 0.5) -> dict[str, Any]:
    """The whole measurement: split by database, fit the logistic on one side, choose the
    rule score's threshold there, and report both scores on the other side."""
    fit, held = split_by_database(rows, fit_share=fit_share, seed=seed)
    if not fit or not held:
        raise ValueError("the split left one side empty: too few databases")
    model = fit_logistic(fit, l2=l2)
    fit_rule = [r.score for r in fit]
    threshold = choose_threshold(fit_rule, [r.correct for r in fit], precision=precision)
    fitted_fit = [model.predict(r.features) for r in fit]
    fitted_threshold = choose_threshold(fitted_fit, [r.correct for r in fit],
                                        precision=precision)
    held_rule = [r.score for r in held]
    held_fitted = [model.predict(r.features) for r in held]
    return {"fit_share": fit_share, "seed": seed, "precision_target": precision,
            "model": model.to_dict(),
            "fit": {"rule": evaluate(fit, fit_rule, threshold, levels=True),
                    "fitted": evaluate(fit, fitted_fit, fitted_threshold)},
            "held_out": {"rule": evaluate(held, held_rule, threshold, levels=True),
                         "fitted": evaluate(held, held_fitted, fitted_threshold)}}


def fold_of(db_id: str, folds: int, seed: int = 0) -> int:
    digest = hashlib.sha256(f"{seed}:{db_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % folds


def cross_fit(rows: Sequence[Judged], *, folds: int = 2, seed: int = 0, l2: float = 1.0,
              precision: float = 0.5) -> dict[str, Any]:
    """Every question scored out of sample: databases go to ``folds`` groups; each group's
    fitted probabilities and both thresholds come from the other groups only. Pooled, this
    uses all the (few) right answers for the check while none is judged by a fit that saw
    it or its database."""
    if folds < 2:
        raise ValueError(f"folds must be at least 2, got {folds!r}")
    groups = [[r for r in rows if fold_of(r.db_id, folds, seed) == k] for k in range(folds)]
    if sum(1 for g in groups if g) < 2:
        raise ValueError("the folds left fewer than two groups: too few databases")
    held: list[Judged] = []
    fitted: list[float] = []
    rule_done: list[bool] = []
    fitted_done: list[bool] = []
    per_fold = []
    for k, group in enumerate(groups):
        train = [r for j, g in enumerate(groups) if j != k for r in g]
        if not group or not train:
            continue
        model = fit_logistic(train, l2=l2)
        labels = [r.correct for r in train]
        t_rule = choose_threshold([r.score for r in train], labels, precision=precision)
        t_fit = choose_threshold([model.predict(r.features) for r in train], labels,
                                 precision=precision)
        per_fold.append({"fold": k, "fitted_on": len(train), "held_out": len(group),
                         "rule_threshold": t_rule, "fitted_threshold": t_fit})
        for r in group:
            p = model.predict(r.features)
            held.append(r)
            fitted.append(p)
            rule_done.append(r.score >= (t_rule if t_rule is not None else -1.0))
            fitted_done.append(p >= (t_fit if t_fit is not None else -1.0))
    labels = [r.correct for r in held]

    def decided(done: list[bool]) -> dict[str, int]:
        return {"done_right": sum(d and y for d, y in zip(done, labels, strict=True)),
                "done_wrong": sum(d and not y for d, y in zip(done, labels, strict=True)),
                "unsure_right": sum(not d and y for d, y in zip(done, labels, strict=True)),
                "unsure_wrong": sum(not d and not y for d, y in zip(done, labels, strict=True))}

    rule_scores = [r.score for r in held]
    return {"folds": folds, "seed": seed, "precision_target": precision, "per_fold": per_fold,
            "n": len(held), "correct": sum(labels),
            "rule": {"auroc": auroc(rule_scores, labels),
                     "auroc_95": bootstrap_auroc(rule_scores, labels),
                     "by_level": by_level(rule_scores, labels), **decided(rule_done)},
            "fitted": {"auroc": auroc(fitted, labels),
                       "auroc_95": bootstrap_auroc(fitted, labels), **decided(fitted_done)}}
