"""``cache_aware``: ``earliest_finish`` that credits prefix-cache hits.

An instance that already holds a call's prompt prefix (a CHESS or MAC-SQL sibling sharing the
schema + question head of its prompt) prefills only the rest, so the call's expected time
there is ``t(call, i) - saved_i``, where ``saved_i`` is the prefill time of the prefix the
coordinator's router-side index believes instance ``i`` holds (``Coordinator.prefix_saved_s``,
the approximate index of SGLang's cache-aware router and llm-d's prefix scorer, fed with the
prompts the coordinator dispatched — the same in serving and in simulation). The argmin of
``W_i + t(call, i) - saved_i`` trades locality against load in one unit (seconds): the
holder wins at equal load and loses once its backlog exceeds what the hit saves. Calls
without prompt text (HexGen-Flow traces) save nothing here: exactly ``earliest_finish``."""

from __future__ import annotations

from agentflow.scheduler.policies.dispatch_earliest_finish import EarliestFinishDispatch


class CacheAwareDispatch(EarliestFinishDispatch):
    name = "cache_aware"
    prefix_aware = True  # the coordinator keeps its prefix index for this policy

    def finish_s(self, call, instances, now, view):
        finish, names = super().finish_s(call, instances, now, view)
        if call.prefix_hashes:
            finish = finish - view.prefix_saved_s(call, instances)
        return finish, names
