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

from agentflow.datasets.types import Dataset, EngineKind, Example
from agentflow.eval import MatchRule, Verdict, evaluate_pair


@dataclass(frozen=True)
class CheckRecord:
    example: Example
    verdict: Verdict

    def to_dict(self) -> dict:
        return {**self.example.to_dict(), **self.verdict.to_dict()}


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


def check_dataset(dataset: Dataset, *, engine: EngineKind = "sqlite",
                  rule: MatchRule = MatchRule.SPIDER, timeout_s: float = 30.0,
                  limit: int | None = None, duckdb_dir: Path | None = None,
                  on_database: Callable[[str, int], None] | None = None,
                  on_example: Callable[[CheckRecord], None] | None = None) -> CheckReport:
    """Judge each gold query against itself; callbacks drive progress display."""
    report = CheckReport(engine=engine, rule=rule.value)
    for db_id, examples in _grouped(dataset.examples[:limit] if limit else dataset.examples):
        if on_database:
            on_database(db_id, len(examples))
        with dataset.open(db_id, engine=engine, duckdb_dir=duckdb_dir) as db:
            for example in examples:
                verdict = evaluate_pair(db, example.gold_sql, example.gold_sql, rule=rule,
                                        timeout_s=timeout_s, gold_dialect="sqlite",
                                        pred_dialect="sqlite")
                record = CheckRecord(example, verdict)
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
