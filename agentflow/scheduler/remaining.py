"""What a running call still has to do on its instance, in seconds: its prefill left, then the
decode its length distribution still expects. Apart from preemption (which prices victims with
it) because the admission gate's rank hold reads it too, and the gate sits below preemption in
the import order (preemption reads the classes)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from agentflow.scheduler.gittins import expected_residual

if TYPE_CHECKING:
    from agentflow.scheduler.call import ScheduledCall


def remaining_s(coordinator: Any, call: ScheduledCall, instance: str, now: float) -> float:
    """Expected seconds ``call`` still runs on ``instance``: what is left of its prefill
    while it has written nothing, then the decode of the output its length distribution
    still expects given the tokens it has reported (``expected_residual``: the Gittins
    conditioning and over-run rule). Why not its admission-time finish estimate: that hits
    0 once the call runs past its mean, and such a call (likely in its distribution's long
    tail) is the one with the most left."""
    model = coordinator.time_models[instance]
    # The residual is a pure function of the (immutable) prediction, the tokens written
    # and the cap: kept on the call until one of them moves. Why: the admission gate's
    # rank hold prices every decoding co-runner at every admission its instance tries, so
    # at ~3,000 calls in flight a call is priced ~4 times per finished call, mostly
    # between two of its own progress reports.
    output, attained, cap = call.output, call.attained_tokens, call.max_tokens
    memo = call.residual_memo
    if memo is not None and memo[0] is output and memo[1] == attained and memo[2] == cap:
        residual = memo[3]
    else:
        residual = expected_residual(output, attained, cap)
        call.residual_memo = (output, attained, cap, residual)
    left = model.decode_s(residual)
    return float(left) + prefill_left_s(coordinator, call, instance, now)


def prefill_left_s(coordinator: Any, call: ScheduledCall, instance: str, now: float) -> float:
    """Expected seconds of ``call``'s prompt still to prefill on ``instance`` (0 once it has
    written a token). Its own prefill began only after the prompts admitted there before it
    and not yet prefilled (``prefill_ahead_at_start``, served first by the engine's token
    budget), so the time since admission less theirs is what it has done."""
    if call.attained_tokens > 0 or call.started_at is None:
        return 0.0
    model = coordinator.time_models[instance]
    ahead_s = float(model.prompt_s(call.prefill_ahead_at_start))
    done_s = max(0.0, now - call.started_at - ahead_s)
    return max(0.0, float(model.prefill_s(call.tokens_on(instance))) - done_s)


# Relative margin under a prediction's mean in ``remaining_at_least_s``: far above the
# rounding of a mean of a few hundred non-negative atoms (~1e-13 of it), far below anything
# the hold compares with.
_MEAN_MARGIN = 1e-9


def remaining_at_least_s(coordinator: Any, call: ScheduledCall, instance: str) -> float:
    """A lower bound on ``remaining_s(coordinator, call, instance, now)`` at any ``now``,
    without the conditioning (``-inf`` where the instance's decode rate is negative): the
    decode seconds of the prediction's mean, less a margin, less the tokens written, at
    most the cap's room. Why it holds, float for float: ``E[C | C > a]`` is at least
    ``E[C]`` (conditioning on an upper set), and past every size the over-run rule prices
    at least the largest, which is at least the mean; both means are computed within
    ~1e-13 of the exact ones (non-negative atoms), inside ``_MEAN_MARGIN``; the cap's clamp
    is ``min``/``max`` of the same floats; ``decode_s`` is a product with non-negative
    factors, non-decreasing in the tokens as rounded; the prefill left is never negative.
    What it is for: the admission gate's rank hold skips a co-runner whose remainder cannot
    be small enough to matter (``risk.hold_for_rank``) without conditioning its
    prediction (~9 us where the kept residual has moved)."""
    model = coordinator.time_models[instance]
    if not (model.decode_s_per_token >= 0 and model.decode_ratio >= 0):
        return -math.inf
    attained = call.attained_tokens
    tokens = call.output.mean() * (1.0 - _MEAN_MARGIN) - attained
    cap = call.max_tokens
    if cap is not None:
        tokens = min(tokens, float(cap) - attained)
    if not tokens > 0:
        return -math.inf  # nothing better than the trivial bound
    return float(model.decode_s(tokens))
