"""Execution accuracy: run the predicted and the gold SQL on one database and judge the pair.

Every outcome is a ``Verdict`` with a reason, so a report can say *why* a question was lost
(the prediction failed to run, ran too long, was refused, or returned other rows) and can keep
broken gold queries apart instead of blaming the prediction for them.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from agentflow.accuracy.compare import (
    MatchRule,
    describe_mismatch,
    gold_has_order_by,
    results_match,
)
from agentflow.accuracy.official import NotOneStatement, official_text
from agentflow.sql import (
    Database,
    QueryResult,
    QueryTimeoutError,
    RejectedStatementError,
    SqlError,
)

Reason = Literal["match", "mismatch", "pred_error", "pred_timeout", "pred_rejected",
                 "gold_error", "gold_timeout"]
REASONS: tuple[Reason, ...] = ("match", "mismatch", "pred_error", "pred_timeout",
                               "pred_rejected", "gold_error", "gold_timeout")

# Row cap for both queries. Large enough for any benchmark answer, small enough that a
# runaway cross join cannot exhaust memory before the timeout. A result that hits the cap is
# never compared as if complete (see ``evaluate_pair``).
DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Verdict:
    """The judgement of one (prediction, gold) pair; ``correct`` only when reason == "match"."""

    correct: bool
    reason: Reason
    detail: str = ""
    pred_rows: int | None = None
    gold_rows: int | None = None
    pred_s: float | None = None
    gold_s: float | None = None
    # The database layer's error kind ("syntax_error", "unknown_column", "timeout", ...) when a
    # query failed, or "truncated" when a result hit the row cap, so a report can break the
    # failures down without parsing ``detail``.
    error_kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_pair(db: Database, pred_sql: str, gold_sql: str, *,
                  rule: MatchRule | str = MatchRule.SPIDER,
                  timeout_s: float = DEFAULT_TIMEOUT_S,
                  gold_dialect: str | None = None, pred_dialect: str | None = None,
                  gold_result: QueryResult | None = None,
                  max_rows: int = DEFAULT_MAX_ROWS, keep_distinct: bool = False) -> Verdict:
    """Execute both queries on ``db`` and judge the prediction against the gold answer.

    Gold runs first: when it fails the prediction is not run at all (its verdict would mean
    nothing) and the reason is ``gold_error``/``gold_timeout``. Pass ``gold_result`` to reuse a
    gold result across several predictions (make it with ``max_rows=DEFAULT_MAX_ROWS``: a
    result truncated by a smaller cap is reported as gold_error). ``*_dialect`` is the
    dialect each query is written in when it differs from the database's (Spider gold is
    SQLite; run on DuckDB it is transpiled). A timeout is a wrong answer, as in both
    official evaluators.

    Both texts are first rewritten as the official Spider evaluator rewrites them
    (``agentflow.accuracy.official``): spaced operators joined and, by default as there,
    ``DISTINCT`` stripped; ``keep_distinct=True`` is its ``--keep_distinct``. The BIRD rule
    runs both verbatim, as BIRD's evaluator does. A given ``gold_result`` must come from the
    rewritten gold (``official_text``).
    """
    rule = MatchRule(rule)
    bird = rule is MatchRule.BIRD
    try:
        gold_sql = official_text(gold_sql, keep_distinct=keep_distinct,
                                 dialect=gold_dialect or db.dialect, bird=bird)
    except NotOneStatement as err:
        return Verdict(False, "gold_error", f"gold query refused: {err}",
                       error_kind="syntax_error")
    pred_refused: str | None = None
    try:
        pred_sql = official_text(pred_sql, keep_distinct=keep_distinct,
                                 dialect=pred_dialect or db.dialect, bird=bird)
    except NotOneStatement as err:
        pred_sql, pred_refused = "", str(err)
    if gold_result is None:
        gold_run = _run(db, gold_sql, timeout_s=timeout_s, max_rows=max_rows,
                        dialect=gold_dialect)
        if isinstance(gold_run, _Failure):
            reason: Reason = "gold_timeout" if gold_run.timeout else "gold_error"
            return Verdict(False, reason, f"gold query failed: {gold_run.detail}",
                           gold_s=gold_run.elapsed_s, error_kind=gold_run.kind)
        gold_result = gold_run
    gold_n = len(gold_result.rows)
    if gold_result.truncated:
        return Verdict(False, "gold_error",
                       f"gold result exceeds the {gold_n:,}-row cap; cannot compare",
                       gold_rows=gold_n, gold_s=gold_result.elapsed_s, error_kind="truncated")

    if pred_refused is not None:
        return Verdict(False, "pred_error", pred_refused, gold_rows=gold_n,
                       gold_s=gold_result.elapsed_s, error_kind="syntax_error")
    pred_run = _run(db, pred_sql, timeout_s=timeout_s, max_rows=max_rows, dialect=pred_dialect)
    if isinstance(pred_run, _Failure):
        reason = ("pred_timeout" if pred_run.timeout
                  else "pred_rejected" if pred_run.rejected else "pred_error")
        return Verdict(False, reason, pred_run.detail, gold_rows=gold_n,
                       pred_s=pred_run.elapsed_s, gold_s=gold_result.elapsed_s,
                       error_kind=pred_run.kind)
    pred_n = len(pred_run.rows)
    timing: dict[str, Any] = {"pred_rows": pred_n, "gold_rows": gold_n,
                              "pred_s": pred_run.elapsed_s, "gold_s": gold_result.elapsed_s}
    if pred_run.truncated:
        # Its true size is unknown, but more than the gold's (which fit under the same cap);
        # a complete comparison is impossible, so it is wrong, like a timeout.
        return Verdict(False, "mismatch",
                       f"prediction returned more than {pred_n:,} rows (cap reached) vs "
                       f"{gold_n} expected", error_kind="truncated", **timing)

    order_matters = (rule is MatchRule.SPIDER
                     and gold_has_order_by(gold_sql, gold_dialect or db.dialect))
    if results_match(pred_run.rows, gold_result.rows, rule=rule, order_matters=order_matters):
        return Verdict(True, "match", "", **timing)
    detail = describe_mismatch(pred_run.rows, gold_result.rows, rule=rule,
                               order_matters=order_matters)
    return Verdict(False, "mismatch", detail, **timing)


# ----------------------------------------------------------------------------- execution
def run_query(db: Database, sql: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
              max_rows: int = DEFAULT_MAX_ROWS,
              dialect: str | None = None) -> QueryResult | QueryFailure:
    """Execute one query as the judge does: a result, or the failure (never an exception)."""
    return _run(db, sql, timeout_s=timeout_s, max_rows=max_rows, dialect=dialect)


@dataclass(frozen=True)
class _Failure:
    detail: str
    elapsed_s: float
    kind: str
    timeout: bool = False
    rejected: bool = False


QueryFailure = _Failure


def _run(db: Database, sql: str, *, timeout_s: float, max_rows: int,
         dialect: str | None) -> QueryResult | _Failure:
    """Execute one query; every failure, even an unexpected driver one, becomes a ``_Failure``.

    A single odd query must not abort an evaluation over thousands of questions, so anything
    that is an ``Exception`` is caught and reported with its type.
    """
    start = time.monotonic()
    try:
        return db.execute(sql, timeout_s=timeout_s, max_rows=max_rows, dialect=dialect)
    except QueryTimeoutError as err:
        return _Failure(err.message, time.monotonic() - start, err.kind, timeout=True)
    except RejectedStatementError as err:
        return _Failure(err.message, time.monotonic() - start, err.kind, rejected=True)
    except SqlError as err:
        return _Failure(err.message, time.monotonic() - start, err.kind)
    except Exception as err:  # noqa: BLE001 - see docstring
        name = type(err).__name__
        return _Failure(f"{name}: {err}" if str(err) else name, time.monotonic() - start, name)
