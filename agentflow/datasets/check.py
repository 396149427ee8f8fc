"""Self-check of a benchmark: every gold query judged against itself through the evaluator.

It proves, before any model is involved, that the loaders, the database layer (on SQLite or on
the DuckDB copies), the transpiler and the evaluator agree with the benchmark: on SQLite every
question should pass; on DuckDB each failure is a gold query that SQLite accepts and DuckDB does
not, and the report says which and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agentflow.accuracy import MatchRule, Verdict, evaluate_pair
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
    ("result differs: case-sensitive LIKE, NULL ordering, or ties under ORDER BY/LIMIT",
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
                  on_example: Callable[[CheckRecord], None] | None = None) -> CheckReport:
    """Judge each gold query against itself; callbacks drive progress display."""
    report = CheckReport(engine=engine, rule=rule.value)
    for db_id, examples in _grouped(dataset.examples[:limit] if limit else dataset.examples):
        if on_database:
            on_database(db_id, len(examples))
        with dataset.open(db_id, engine=engine, duckdb_dir=duckdb_dir, pg_url=pg_url) as db:
            for example in examples:
                verdict = evaluate_pair(db, example.gold_sql, example.gold_sql, rule=rule,
                                        timeout_s=timeout_s, gold_dialect="sqlite",
                                        pred_dialect="sqlite")
                record = CheckRecord(example, verdict,
                                     dialect_difference(verdict) if not verdict.correct
                                     and engine != "sqlite" else None)
                report.records.append(record)
                if on_example:
                    on_example(record)
    return report


def _grouped(examples: list[Example]) -> Iterator[tuple[str, list[Example]]]:
    """Examples by database, databases in order of first appearance (one open per database)."""
    groups: dict[str, list[Example]] = {}
    for ex in examples:
        groups.setdefault(ex.db_id, []).append(ex)
    yield from groups.items()
