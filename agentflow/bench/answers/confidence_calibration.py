"""Does the confidence score mean anything? Accuracy per confidence level, and the AUROC of the
score against correctness, on real answers from the eval harness.

    agentflow bench confidence_calibration --data ../shared/datasets/spider --limit 60 \\
        --out runs/calibration            # asks the questions (resumable), then reports
    agentflow bench confidence_calibration --out runs/calibration --analyze-only

The questions run through ``agentflow.evaluation`` (real mode, the configured or embedded
model), which writes one record per question with the answer's ``confidence``. The report
re-judges every prediction against its gold with the current evaluator (official Spider rule;
``--keep-distinct`` for the other variant), so records written by an older build are scored by
today's rules. Partial runs are analysed as they are: the count of questions is printed.

AUROC is the probability that a correct answer scores higher than a wrong one (ties count
half): 0.5 is no information. With few correct answers its interval is wide; the bootstrap
interval printed next to it says how wide.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LEVELS = ("high", "medium", "low")


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float | None:
    """Mann-Whitney AUROC with ties counted half; None without both classes."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = 0.0
    for p in pos:
        for n in neg:
            wins += 1.0 if p > n else 0.5 if p == n else 0.0
    return wins / (len(pos) * len(neg))


def bootstrap_auroc(scores: Sequence[float], labels: Sequence[bool], *, rounds: int = 2000,
                    seed: int = 0) -> tuple[float, float] | None:
    """A 95% percentile interval of the AUROC over resampled questions."""
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


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """rows: {"score", "level", "correct"} per question."""
    scores = [r["score"] for r in rows]
    labels = [bool(r["correct"]) for r in rows]
    by_level = {}
    for level in LEVELS:
        chosen = [r for r in rows if r["level"] == level]
        by_level[level] = {"n": len(chosen),
                           "accuracy": (sum(r["correct"] for r in chosen) / len(chosen)
                                        if chosen else None)}
    split = {}
    for level, at in (("high", ("high",)), ("medium", ("high", "medium"))):
        above = [r for r in rows if r["level"] in at]
        under = [r for r in rows if r["level"] not in at]
        split[f"at least {level}"] = {
            "n_above": len(above), "n_below": len(under),
            "accuracy_above": sum(r["correct"] for r in above) / len(above) if above else None,
            "accuracy_below": sum(r["correct"] for r in under) / len(under) if under else None}
    return {"n": len(rows), "correct": sum(labels),
            "accuracy": sum(labels) / len(rows) if rows else None,
            "by_level": by_level, "split": split, "auroc": auroc(scores, labels),
            "auroc_95": bootstrap_auroc(scores, labels) if rows else None}


def judged_rows(out: Path, data: Path | None, pipeline: str | None,
                keep_distinct: bool) -> list[dict[str, Any]]:
    """One row per finished question: its confidence and whether it is right today."""
    from agentflow.accuracy import MatchRule, evaluate_pair
    from agentflow.datasets import load_dataset

    meta = json.loads((out / "eval.json").read_text()) if (out / "eval.json").exists() else {}
    root = Path(data) if data else Path(meta.get("dataset", {}).get("root", ""))
    split = meta.get("dataset", {}).get("split", "dev")
    dataset = load_dataset(root, split)
    dbs: dict[str, Any] = {}
    rows = []
    for path in sorted((out / "records").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if pipeline and rec.get("pipeline") != pipeline:
                continue
            if rec.get("status") not in ("done", "failed", "unsure"):
                continue
            conf = rec.get("confidence") or {"score": 0.0, "level": "low", "reasons": []}
            correct = False
            if rec.get("pred_sql"):
                db_id = rec["db_id"]
                if db_id not in dbs:
                    dbs[db_id] = dataset.open(db_id)
                verdict = evaluate_pair(dbs[db_id], rec["pred_sql"], rec["gold_sql"],
                                        rule=MatchRule.SPIDER, keep_distinct=keep_distinct)
                correct = verdict.correct
            rows.append({"example_id": rec["example_id"], "score": float(conf["score"]),
                         "level": conf["level"], "correct": correct,
                         "recorded_correct": rec.get("correct"), "status": rec["status"],
                         "reasons": conf.get("reasons", [])})
    for db in dbs.values():
        db.close()
    return rows


def print_report(summary: dict[str, Any], *, label: str) -> None:
    def pct(x: float | None) -> str:
        return "  -  " if x is None else f"{100 * x:5.1f}%"

    print(f"confidence calibration: {label}")
    print(f"questions {summary['n']}, correct {summary['correct']} "
          f"({pct(summary['accuracy'])})")
    print(f"{'level':<8}{'n':>5}{'accuracy':>10}")
    for level in LEVELS:
        row = summary["by_level"][level]
        print(f"{level:<8}{row['n']:>5}{pct(row['accuracy']):>10}")
    for name, row in summary["split"].items():
        print(f"{name:<16} above: {row['n_above']:>3} at {pct(row['accuracy_above'])}   "
              f"below: {row['n_below']:>3} at {pct(row['accuracy_below'])}")
    a, ci = summary["auroc"], summary["auroc_95"]
    interval = f" (95% bootstrap {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
    print("AUROC of score vs correct: " + ("n/a (needs right and wrong answers)" if a is None
                                           else f"{a:.3f}{interval}"))


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--limit", "6")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=None, help="Spider folder (official layout)")
    p.add_argument("--split", default="dev")
    p.add_argument("--limit", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pipeline", default="chess")
    p.add_argument("--config", default=None, help="agentflow config (default: embedded model)")
    p.add_argument("--out", type=Path, required=True, help="eval folder (records; resumable)")
    p.add_argument("--analyze-only", action="store_true", help="report on existing records")
    p.add_argument("--keep-distinct", action="store_true",
                   help="judge with DISTINCT kept (the official evaluator's --keep_distinct)")
    p.add_argument("--json", type=Path, default=None, help="also write the summary here")
    args = p.parse_args(argv)
    if not args.analyze_only:
        if args.data is None:
            p.error("--data is required unless --analyze-only")
        from agentflow.evaluation import run_eval

        run_eval(f"spider:{args.data}:{args.split}", out=args.out, pipelines=args.pipeline,
                 limit=args.limit, seed=args.seed, config=args.config, plots=False)
    rows = judged_rows(args.out, args.data, args.pipeline, args.keep_distinct)
    if not rows:
        print(f"no finished records under {args.out}/records", file=sys.stderr)
        return 1
    summary = summarize(rows)
    rule = "spider rule, " + ("DISTINCT kept (--keep_distinct)" if args.keep_distinct
                              else "DISTINCT stripped (official default)")
    print_report(summary, label=f"{args.pipeline} on {args.split}, {rule}")
    if args.json:
        args.json.write_text(json.dumps({"rule": rule, **summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
