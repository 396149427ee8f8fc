"""Is taught SQL used? EX on questions whose paraphrase was taught, against the same untaught.

    nice -n 10 agentflow bench taught_paraphrases --data ../shared/datasets/spider --pairs 30 \\
        --pipeline single --out artifacts/taught_paraphrases.json

Spider asks most queries twice in other words: two questions of one database with the same
gold SQL. For each of ``--pairs`` such pairs (a seeded sample, one per gold SQL) the second
question is asked through one AgentFlow (one model, temperature 0) twice: first with nothing
taught, then after teaching the *first* question with its gold SQL through ``af.teach`` (the
path a user takes). With teaching, the pair reaches the prompt as an example and, when the two
questions' similarity reaches ``PARAPHRASE_THRESHOLD``, its SQL runs as a candidate. The table
shows EX for both conditions, split by whether the pair crossed the threshold, so the share of
the gain that comes from the candidate (not the prompt) is visible. Accuracy is the Spider
rule against the gold SQL. ``--exact`` adds a third condition: the asked question itself taught
(with its own gold SQL), the path of a user who corrects an answer and asks again.

Each pair's result is appended to ``<out>.jsonl`` as it finishes; a rerun with the same
arguments skips the pairs already there (a model run is long), and the table covers them all.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any


def paraphrase_pairs(examples: list[Any], n: int, seed: int) -> list[tuple[Any, Any]]:
    """``n`` (taught, asked) pairs with the same database and gold SQL, different words."""
    from agentflow.bench.answers.paraphrase_threshold import sql_key
    from agentflow.retrieval.paraphrase import normalise

    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for e in examples:
        groups[(e.db_id, sql_key(e.gold_sql))].append(e)
    pairs = []
    for key in sorted(groups):
        members = groups[key]
        distinct = {normalise(e.question): e for e in members}
        if len(distinct) >= 2:
            first, second = list(distinct.values())[:2]
            pairs.append((first, second))
    random.Random(seed).shuffle(pairs)
    return pairs[:n]


QUICK_ARGS: tuple[str, ...] = ("--pairs", "2")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("../shared/datasets/spider"))
    p.add_argument("--split", default="dev")
    p.add_argument("--pairs", type=int, default=30)
    p.add_argument("--pipeline", default="single")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default=None)
    p.add_argument("--out", type=Path, default=Path("artifacts/taught_paraphrases.json"))
    p.add_argument("--exact", action="store_true",
                   help="also ask after teaching the asked question itself")
    args = p.parse_args(argv)

    import agentflow
    from agentflow.accuracy import MatchRule, evaluate_pair
    from agentflow.config import AgentFlowConfig
    from agentflow.datasets import load_dataset
    from agentflow.retrieval.paraphrase import PARAPHRASE_THRESHOLD, question_similarity

    if not args.data.exists():
        print(f"no dataset at {args.data}", file=sys.stderr)
        return 1
    dataset = load_dataset(args.data, args.split)
    pairs = paraphrase_pairs(dataset.examples, args.pairs, args.seed)
    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    config.data = [*config.data, args.data]
    config.teaching_store = str(Path(tempfile.mkdtemp(prefix="taught-para-")) / "t.sqlite")
    conditions = ("untaught", "taught", *(("taught_exact",) if args.exact else ()))
    partial = args.out.with_suffix(".jsonl")
    wanted = {(a.db_id, a.question) for _, a in pairs}
    results = [r for r in read_partial(partial)
               if r.get("pipeline") == args.pipeline and all(c in r for c in conditions)
               and (r["db"], r["asked_question"]) in wanted]
    done = {(r["db"], r["asked_question"]) for r in results}
    pending = [(t, a) for t, a in pairs if (a.db_id, a.question) not in done]
    if results:
        print(f"  {len(results)} pair(s) already in {partial}; asking {len(pending)}",
              file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with agentflow.connect(config) as af:
        for taught, asked in pending:
            db = af.catalog.open(asked.db_id)
            similarity = question_similarity(asked.question, taught.question)
            row: dict[str, Any] = {"db": asked.db_id, "taught_question": taught.question,
                                   "asked_question": asked.question, "gold": asked.gold_sql,
                                   "similarity": similarity, "pipeline": args.pipeline,
                                   "candidate": similarity >= PARAPHRASE_THRESHOLD}
            for condition in conditions:
                pair_id = None
                if condition == "taught":
                    pair_id = af.teach(taught.question, taught.gold_sql, db=asked.db_id).id
                elif condition == "taught_exact":
                    pair_id = af.teach(asked.question, asked.gold_sql, db=asked.db_id).id
                answer = af.ask(asked.question, db=asked.db_id, pipeline=args.pipeline,
                                evidence=asked.evidence)
                verdict = evaluate_pair(db, answer.sql or "", asked.gold_sql,
                                        rule=MatchRule.SPIDER)
                row[condition] = {"sql": answer.sql, "status": answer.status,
                                  "correct": verdict.correct,
                                  "confidence": (answer.confidence or {}).get("score")}
                if pair_id is not None:
                    af.forget_example(asked.db_id, pair_id)
            results.append(row)
            with partial.open("a") as f:
                f.write(json.dumps(row) + "\n")
            marks = " ".join(f"{c} {'ok ' if row[c]['correct'] else 'bad'}" for c in conditions)
            print(f"  sim {similarity:.2f} {marks} {asked.question[:60]!r}", file=sys.stderr,
                  flush=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                    "threshold": PARAPHRASE_THRESHOLD,
                                    "elapsed_s": time.monotonic() - started,
                                    "results": results}, indent=1))
    print(table(results, PARAPHRASE_THRESHOLD))
    return 0


def read_partial(path: Path) -> list[dict[str, Any]]:
    """Pairs a previous run finished (a torn last line, from a kill, is dropped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def table(results: list[dict[str, Any]], threshold: float) -> str:
    exact = bool(results) and all("taught_exact" in r for r in results)
    lines = ["| pairs | n | EX untaught | EX taught |" + (" EX exact question taught |"
                                                       if exact else ""),
             "|---|---|---|---|" + ("---|" if exact else "")]
    groups = [("all", results),
              (f"similarity >= {threshold} (taught SQL is a candidate)",
               [r for r in results if r["candidate"]]),
              (f"similarity < {threshold} (taught pair is a prompt example only)",
               [r for r in results if not r["candidate"]])]
    for name, rows in groups:
        if not rows:
            lines.append(f"| {name} | 0 | - | - |")
            continue
        un = sum(r["untaught"]["correct"] for r in rows)
        ta = sum(r["taught"]["correct"] for r in rows)
        line = (f"| {name} | {len(rows)} | {un / len(rows):.0%} ({un}) | "
                f"{ta / len(rows):.0%} ({ta}) |")
        if exact:
            ex = sum(r["taught_exact"]["correct"] for r in rows)
            line += f" {ex / len(rows):.0%} ({ex}) |"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
