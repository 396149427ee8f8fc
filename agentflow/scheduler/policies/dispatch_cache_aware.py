"""``cache_aware``: ``marginal_delay`` that credits prefix-cache hits.

An instance that already holds a call's prompt prefix (a CHESS or MAC-SQL sibling sharing the
schema + question head of its prompt) prefills only the rest. The prefill seconds of that
prefix (``saved_i``: what the coordinator's router-side index believes instance ``i`` holds,
``Coordinator.prefix_saved_s`` — the approximate index of SGLang's cache-aware router and
llm-d's prefix scorer, fed with the prompts the coordinator dispatched, the same in serving
and in simulation) come off the call's own time there *and* off the stall its prefill imposes
on each call decoding next to it, so the price of ``marginal_delay`` falls by
``saved_i * (1 + co_runners_i)``. Locality and load trade in one unit (seconds): the holder
wins at equal load and loses once what it costs otherwise exceeds what the hit saves. Calls
without prompt text (HexGen-Flow traces) save nothing here: exactly ``marginal_delay``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentflow.scheduler.policies.dispatch_marginal_delay import MarginalDelayDispatch

if TYPE_CHECKING:
    import numpy as np

    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView


class CacheAwareDispatch(MarginalDelayDispatch):
    name = "cache_aware"
    prefix_aware = True  # the coordinator keeps its prefix index for this policy

    def saved_s(self, call: ScheduledCall, instances: list[str], view: SchedulerView,
                co_runners: np.ndarray) -> np.ndarray | float:
        if not call.prefix_hashes:
            return 0.0
        return view.prefix_saved_s(call, instances) * (1.0 + co_runners)
