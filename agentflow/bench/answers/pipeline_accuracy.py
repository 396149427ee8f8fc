"""Execution accuracy and cost of the pipelines on a seeded sample, side by side in one run.

    agentflow bench pipeline_accuracy --data ../shared/datasets/spider --n 30 --seed 0 \
        --pipelines single,chess,macsql --out artifacts/pipelines.jsonl

Every pipeline answers the same questions through the same AgentFlow (same model instance);
accuracy uses the Spider test-suite rule against the gold SQL. Prints a table of accuracy,
executable rate, mean/median latency, LLM calls and tokens per question, and calls per stage.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import agentflow
from agentflow.accuracy import MatchRule, evaluate_pair
from agentflow.accuracy.official import rules_note
from agentflow.config import AgentFlowConfig
from agentflow.datasets import load_dataset

# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--n", "3", "--pipelines", "single")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", default="demo", help="Spider/BIRD folder or 'demo'")
    p.add_argument("--split", default="dev")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pipelines", default="single,chess,macsql")
    p.add_argument("--config", default=None)
    p.add_argument("--out", type=Path, default=Path("artifacts/pipeline_accuracy.jsonl"))
    args = p.parse_args(argv)

    dataset = load_dataset(args.data, args.split)
    sample = random.Random(args.seed).sample(dataset.examples, min(args.n, len(dataset)))
    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    if args.data != "demo":
        config.data = [*config.data, args.data]
    names = [n.strip() for n in args.pipelines.split(",") if n.strip()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    console = Console()
    results: dict[str, list[dict]] = defaultdict(list)
    with agentflow.connect(config) as af, args.out.open("w") as sink, Progress(
            console=console) as progress:
        task = progress.add_task("questions", total=len(sample) * len(names))
        for example in sample:
            db = af.catalog.open(example.db_id)
            for name in names:
                answer = af.ask(example.question, db=example.db_id, pipeline=name,
                                evidence=example.evidence)
                verdict = evaluate_pair(db, answer.sql or "", example.gold_sql,
                                        rule=MatchRule.SPIDER)
                row = {"pipeline": name, "id": example.id, "db_id": example.db_id,
                       "question": example.question, "gold": example.gold_sql,
                       "pred": answer.sql, "status": answer.status, "error": answer.error,
                       "correct": verdict.correct, "reason": verdict.reason,
                       "executable": verdict.reason in ("match", "mismatch"),
                       "latency_s": answer.latency_s, "usage": answer.usage}
                results[name].append(row)
                sink.write(json.dumps(row, default=str) + "\n")
                sink.flush()
                progress.advance(task)
    console.print(summary_table(results, len(sample), args))
    console.print(f"accuracy judged by the {rules_note(False)}")
    console.print(stage_table(results))
    return 0


def summary_table(results: dict[str, list[dict]], n: int, args) -> Table:
    table = Table(title=f"{n} questions from {args.data} {args.split} (seed {args.seed})")
    for col in ("pipeline", "accuracy", "executable", "mean latency s", "median latency s",
                "LLM calls/q", "prompt tok/q", "output tok/q"):
        table.add_column(col, justify="right")
    for name, rows in results.items():
        lat = [r["latency_s"] for r in rows if r["latency_s"] is not None]
        table.add_row(
            name, f"{sum(r['correct'] for r in rows)}/{len(rows)}",
            f"{sum(r['executable'] for r in rows)}/{len(rows)}",
            f"{statistics.mean(lat):.1f}", f"{statistics.median(lat):.1f}",
            f"{statistics.mean(r['usage']['calls'] for r in rows):.1f}",
            f"{statistics.mean(r['usage']['prompt_tokens'] for r in rows):.0f}",
            f"{statistics.mean(r['usage']['completion_tokens'] for r in rows):.0f}")
    return table


def stage_table(results: dict[str, list[dict]]) -> Table:
    table = Table(title="per question, by stage: LLM calls / prompt tokens / output tokens")
    table.add_column("pipeline")
    table.add_column("stage")
    for col in ("calls/q", "prompt tok/q", "output tok/q"):
        table.add_column(col, justify="right")
    for name, rows in results.items():
        totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0])
        for r in rows:
            for stage, s in r["usage"]["by_stage"].items():
                t = totals[stage]
                t[0] += s["calls"]
                t[1] += s["prompt_tokens"]
                t[2] += s["completion_tokens"]
        for stage, (c, pt, ot) in sorted(totals.items()):
            table.add_row(name, stage, f"{c / len(rows):.2f}", f"{pt / len(rows):.0f}",
                          f"{ot / len(rows):.0f}")
    return table


if __name__ == "__main__":
    sys.exit(main())
