"""bench taught_paraphrases: the pair sample, the resumable partial file and the table."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from agentflow.bench.answers.taught_paraphrases import paraphrase_pairs, read_partial, table


def ex(db: str, q: str, sql: str) -> SimpleNamespace:
    return SimpleNamespace(db_id=db, question=q, gold_sql=sql)


def test_pairs_share_database_and_gold_and_differ_in_words() -> None:
    examples = [ex("a", "How many singers are there?", "SELECT count(*) FROM singer"),
                ex("a", "What is the total number of singers?", "SELECT count(*) FROM singer"),
                ex("a", "How many singers are there ?", "SELECT count(*) FROM singer"),
                ex("b", "How many singers are there?", "SELECT count(*) FROM singer"),
                ex("a", "List the names.", "SELECT name FROM singer")]
    pairs = paraphrase_pairs(examples, 10, seed=0)
    assert len(pairs) == 1
    taught, asked = pairs[0]
    assert taught.db_id == asked.db_id == "a" and taught.question != asked.question


def row(q: str, untaught: bool, taught: bool, exact: bool | None, candidate: bool) -> dict:
    r = {"db": "a", "asked_question": q, "pipeline": "single", "candidate": candidate,
         "untaught": {"correct": untaught}, "taught": {"correct": taught}}
    if exact is not None:
        r["taught_exact"] = {"correct": exact}
    return r


def test_partial_file_survives_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row("q1", False, True, None, True)) + "\n" + '{"db": "a", "ask')
    rows = read_partial(path)
    assert [r["asked_question"] for r in rows] == ["q1"]
    assert read_partial(tmp_path / "absent.jsonl") == []


def test_table_splits_by_threshold_and_shows_the_exact_condition_when_run() -> None:
    results = [row("q1", False, True, True, True), row("q2", False, False, True, False),
               row("q3", True, True, True, False)]
    text = table(results, 0.85)
    assert "| all | 3 | 33% (1) | 67% (2) | 100% (3) |" in text
    assert "| similarity >= 0.85 (taught SQL is a candidate) | 1 | 0% (0) | 100% (1) | 100% (1) |" \
        in text
    plain = table([row("q1", False, True, None, True)], 0.85)
    assert "exact" not in plain and "| all | 1 | 0% (0) | 100% (1) |" in plain
