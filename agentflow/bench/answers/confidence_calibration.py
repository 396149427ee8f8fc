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
import sys
from pathlib import Path
from typing import Any

from agentflow.confidence_fit import auroc, bootstrap_auroc

__all__ = ["auroc", "bootstrap_auroc", "judged_rows", "main", "summarize"]

LEVELS = ("high", "medium", "low")


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
    stars = sum(bool(r.get("star")) for r in rows)
    return {"n": len(rows), "correct": sum(labels), "select_star": stars,
            "accuracy": sum(labels) / len(rows) if rows else None,
            "by_level": by_level, "split": split, "auroc": auroc(scores, labels),
            "auroc_95": bootstrap_auroc(scores, labels) if rows else None}


def judged_rows(out: Path, data: Path | None, pipeline: str | None,
                keep_distinct: bool) -> list[dict[str, Any]]:
    """One row per finished question: its confidence and whether it is right today."""
    from agentflow.accuracy import MatchRule, evaluate_pair
    from agentflow.answer_shape import star_projection
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
            pred = rec.get("pred_sql") or ""
            correct = False
            if rec.get("pred_sql"):
                db_id = rec["db_id"]
                if db_id not in dbs:
                    dbs[db_id] = dataset.open(db_id)
                verdict = evaluate_pair(dbs[db_id], rec["pred_sql"], rec["gold_sql"],
                                        rule=MatchRule.SPIDER, keep_distinct=keep_distinct)
                correct = verdict.correct
            rows.append({"example_id": rec["example_id"], "db_id": rec["db_id"],
                         "score": float(conf["score"]), "features": conf.get("features") or {},
                         "star": bool(pred) and star_projection(pred),
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
    print(f"SELECT * predictions: {summary['select_star']} of {summary['n']}")
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
    p.add_argument("--fit", action="store_true",
                   help="split by database: fit a logistic on one side, choose min_confidence "
                        "there, and report both on the held-out side (agentflow.confidence_fit)")
    p.add_argument("--fit-share", type=float, default=0.5, help="share of databases fitted on")
    p.add_argument("--split-seed", type=int, default=0, help="which databases are fitted on")
    p.add_argument("--folds", type=int, default=2,
                   help="with --fit, also score every question out of sample over this many "
                        "database folds")
    p.add_argument("--l2", type=float, default=1.0, help="the logistic fit's L2 penalty")
    p.add_argument("--precision", type=float, default=0.5,
                   help="min_confidence is the lowest threshold whose done answers are right "
                        "at least this often on the fit side")
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
    checked = None
    if args.fit:
        from agentflow.confidence_fit import (
            Judged,
            at_threshold,
            choose_threshold,
            cross_fit,
            fit_and_check,
        )

        judged = [Judged(r["example_id"], r["db_id"], r["score"], bool(r["correct"]),
                         r["features"]) for r in rows]
        try:
            checked = fit_and_check(judged, fit_share=args.fit_share, seed=args.split_seed,
                                    l2=args.l2, precision=args.precision)
            checked["cross"] = cross_fit(judged, folds=args.folds, seed=args.split_seed,
                                         l2=args.l2, precision=args.precision)
        except ValueError as err:
            print(f"no fit: {err}", file=sys.stderr)
            return 1
        scores = [j.score for j in judged]
        labels = [j.correct for j in judged]
        chosen = choose_threshold(scores, labels, precision=args.precision)
        checked["all"] = {"threshold": chosen, **at_threshold(scores, labels, chosen)}
        print(fit_report(checked))
    if args.json:
        args.json.write_text(json.dumps({"rule": rule, **summary, "fit": checked,
                                         "rows": rows}, indent=1))
    return 0


def fit_report(checked: dict[str, Any]) -> str:
    """The fit/held-out comparison as markdown tables."""
    def interval(ci: Any) -> str:
        return f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else ""

    def num(x: float | None, fmt: str = ".3f") -> str:
        return "-" if x is None else format(x, fmt)

    lines = [f"split by database (fit share {checked['fit_share']}, seed {checked['seed']}); "
             f"min_confidence = lowest threshold with done answers right >= "
             f"{checked['precision_target']:.0%} on the fit side",
             "| side | score | questions (dbs) | right | AUROC (95% bootstrap) | threshold | "
             "done right | done wrong | unsure right | unsure wrong |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for side in ("fit", "held_out"):
        for score in ("rule", "fitted"):
            e = checked[side][score]
            lines.append(f"| {side} | {score} | {e['n']} ({e['databases']}) | {e['correct']} | "
                         f"{num(e['auroc'])}{interval(e['auroc_95'])} | {num(e['threshold'])} | "
                         f"{e['done_right']} | {e['done_wrong']} | {e['unsure_right']} | "
                         f"{e['unsure_wrong']} |")
    def by_level(title: str, rows: dict[str, Any]) -> list[str]:
        out = ["", f"{title} accuracy per level (rule score; 95% Wilson interval)",
               "| level | n | right | accuracy |", "|---|---|---|---|"]
        for level, row in rows.items():
            acc = "-" if row["accuracy"] is None else (f"{row['accuracy']:.0%}"
                                                       f"{interval(row['accuracy_95'])}")
            out.append(f"| {level} | {row['n']} | {row['correct']} | {acc} |")
        return out

    lines += by_level("held-out", checked["held_out"]["rule"]["by_level"])
    cross = checked.get("cross")
    if cross:
        lines += ["", f"out of sample over {cross['folds']} database folds ({cross['n']} "
                  f"questions, {cross['correct']} right; thresholds from the other folds: "
                  + ", ".join(f"{f['rule_threshold']}" for f in cross["per_fold"]) + ")",
                  "| score | AUROC (95% bootstrap) | done right | done wrong | unsure right | "
                  "unsure wrong |", "|---|---|---|---|---|---|"]
        for score in ("rule", "fitted"):
            e = cross[score]
            lines.append(f"| {score} | {num(e['auroc'])}{interval(e['auroc_95'])} | "
                         f"{e['done_right']} | {e['done_wrong']} | {e['unsure_right']} | "
                         f"{e['unsure_wrong']} |")
        lines += by_level("out-of-sample", cross["rule"]["by_level"])
    every = checked.get("all")
    if every:
        lines += ["", f"min_confidence chosen on all questions: {num(every['threshold'])} "
                  f"(done: {every['done_right']} right, {every['done_wrong']} wrong; unsure: "
                  f"{every['unsure_right']} right, {every['unsure_wrong']} wrong)"]
    weights = checked["model"]["weights"]
    lines += ["", "fitted weights (logistic, L2 " + str(checked["model"]["l2"]) + "): intercept "
              + f"{checked['model']['intercept']:+.2f}, "
              + ", ".join(f"{k} {v:+.2f}" for k, v in weights.items() if v)]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
