"""``agentflow eval``: accuracy and latency of pipelines x policies, real or simulated."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agentflow.cli import table_console
from agentflow.metrics import scale_key
from agentflow.scheduler.policies import policy_help


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="measure answer quality and serving latency of pipelines x policies",
        description="Real mode (no --cluster): run the questions through the real pipelines "
                    "and backends at their arrival times, for every pipeline x policy, and "
                    "record traces. Simulated mode (--cluster): replay the traces recorded by "
                    "a real run in the same --out (or --traces FILE) on a simulated cluster "
                    "under each policy. Writes per-question records, summary.json, report.md "
                    "and plots to --out; rerunning with the same --out skips finished "
                    "questions.")
    p.add_argument("--dataset", default=None,
                   help="spider:DIR[:split] | bird:DIR[:split] | demo (split defaults to dev); "
                        "required in real mode")
    p.add_argument("--pipeline", default=None,
                   help="comma-separated pipelines (single, chess, macsql); real mode default: "
                        "the config's; simulated: every recorded one")
    p.add_argument("--policy", default=None,
                   help="comma-separated policies; real mode default: the config's; "
                        "simulated: every preset with learned lengths. "
                        + policy_help().replace("%", "%%"))
    p.add_argument("--limit", type=int, default=None,
                   help="a seeded sample of N questions (default: the whole split)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample and the arrivals")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--config", default=None,
                      help="YAML/JSON agentflow config for real mode (default: the embedded "
                           "local CPU model)")
    mode.add_argument("--cluster", default=None,
                      help="simulated mode: a cluster name (paper-4gpu, h100-8b-4, mixed-qwen) "
                           "or YAML file")
    p.add_argument("--traces", type=Path, default=None,
                   help="simulated mode: an agentflow JSONL trace to replay instead of the "
                        "real run recorded in --out")
    p.add_argument("--rate", type=float, default=None,
                   help="mean arrival rate in queries/s (real mode without it: one question "
                        "at a time; simulated default: 1)")
    p.add_argument("--arrival", default=None,
                   help="poisson (default) | gamma:CV | steps:RATE/SECONDS,RATE/SECONDS,...")
    p.add_argument("--slo-scale", type=float, default=2.0,
                   help="the SLO scale (x idle latency) reported as the headline; in simulated "
                        "mode also the deadline given to the scheduler (default: 2)")
    p.add_argument("--slo", type=float, default=None,
                   help="real mode: an end-to-end target in seconds given to every question")
    p.add_argument("--slo-class", default="batch",
                   help="the SLO class of every question (default: batch, ranked and shed "
                        "behind interactive users sharing the cluster; interactive measures "
                        "what a person waiting would see); a simulated replay runs its "
                        "queries in it too and records it")
    p.add_argument("--eval-timeout", type=float, default=30.0,
                   help="seconds each predicted/gold query may run when judging")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default: artifacts/eval-<dataset>-<split>)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--keep-distinct", action="store_true",
                   help="judge with DISTINCT kept (the official Spider evaluator's "
                        "--keep_distinct); by default it is stripped, as that evaluator does")
    p.set_defaults(func=cmd_eval)


def default_out(dataset: str | None) -> Path:
    from agentflow.evaluation.spec import parse_dataset_spec

    if not dataset:
        raise ValueError("give --out (the folder of the real run to replay) or --dataset")
    spec = parse_dataset_spec(dataset)
    name = "demo" if spec.kind == "demo" else f"{spec.kind}-{Path(spec.root).name}"
    return Path("artifacts") / f"eval-{name}-{spec.split}"


def cmd_eval(args: argparse.Namespace) -> int:
    from agentflow.evaluation import run_eval

    out = args.out or default_out(args.dataset)
    console = Console(stderr=True)
    summary = run_eval(args.dataset, out=out, pipelines=args.pipeline, policies=args.policy,
                       limit=args.limit, seed=args.seed, config=args.config,
                       cluster=args.cluster, traces=args.traces, rate=args.rate,
                       arrival=args.arrival, slo_scale=args.slo_scale, slo_s=args.slo,
                       eval_timeout_s=args.eval_timeout, plots=not args.no_plots,
                       console=console, keep_distinct=args.keep_distinct,
                       slo_class=args.slo_class)
    print_summary(table_console(), summary)
    return 0


def print_summary(console: Console, summary: dict) -> None:
    scale = summary["settings"]["slo_scale"]
    title = (f"{summary['mode']} mode" + (f" on {summary['settings']['cluster']}"
                                           if summary["settings"].get("cluster") else ""))
    table = Table(title=title)
    for col in ("run", "n", "EX spider", "EX bird", "mean s", "p50 s", "p95 s", "p99 s",
                "q/s", f"SLO@{scale:g}x", "calls/q"):
        table.add_column(col, justify="right", no_wrap=col == "run")

    def f(v, d=2):
        return "-" if v is None else f"{v:.{d}f}"

    def pct(v):
        return "-" if v is None else f"{100 * v:.1f}%"

    for key, r in summary["runs"].items():
        acc, lat = r["accuracy"], r["latency_s"]
        table.add_row(key, str(r["questions"]), pct(acc["accuracy"]), pct(acc["accuracy_bird"]),
                      f(lat["mean"]), f(lat["p50"]), f(lat["p95"]), f(lat["p99"]),
                      f(r["throughput_qps"], 3), pct(r["slo_attainment"].get(scale_key(scale))),
                      f(r["usage_per_question"]["calls"], 1))
    console.print(table)
    console.print(f"report: {summary['out']}/report.md", highlight=False)
