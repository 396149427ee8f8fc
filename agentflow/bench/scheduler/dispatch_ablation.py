"""The dispatch ablation: marginal_delay without its co-runner decode terms.

    agentflow bench dispatch_ablation [flowsage_ablations.py's options]

``marginal_delay`` prices an instance for a call as wait + own time + the delay it inflicts
(agentflow/scheduler/policies/dispatch_marginal_delay.py); two of its terms come from the
learned decode slope ``d`` (seconds one more co-runner adds to a decode): the call's own
slowdown ``d * (co - seen)`` and the slowdown it inflicts on its co-runners ``co * d``. The
whole simulated margin of flowsage was traced to them, so this file registers
``marginal_delay_nodecode`` — the same price with ``d = 0`` — in the public ``DISPATCH``
registry (from here, not in the product), then runs ``agentflow bench flowsage_ablations``
with ``--policies`` defaulting to the pairs that isolate the terms:

    flowsage, marginal_delay_nodecode+flowsage, marginal_delay+fcfs,
    marginal_delay_nodecode+fcfs, earliest_finish+fcfs
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

from agentflow.scheduler.policies import DISPATCH
from agentflow.scheduler.policies.dispatch_marginal_delay import (
    MarginalDelayDispatch,
)

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView

NAME = "marginal_delay_nodecode"
POLICIES = ("flowsage", f"{NAME}+flowsage", "marginal_delay+fcfs", f"{NAME}+fcfs",
            "earliest_finish+fcfs")


class NoDecodeTermsDispatch(MarginalDelayDispatch):
    """``marginal_delay`` with the co-runner decode terms dropped (``d = 0``): wait + own
    time + the prefill stall it inflicts on its co-runners."""

    name = NAME

    def price_s(self, call: ScheduledCall, instances: list[str], now: float,
                view: SchedulerView) -> tuple[np.ndarray, np.ndarray]:
        b = view.batch_view(call, instances, now)
        wait = b.queued_s + b.prefilling_s + np.where(
            b.room, 0.0, b.running_s / np.maximum(b.n_running, 1.0))
        co = np.minimum(b.n_running, b.slots - 1.0)
        price = wait + b.time_s + co * b.prefill_s
        return price - self.saved_s(call, instances, view, co), b.name_rank


DISPATCH[NAME] = NoDecodeTermsDispatch


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--cells", "trace1/poisson", "--queries", "40")


def main(argv: list[str] | None = None) -> None:
    from agentflow.bench.scheduler import flowsage_ablations

    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a == "--policies" or a.startswith("--policies=") for a in args):
        args += ["--policies", ",".join(POLICIES)]
    flowsage_ablations.main(args)


if __name__ == "__main__":
    main()
