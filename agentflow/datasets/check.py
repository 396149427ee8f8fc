"""Self-check of a benchmark: every gold query judged through the evaluator.

It proves, before any model is involved, that the loaders, the database layer (on SQLite or on
the DuckDB/PostgreSQL copies), the transpiler and the evaluator agree with the benchmark. On
SQLite each gold is judged against itself and every question should pass. On another engine
the gold's result there is judged against its result on the SQLite original (the benchmark's
answer): comparing the copy with itself could never show an answer that changed. Each failure
is a gold query that the other engine rejects or answers differently, and the report says
which and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from agentflow.accuracy import MatchRule, Verdict, evaluate_pair
from agentflow.accuracy.official import NotOneStatement, official_text
from agentflow.datasets.types import Dataset, EngineKind, Example


@dataclass(frozen=True)
class CheckRecord:
    example: Example
    verdict: Verdict
    difference: str | None = None  # the named dialect difference behind a failure

    def to_dict(self) -> dict:
        return {**self.example.to_dict(), **self.verdict.to_dict(),
                "dialect_difference": self.difference}


@dataclass
class CheckReport:
    engine: str
    rule: str
    keep_distinct: bool = False  # the official Spider evaluator's default strips DISTINCT
    records: list[CheckRecord] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(r.verdict.correct for r in self.records)

    @property
    def failed(self) -> int:
        return len(self.records) - self.passed

    def by_database(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for r in self.records:
            c = out.setdefault(r.example.db_id, Counter())
            c["passed" if r.verdict.correct else "failed"] += 1
        return out

    def failures(self) -> list[CheckRecord]:
        return [r for r in self.records if not r.verdict.correct]

    def differences(self) -> Counter:
        """Failures per named dialect difference (``unexplained`` for the rest)."""
        return Counter(r.difference or "unexplained" for r in self.failures())


# Known ways a SQLite gold query behaves differently on a strict engine. Each failure of the
# self-check on DuckDB/PostgreSQL is matched against these by its error or mismatch text; one
# that matches none is "unexplained" and worth a look.
DIALECT_DIFFERENCES: list[tuple[str, str]] = [
    ("GROUP BY strictness: a selected column is neither grouped nor aggregated "
     "(SQLite picks an arbitrary row)", r"must appear in the GROUP BY|must be part of an "
     r"aggregate|not in the GROUP BY|GROUP BY clause"),
    ("text compared with a number (SQLite compares across types)",
     r"operator does not exist: (text|bigint|double precision|integer) [=<>!]+ "
     r"(text|bigint|double precision|integer|unknown)|Cannot compare values|Conversion Error|"
     r"invalid input syntax for type"),
    ("function missing or typed differently (SQLite is lenient about argument types)",
     r"function .* does not exist|No function matches|Binder Error: No function"),
    ("ORDER BY on a column not in a SELECT DISTINCT list",
     r"for SELECT DISTINCT, ORDER BY expressions must appear"),
    ("double-quoted string literal read as an identifier (SQLite falls back to a string)",
     r'column "[^"]*" does not exist|Referenced column .* not found|unknown column'),
    ("set operation with mismatched column types", r"(UNION|INTERSECT|EXCEPT) types"),
    ("ambiguous column name (SQLite resolves it silently)", r"is ambiguous"),
    ("integer division and numeric precision differ",
     r"division by zero|numeric field overflow"),
    ("floating-point rounding: a float sum or average added up in another order",
     r"up to floating-point rounding"),
    ("result differs from SQLite's: ties under ORDER BY ... LIMIT, NULL ordering or collation",
     r"^(rows differ|result mismatch|different rows|mismatch)"),
]


def dialect_difference(verdict: Verdict) -> str | None:
    """The named dialect difference that explains a failed verdict, if one does."""
    import re

    text = f"{verdict.reason}: {verdict.detail}"
    for name, pattern in DIALECT_DIFFERENCES:
        if re.search(pattern, text, re.I):
            return name
    return None


def check_dataset(dataset: Dataset, *, engine: EngineKind = "sqlite",
                  rule: MatchRule = MatchRule.SPIDER, timeout_s: float = 30.0,
                  limit: int | None = None, duckdb_dir: Path | None = None,
                  pg_url: str | None = None,
                  on_database: Callable[[str, int], None] | None = None,
                  on_example: Callable[[CheckRecord], None] | None = None,
                  keep_distinct: bool = False) -> CheckReport:
    """Judge each gold query (see the module docstring); callbacks drive progress display."""
    report = CheckReport(engine=engine, rule=rule.value, keep_distinct=keep_distinct)
    for db_id, examples in _grouped(dataset.examples[:limit] if limit else dataset.examples):
        if on_database:
            on_database(db_id, len(examples))
        with dataset.open(db_id, engine=engine, duckdb_dir=duckdb_dir, pg_url=pg_url) as db:
            reference = dataset.open(db_id, engine="sqlite") if engine != "sqlite" else None
            try:
                for example in examples:
                    verdict = _judge(db, reference, example.gold_sql, rule=rule,
                                     timeout_s=timeout_s, keep_distinct=keep_distinct)
                    record = CheckRecord(example, verdict,
                                         dialect_difference(verdict) if not verdict.correct
                                         and engine != "sqlite" else None)
                    report.records.append(record)
                    if on_example:
                        on_example(record)
            finally:
                if reference is not None:
                    reference.close()
    return report


def _judge(db, reference, gold_sql: str, *, rule: MatchRule, timeout_s: float,
           keep_distinct: bool) -> Verdict:
    """The gold run on ``db`` against the gold's answer on ``reference`` (the SQLite original;
    None: ``db`` is that original, and the gold is judged against itself)."""
    gold_result = None
    if reference is not None:
        from agentflow.accuracy.execution import run_query
        from agentflow.sql import QueryResult

        try:
            text = official_text(gold_sql, keep_distinct=keep_distinct,
                                 bird=rule is MatchRule.BIRD)
        except NotOneStatement as err:
            return Verdict(False, "gold_error", f"gold query refused: {err}",
                           error_kind="syntax_error")
        run = run_query(reference, text, timeout_s=timeout_s)
        if not isinstance(run, QueryResult):
            return Verdict(False, "gold_error", f"gold query failed on SQLite: {run.detail}",
                           error_kind=run.kind)
        gold_result = run
    verdict = evaluate_pair(db, gold_sql, gold_sql, rule=rule, timeout_s=timeout_s,
                            gold_dialect="sqlite", pred_dialect="sqlite",
                            gold_result=gold_result, keep_distinct=keep_distinct)
    if reference is None:
        return verdict
    # Here the "prediction" is the gold itself on the other engine: its failure is the gold's.
    if verdict.reason in ("pred_error", "pred_rejected"):
        return replace(verdict, reason="gold_error")
    if verdict.reason == "pred_timeout":
        return replace(verdict, reason="gold_timeout")
    if verdict.reason == "mismatch":
        return replace(verdict, detail=f"answer differs from SQLite's: {verdict.detail}")
    return verdict


def _grouped(examples: list[Example]) -> Iterator[tuple[str, list[Example]]]:
    """Examples by database, databases in order of first appearance (one open per database)."""
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        groups.setdefault(ex.db_id, []).append(ex)
    yield from groups.items()
