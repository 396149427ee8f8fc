"""Execution accuracy: run predicted and gold SQL, compare results under BIRD or Spider rules.

(Named for what it measures; ``agentflow.evaluation`` is the harness that runs pipelines and
policies and reports accuracy next to latency.)"""

from agentflow.accuracy.compare import (
    MatchRule,
    describe_mismatch,
    gold_has_order_by,
    results_match,
)
from agentflow.accuracy.execution import (
    REASONS,
    Verdict,
    evaluate_pair,
)

__all__ = [
    "MatchRule", "results_match", "describe_mismatch", "gold_has_order_by",
    "Verdict", "REASONS", "evaluate_pair",
]
