"""``marginal_delay``: the instance where admitting the call costs the cluster the least time —
its own expected finish there *plus the delay it imposes on the calls that instance is
already running*.

Why not ``earliest_finish``: HEFT's ``W_i + t(call, i)`` prices an instance as a serial
machine, but a vLLM engine runs its admitted calls as one continuous batch. There, calls
already running do not make a new one wait; they share its steps. Measured on the policy
suite's trace1 cell (paper-4gpu, 1.5 x L1): LLM calls spent 8% of their time in queues and
ran 1.6-2.9x longer than alone on the same instance — the tail is made of slow shared steps,
not waits. Two things make shared steps slow:

* prefill: a step that carries a prefill chunk is compute-bound and every sequence in the
  batch waits for it, so a prompt admitted next to ``n`` running calls delays each of them by
  about its prefill time;
* decode: each step reads every sequence's KV cache (and, for a mixture-of-experts model, the
  experts any of them needs), so each co-runner slows every decode step a little. How much is
  learned from finished calls (``InstanceTimeModel.co_runner_slope``: decode ratio against
  the calls that ran beside it), per instance, not assumed.

So the price of instance ``i`` for a call is

    wait_i + t(call, i) + d_i * (co_i - seen_i)  +  co_i * (prefill(call, i) + d_i)

* ``wait_i``: the calls queued ahead (their single-request seconds, as ``earliest_finish``),
  the prompts admitted there and not yet prefilled (the engine's token budget serves them
  first) and, when the engine has no slot or KV room for the call now, the mean remainder of
  its running calls (one of them must finish first; on an engine that runs one call at a time
  this is exactly the running call's remainder, so a serial instance is priced as HEFT
  prices it);
* ``t(call, i)``: the call's own expected time there, whose decode rate was learned at
  ``seen_i`` co-runners on average; ``d_i`` is the decode seconds one more co-runner adds to
  the call (its output length times the learned slope, in the time model's base seconds), so
  its own time is corrected to the ``co_i`` calls it will actually run beside (at most the
  engine's slots minus one);
* ``co_i * (prefill + d_i)``: the delay it inflicts — each co-runner waits its prefill
  once and is slowed by it, as it slows the call, for its decode. Both are charged in full,
  as the call's own time is; capping the decode part at each co-runner's expected remainder
  was tried and measured worse (the remainders are single-request estimates, which a
  loaded engine outlasts).

Under class ranking, a call whose instance the headroom gate keeps free of new worse-band
prefill (``scheduler.classes``) is priced with the decode rate and slope learned *net of the
prefill chunks* finished calls sat through (``SchedulerView``'s ``batch_view``): beside a
batch flood those stalls are mostly batch prefill beside batch decodes, which it will not
see, and the prefill of its own band is charged below to the call that brings it. Priced
with the plain rate, interactive calls under a flood were herded onto the instances that
already hosted interactive calls and stalled each other's decodes (paper-4gpu, 2 x L1: of
+1.9 s more decode per interactive call, +1.4 s was in steps carrying another
interactive prompt's chunk).

No call is priced below its time alone there (``BatchView.solo_s``): the slope is a straight
line fitted at the co-runner counts finished calls saw (3-10 under a flood), and read at fewer
it fell below the solo rate, below zero on the MoE instances (mixed-qwen, 2 x L1: a 12k-token
candidate priced at 0.7 s on an idle A40 took 13.1 s there; candidates on the A40 ran 2.4x
their price, 1.05x with the floor). That is a property of the line, not of the queue, so the
floor holds for every call, shielded or not, with classes or without.

Charging each collision to the call whose admission causes it counts every stall in the
cluster once, so the argmin is the greedy choice for the cluster's total delay. All terms are
seconds on that instance from the same time model; nothing is weighted or tuned, and with no
co-runner data (or a serial engine) the decode terms are 0. A fast GPU that is busy decoding
loses a long-prompt call to an idle slower one, and keeps a short one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from agentflow.scheduler.policies.base import DispatchPolicy
from agentflow.scheduler.policies.lexmin import lexmin

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall
    from agentflow.scheduler.policies.base import SchedulerView


class MarginalDelayDispatch(DispatchPolicy):
    name = "marginal_delay"

    def price_s(self, call: ScheduledCall, instances: list[str], now: float,
                view: SchedulerView) -> tuple[np.ndarray, np.ndarray]:
        """(price in seconds, name rank) of each of ``instances`` for ``call``. The
        coordinator's view computes the price below in one pass (``marginal_price``: the
        same floats, without building a ``BatchView``); a view without it is priced here."""
        fused = getattr(view, "marginal_price", None)
        if fused is not None:
            price, co, names = fused(call, instances, now)
            return price - self.saved_s(call, instances, view, co), names
        return self.price_from_batch_view(call, instances, now, view)

    def price_from_batch_view(self, call: ScheduledCall, instances: list[str], now: float,
                              view: SchedulerView) -> tuple[np.ndarray, np.ndarray]:
        """``price_s`` term by term from ``view.batch_view`` (the definition; what the
        fused ``ClusterView.marginal_price`` is checked against)."""
        b = view.batch_view(call, instances, now)
        wait = b.queued_s + b.prefilling_s + np.where(
            b.room, 0.0, b.running_s / np.maximum(b.n_running, 1.0))
        co = np.minimum(b.n_running, b.slots - 1.0)  # calls it will run beside
        d = b.co_runner_decode_s  # decode seconds one more co-runner adds to the call
        # fewer co-runners than learned at: never faster than alone (solo_s <= time_s)
        own = np.maximum(b.time_s + d * (co - b.co_runners_seen), b.solo_s)
        # the delay inflicted counts on the co-runners it does not outrank (``n_peers``)
        peers = co if b.n_peers is None else np.minimum(b.n_peers, b.slots - 1.0)
        price = wait + own + peers * (b.prefill_s + d)
        return price - self.saved_s(call, instances, view, co), b.name_rank

    def saved_s(self, call: ScheduledCall, instances: list[str], view: SchedulerView,
                co_runners: np.ndarray) -> np.ndarray | float:
        """Seconds of the price an instance waives for this call (none here; see
        ``cache_aware``)."""
        return 0.0

    def choose(self, call: ScheduledCall, instances: list[str], now: float,
               view: SchedulerView) -> str:
        price, names = self.price_s(call, instances, now, view)
        return instances[lexmin((names, price))]
