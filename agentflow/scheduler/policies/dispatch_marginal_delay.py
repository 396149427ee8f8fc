"""``marginal_delay``: the instance where admitting the call costs the cluster the least time —
its own expected finish there *plus the stall its prompt prefill imposes on the calls that
instance is already decoding*.

Why not ``earliest_finish``: HEFT's ``W_i + t(call, i)`` prices an instance as a serial
machine, but a vLLM engine runs its admitted calls as one continuous batch. There, calls
already running do not delay a new one (a decode step reads the weights once for the whole
batch); what costs time is prefill. A step that carries a prefill chunk is compute-bound and
every sequence in the batch waits for it, so a prompt of ``P`` tokens admitted next to ``n``
decoding calls delays each of them by about its prefill time. Measured on the policy
suite's trace1 cell (paper-4gpu, 1.5 x L1): LLM calls spent 8% of their time in queues and
ran 1.6-2.9x longer than alone on the same instance — the tail is made of stalls, not waits.

So the price of instance ``i`` for a call is

    wait_i + t(call, i) + co_i * prefill(call, i)

* ``wait_i``: the calls queued ahead (their single-request seconds, as ``earliest_finish``),
  the prompts admitted there and not yet prefilled (the engine's token budget serves them
  first) and, when the engine has no slot or KV room for the call now, the mean remainder of its
  running calls (one of them must finish first; on an engine that runs one call at a time
  this is exactly the running call's remainder, so a serial instance is priced as HEFT
  prices it);
* ``t(call, i)``: the call's own expected time there;
* ``co_i * prefill(call, i)``: the stall it inflicts — ``co_i`` calls (those running, at
  most the engine's slots minus one) each wait its prefill once.

Charging each prefill-decode collision to the call whose admission causes it counts every
stall in the cluster exactly once, so the sum of these prices is the cluster's total
delay; the argmin is the greedy choice for it. All three terms are seconds on that
instance from the same time model; nothing is weighted or tuned. A fast GPU that is busy
decoding long outputs loses a long-prompt call to an idle slower one, and keeps a short
one."""

from __future__ import annotations

import numpy as np

from agentflow.scheduler.policies.base import DispatchPolicy


class MarginalDelayDispatch(DispatchPolicy):
    name = "marginal_delay"

    def price_s(self, call, instances, now, view) -> tuple[np.ndarray, np.ndarray]:
        """(price in seconds, name rank) of each of ``instances`` for ``call``."""
        b = view.batch_view(call, instances, now)
        wait = b.queued_s + b.prefilling_s + np.where(
            b.room, 0.0, b.running_s / np.maximum(b.n_running, 1.0))
        co_runners = np.minimum(b.n_running, b.slots - 1.0)
        return wait + b.time_s + co_runners * b.prefill_s, b.name_rank

    def choose(self, call, instances, now, view) -> str:
        price, names = self.price_s(call, instances, now, view)
        return instances[int(np.lexsort((names, price))[0])]
