"""What the scheduler predicts for each chess stage before any history, without and with the
stage's ``max_tokens`` cap (the clip the coordinator now applies).

    agentflow bench max_tokens_clip

Prints mean and P90 output tokens per stage, and the cost (O^2/2 + I*O) mean that ranking and
KV admission read, with the chess pipeline's own prompt-size hints.
"""

from __future__ import annotations

import argparse

from agentflow.scheduler.distribution import cost_distribution
from agentflow.scheduler.lengths.learned import LearnedLengthModel
from pipelines.chess import _KEYWORD_PARAMS, _VERDICT_PARAMS, ChessPipeline
from pipelines.common import SQL_PARAMS

# (stage, prompt-token hint of chess.py, the cap its call uses)
STAGES = (("extract_keywords", 180, _KEYWORD_PARAMS.max_tokens),
          ("generate_candidate", 700, SQL_PARAMS.max_tokens),
          ("revise", 780, SQL_PARAMS.max_tokens),
          ("generate_unit_test", 700, ChessPipeline()._tests_params().max_tokens),
          ("evaluate", 800, _VERDICT_PARAMS.max_tokens))


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    p = LearnedLengthModel()
    print(f"{'stage':<20} {'cap':>4} | {'mean':>7} {'P90':>7} {'cost':>10} | "
          f"{'mean':>6} {'P90':>6} {'cost':>9} | cost ratio")
    for stage, prompt, cap in STAGES:
        free = p.predict(stage, "", prompt)
        clip = p.predict(stage, "", prompt, max_tokens=cap)
        cf, cc = cost_distribution(prompt, free).mean(), cost_distribution(prompt, clip).mean()
        print(f"{stage:<20} {cap:>4} | {free.mean():7.0f} {free.quantile(0.9):7.0f} {cf:10.0f} | "
              f"{clip.mean():6.0f} {clip.quantile(0.9):6.0f} {cc:9.0f} | {cf / cc:6.1f}x")


if __name__ == "__main__":
    main()
