"""Does teaching help? EX and executable rate with 0 vs K taught examples per database.

    nice -n 10 agentflow bench teaching_effect --data ../shared/datasets/spider \
        --dbs concert_singer,pets_1,car_1 --n 12 --taught 5 --pipeline single \
        --out artifacts/teaching_effect.json

For each database, K questions (a seeded shuffle of its questions) are taught with their gold
SQL through ``af.teach`` — the same path a user takes, guard and execution check included —
and N *other* questions of the same database are asked twice through one AgentFlow (one model,
temperature 0): first with nothing taught, then with the K pairs taught. Both runs use the same
number of few-shot slots (``--shots``, default K): without teaching they hold the dataset pool's
train examples (other databases), with teaching the taught pairs come first. ``--no-pool``
drops the dataset pool, so untaught questions get no examples (a user's own database).
Accuracy is the Spider test-suite rule against the gold SQL; "executable" is an answer whose
SQL ran.

The taught pairs come from ``--teach-split`` when it has questions on the database (the
issue's intent: train), otherwise from the evaluated split's *other* questions — Spider's
official train and dev splits share no database, so for Spider dev databases the taught pairs
are dev questions held out from the ones asked (the script prints which source it used).
Prints a table and writes every answer to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import agentflow
from agentflow.accuracy import MatchRule, evaluate_pair
from agentflow.config import AgentFlowConfig
from agentflow.datasets import load_dataset


def pick(dataset, teach_pool, db_id: str, n: int, k: int, seed: int):
    """(taught examples, source label, asked examples) for one database."""
    mine = [e for e in dataset.examples if e.db_id == db_id]
    rng = random.Random(f"{seed}:{db_id}")
    rng.shuffle(mine)
    from_train = [e for e in teach_pool if e.db_id == db_id] if teach_pool else []
    if len(from_train) >= k:
        rng.shuffle(from_train)
        return from_train[:k], "train split", mine[:n]
    asked_q = {e.question for e in mine[k:k + n]}
    taught = [e for e in mine[:k] if e.question not in asked_q]
    return taught, f"{dataset.split} split, held out from the asked questions", mine[k:k + n]


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--dbs", "concert_singer", "--n", "3", "--taught", "2")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a Spider/BIRD folder")
    p.add_argument("--split", default="dev")
    p.add_argument("--teach-split", default="train")
    p.add_argument("--dbs", default="concert_singer,pets_1,car_1")
    p.add_argument("--n", type=int, default=12, help="questions asked per database")
    p.add_argument("--taught", type=int, default=5, help="pairs taught per database")
    p.add_argument("--shots", type=int, default=None, help="few-shot slots (default: --taught)")
    p.add_argument("--pipeline", default="single")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-pool", action="store_true",
                   help="no dataset few-shot pool: untaught questions get no examples at all "
                        "(a user's own database, or the demo, before anything is taught)")
    p.add_argument("--config", default=None)
    p.add_argument("--record", default=None, help="append DAG traces (prompts) to this JSONL")
    p.add_argument("--out", type=Path, default=Path("artifacts/teaching_effect.json"))
    args = p.parse_args(argv)

    dataset = load_dataset(args.data, args.split)
    try:
        teach_pool = load_dataset(args.data, args.teach_split).examples
    except FileNotFoundError:
        teach_pool = []
    dbs = [d.strip() for d in args.dbs.split(",") if d.strip()]
    shots = args.shots if args.shots is not None else args.taught
    config = AgentFlowConfig.load(args.config) if args.config else AgentFlowConfig()
    config.data = [*config.data, args.data]
    if args.no_pool:
        config.fewshot = None
    config.pipeline_params = {**config.pipeline_params,
                              args.pipeline: {**config.pipeline_params.get(args.pipeline, {}),
                                              "n_shots": shots}}
    config.teaching_store = str(Path(tempfile.mkdtemp(prefix="teach-bench-")) / "t.sqlite")
    results: list[dict] = []
    started = time.monotonic()
    with agentflow.connect(config) as af:
        for db_id in dbs:
            taught, source, asked = pick(dataset, teach_pool, db_id, args.n, args.taught,
                                         args.seed)
            print(f"{db_id}: {len(asked)} asked, {len(taught)} taught from the {source}",
                  file=sys.stderr, flush=True)
            db = af.catalog.open(db_id)
            for condition in ("0", str(len(taught))):
                ids = []
                if condition != "0":
                    ids = [af.teach(e.question, e.gold_sql, db=db_id).id for e in taught]
                for example in asked:
                    answer = af.ask(example.question, db=db_id, pipeline=args.pipeline,
                                    evidence=example.evidence, record=args.record)
                    verdict = evaluate_pair(db, answer.sql or "", example.gold_sql,
                                            rule=MatchRule.SPIDER)
                    results.append({"db": db_id, "taught": int(condition), "source": source,
                                    "question": example.question, "gold": example.gold_sql,
                                    "sql": answer.sql, "status": answer.status,
                                    "executable": (answer.status in ("done", "unsure")
                                                   and bool(answer.sql)),
                                    "correct": verdict.correct, "reason": verdict.reason,
                                    "latency_s": answer.latency_s})
                    print(f"  [{condition} taught] {'ok ' if verdict.correct else 'bad'} "
                          f"{example.question[:60]!r}", file=sys.stderr, flush=True)
                for example_id in ids:
                    af.forget_example(db_id, example_id)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                    "elapsed_s": time.monotonic() - started,
                                    "results": results}, indent=1))
    print(table(results))
    return 0


def table(results: list[dict]) -> str:
    """EX and executable rate per database and condition, and the ratio taught/untaught."""
    lines = ["| database | taught | n | EX | executable |", "|---|---|---|---|---|"]
    keys = sorted({(r["db"], r["taught"]) for r in results})
    for db, taught in [*keys, *sorted({("all", r["taught"]) for r in results})]:
        rows = [r for r in results if (db == "all" or r["db"] == db) and r["taught"] == taught]
        n = len(rows)
        ex = sum(r["correct"] for r in rows) / n
        run = sum(r["executable"] for r in rows) / n
        lines.append(f"| {db} | {taught} | {n} | {ex:.0%} ({sum(r['correct'] for r in rows)})"
                     f" | {run:.0%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
