"""``agentflow eval``: answer quality and serving latency together, per pipeline and policy.

Real mode runs the questions through the real pipelines and backends; simulated mode replays
those recordings on a simulated cluster. Execution accuracy itself lives in ``agentflow.accuracy``.
"""

from agentflow.evaluation.hardness import HARDNESS_LEVELS, HardnessError, spider_hardness
from agentflow.evaluation.runner import run_eval
from agentflow.evaluation.spec import EvalError, parse_dataset_spec

__all__ = ["HARDNESS_LEVELS", "EvalError", "HardnessError", "parse_dataset_spec", "run_eval",
           "spider_hardness"]
