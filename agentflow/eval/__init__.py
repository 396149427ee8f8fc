"""Execution accuracy: run predicted and gold SQL, compare results under BIRD or Spider rules."""

from agentflow.eval.accuracy import (
    REASONS,
    Verdict,
    evaluate_pair,
)
from agentflow.eval.compare import (
    MatchRule,
    describe_mismatch,
    gold_has_order_by,
    results_match,
)

__all__ = [
    "MatchRule", "results_match", "describe_mismatch", "gold_has_order_by",
    "Verdict", "REASONS", "evaluate_pair",
]
