"""Per-question records: what was asked, what came back, whether it was right, what it cost.

One JSON object per line in ``records/<pipeline>__<policy>.jsonl``. A record is written as soon
as its question is judged, so an interrupted run loses nothing it finished; rerunning with the
same output folder skips every question whose record says it finished (``done`` or
``failed``). A question that was rejected or cancelled is asked again.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentflow.accuracy import MatchRule, evaluate_pair
from agentflow.datasets import Dataset, Example
from agentflow.datasets.types import EngineKind
from agentflow.evaluation.hardness import HardnessError, spider_hardness

FINISHED = ("done", "unsure", "failed")  # statuses a resumed run does not ask again


# ------------------------------------------------------------------------------ difficulty
def difficulty_of(example: Example, kind: str) -> tuple[str, str]:
    """(level, source): BIRD's and the demo's own labels; Spider's hardness from the gold SQL."""
    if example.difficulty and kind in ("bird", "demo"):
        return str(example.difficulty), f"{kind} label"
    try:
        return spider_hardness(example.gold_sql), "spider hardness"
    except HardnessError:
        return "unknown", "spider hardness"


def hardness_or_none(sql: str) -> str | None:
    try:
        return spider_hardness(sql)
    except HardnessError:
        return None


# ------------------------------------------------------------------------------ judging
class Judge:
    """Execution accuracy of predictions under both rules, on the dataset's databases."""

    def __init__(self, dataset: Dataset, *, engine: EngineKind = "sqlite",
                 timeout_s: float = 30.0, keep_distinct: bool = False):
        self.dataset = dataset
        # False is the official Spider evaluator's default (DISTINCT stripped from both).
        self.keep_distinct = keep_distinct
        self.engine = engine
        self.timeout_s = timeout_s
        self._dbs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _db(self, db_id: str):
        with self._lock:
            if db_id not in self._dbs:
                self._dbs[db_id] = self.dataset.open(db_id, engine=self.engine)
            return self._dbs[db_id]

    def judge(self, example: Example, pred_sql: str | None) -> dict[str, Any]:
        """Fields ``correct``/``reason``/``detail`` (Spider rule) and ``correct_bird``/
        ``reason_bird`` (BIRD rule). No SQL at all is reason ``no_sql``."""
        if not pred_sql or not pred_sql.strip():
            return {"correct": False, "reason": "no_sql", "detail": "the pipeline returned no SQL",
                    "correct_bird": False, "reason_bird": "no_sql"}
        try:
            db = self._db(example.db_id)
        except Exception as err:  # noqa: BLE001 - a missing database is judged, not fatal
            detail = f"cannot open database {example.db_id!r}: {err}"
            return {"correct": False, "reason": "gold_error", "detail": detail,
                    "correct_bird": False, "reason_bird": "gold_error"}
        gold_dialect = "sqlite" if db.dialect != "sqlite" else None
        spider = evaluate_pair(db, pred_sql, example.gold_sql, rule=MatchRule.SPIDER,
                               timeout_s=self.timeout_s, gold_dialect=gold_dialect,
                               keep_distinct=self.keep_distinct)
        if spider.reason in ("match", "mismatch"):
            bird = evaluate_pair(db, pred_sql, example.gold_sql, rule=MatchRule.BIRD,
                                 timeout_s=self.timeout_s, gold_dialect=gold_dialect)
        else:
            bird = spider  # the failure does not depend on the comparison rule
        return {"correct": spider.correct, "reason": spider.reason, "detail": spider.detail,
                "correct_bird": bird.correct, "reason_bird": bird.reason,
                "distinct": "kept" if self.keep_distinct else "stripped"}

    def close(self) -> None:
        with self._lock:
            for db in self._dbs.values():
                db.close()
            self._dbs.clear()


# ------------------------------------------------------------------------------ timing
def stage_rows(stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One compact row per DAG node that ran: its stage type, parents, times (seconds since
    the query arrived), queue wait and run time (of its LLM calls; a tool step's run time is
    its duration), and tokens."""
    rows = []
    for s in stages:
        if s.get("start") is None:
            continue
        calls = s.get("llm_calls") or []
        end = s["end"] if s.get("end") is not None else s["start"]
        llm = s["kind"] == "llm"
        rows.append({
            "node": s["node_id"], "stage": s["stage"], "kind": s["kind"],
            "parents": list(s.get("parents") or []), "status": s.get("status"),
            "start": s["start"], "end": end,
            # a tool step runs as soon as it is ready: all of it is run time
            "queue_s": sum(c.get("queue_s", 0.0) for c in calls) if llm else 0.0,
            "run_s": sum(c.get("run_s", 0.0) for c in calls) if llm else end - s["start"],
            "calls": len(calls),
            "prompt_tokens": sum(c.get("prompt_tokens", 0) for c in calls),
            "completion_tokens": sum(c.get("completion_tokens", 0) for c in calls)})
    return rows


def node_idle_s(row: dict[str, Any]) -> float:
    """A node's time without waiting: its duration less its LLM calls' queue waits."""
    return max(0.0, (row["end"] - row["start"]) - row.get("queue_s", 0.0))


def critical_path_s(rows: list[dict[str, Any]], weight=node_idle_s) -> float:
    """The longest path through the DAG, with node weights. A parent finishes before its
    child starts, so start order is a topological order; parents that never ran are ignored."""
    best: dict[str, float] = {}
    for row in sorted(rows, key=lambda r: (r["start"], r["end"])):
        best[row["node"]] = weight(row) + max(
            (best[p] for p in row["parents"] if p in best), default=0.0)
    return max(best.values(), default=0.0)


# ------------------------------------------------------------------------------ the store
class RecordStore:
    """The per-question JSONL of one run; the last line for an example id wins."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.records: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            with self.path.open() as fh:
                for line in fh:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # a line cut short by a crash: that question runs again
                    if isinstance(rec, dict) and "example_id" in rec:
                        self.records[str(rec["example_id"])] = rec

    def finished_ids(self) -> set[str]:
        return {k for k, r in self.records.items() if r.get("status") in FINISHED}

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as fh:
                fh.write(line + "\n")
            self.records[str(record["example_id"])] = record

    def for_examples(self, ids: list[str]) -> list[dict[str, Any]]:
        return [self.records[i] for i in ids if i in self.records]


def usage_fields(usage: dict[str, Any]) -> dict[str, Any]:
    by_stage: defaultdict[str, dict[str, Any]] = defaultdict(dict)
    for stage, u in (usage.get("by_stage") or {}).items():
        by_stage[stage] = dict(u)
    return {"calls": int(usage.get("calls", 0)),
            "prompt_tokens": int(usage.get("prompt_tokens", 0)),
            "completion_tokens": int(usage.get("completion_tokens", 0)),
            "usage_by_stage": dict(by_stage)}
