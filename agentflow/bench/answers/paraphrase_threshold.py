"""Which similarity makes a taught question "the same question"? Precision/recall per threshold.

    agentflow bench paraphrase_threshold --data ../shared/datasets/spider

A taught SQL enters the pipeline as a candidate when the taught question's
``question_similarity`` to the asked one reaches ``PARAPHRASE_THRESHOLD``. This measures that
threshold without a model. For every question of a split, the "taught" pool is every *other*
question of its database; its best-scoring one is the match. A match is right when its gold
SQL is the asked question's gold SQL (case, quotes and spaces ignored) — Spider asks most
queries twice in different words, so those pairs are real paraphrases. Equivalent SQL written
differently counts as wrong, so precision here is a lower bound.

For each threshold it prints: accepted (matches at or above it), precision (right among the
accepted) and recall (accepted right matches among the questions that have a paraphrase).
Run it on train to choose, then on dev to check: no model, a few seconds.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

THRESHOLDS = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)


def sql_key(sql: str) -> str:
    text = sql.lower().replace('"', "'").replace("`", "'")
    text = re.sub(r"\s+", " ", text).strip().rstrip(";").strip()
    return re.sub(r"\s*([(),=<>])\s*", r"\1", text)


def measure(examples: list[Any], thresholds: tuple[float, ...] = THRESHOLDS) -> dict[str, Any]:
    from agentflow.retrieval.paraphrase import normalise, question_similarity

    by_db: dict[str, list[Any]] = defaultdict(list)
    for e in examples:
        by_db[e.db_id].append(e)
    matches = []  # (best similarity, right?, has a paraphrase?)
    for items in by_db.values():
        keys = [sql_key(e.gold_sql) for e in items]
        for i, asked in enumerate(items):
            others = [j for j in range(len(items)) if j != i
                      and normalise(items[j].question) != normalise(asked.question)]
            has_para = any(keys[j] == keys[i] for j in others)
            best, best_j = -1.0, None
            for j in others:
                s = question_similarity(asked.question, items[j].question)
                if s > best:
                    best, best_j = s, j
            right = best_j is not None and keys[best_j] == keys[i]
            matches.append((best, right, has_para))
    n_para = sum(1 for _, _, p in matches if p)
    rows = []
    for t in thresholds:
        accepted = [m for m in matches if m[0] >= t]
        right = sum(1 for m in accepted if m[1])
        rows.append({"threshold": t, "accepted": len(accepted),
                     "precision": right / len(accepted) if accepted else None,
                     "recall": right / n_para if n_para else None})
    return {"questions": len(matches), "with_paraphrase": n_para, "rows": rows}


QUICK_ARGS: tuple[str, ...] = ("--splits", "dev")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path("../shared/datasets/spider"))
    p.add_argument("--splits", default="train,dev")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    from agentflow.datasets import load_dataset
    from agentflow.retrieval.paraphrase import PARAPHRASE_THRESHOLD

    if not args.data.exists():
        print(f"no dataset at {args.data}")
        return 1
    out = {}
    for split in args.splits.split(","):
        result = measure(load_dataset(args.data, split).examples)
        out[split] = result
        print(f"{split}: {result['questions']} questions, {result['with_paraphrase']} with a "
              f"paraphrase (same gold SQL) on their database")
        print(f"{'threshold':>10}{'accepted':>10}{'precision':>11}{'recall':>8}")
        for r in result["rows"]:
            mark = "  <- PARAPHRASE_THRESHOLD" if r["threshold"] == PARAPHRASE_THRESHOLD else ""
            prec = "-" if r["precision"] is None else f"{r['precision']:.3f}"
            rec = "-" if r["recall"] is None else f"{r['recall']:.3f}"
            print(f"{r['threshold']:>10.2f}{r['accepted']:>10}{prec:>11}{rec:>8}{mark}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
