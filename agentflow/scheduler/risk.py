"""How close a query is to missing its deadline, as flowsage's queue reads it, for the places
that act on that rank outside the queue: which prefill waits in agentflow's queue while
at-risk calls decode (``hold_for_rank``, in the admission gate).

Why outside the queue: under ``marginal_delay`` calls are admitted to an engine almost as
soon as they are ready, so the queue rarely has two calls to order; a call's latency above
its time alone is then mostly spent *running beside* other calls — its decode steps
lengthened by co-running decodes and stalled by co-running prefill chunks
(``agentflow bench queue_choice --attribute`` measures the parts). The order can still act
there: on who shares an engine's steps with whom, which agentflow decides by what it
releases into each engine (vLLM or llama-server alike: nothing the engine must support).

``slack_s``: seconds a query can still wait and meet its deadline at its mean remaining
path, ``D - now - R`` (flowsage's latest start, less now); ``inf`` without a deadline.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from agentflow.scheduler.policies.queue_flowsage import remaining_spread_s
from agentflow.scheduler.remaining import remaining_at_least_s, remaining_s

if TYPE_CHECKING:
    from agentflow.scheduler.call import QueryState, ScheduledCall


class RunningQueue(Protocol):
    """What the hold reads of an instance's queue (``InstanceQueue`` has it): named here, not
    imported, since the instance queue reads the classes, which call the hold."""

    @property
    def name(self) -> str: ...

    @property
    def running(self) -> Iterable[ScheduledCall]: ...


def ranks_by_risk(coordinator: Any) -> bool:
    """Whether the coordinator's queue ranks by deadline risk (flowsage): only then do the
    rank-aware hold and weights act (fcfs, edf and the rest keep their plain behaviour)."""
    queue = getattr(coordinator, "_queue_policy", None)
    return queue is not None and getattr(queue, "name", None) == "flowsage"


def slack_s(coordinator: Any, query: QueryState, now: float) -> float:
    """``D - now - R``: the query's slack at its mean remaining critical path (inf: none)."""
    if query.deadline is None:
        return math.inf
    return float(query.deadline - now - coordinator.remaining_s(query, now))


def miss_probability(coordinator: Any, query: QueryState, now: float) -> float:
    """``1 - Phi(z)``, ``z = slack / sigma`` with flowsage's spread (P10-P90 width of the
    remaining path read as a normal law); 0 without a deadline."""
    if query.deadline is None:
        return 0.0
    return 0.5 * math.erfc(deadline_z(coordinator, query, now) / math.sqrt(2.0))


def deadline_z(coordinator: Any, query: QueryState, now: float) -> float:
    """``z = slack / sigma``: the query's slack at its mean remaining path over flowsage's
    spread (the normal law ``miss_probability`` and ``savable.is_lost`` read); the query
    must have a deadline."""
    assert query.deadline is not None
    remaining = float(coordinator.remaining_s(query, now))
    return (query.deadline - now - remaining) / remaining_spread_s(query, remaining)


# --------------------------------------------------------------------- admission hold
# A prefill chunk stalls every decode step it shares, and at 1.5-2 x L1 on paper-4gpu that
# stall is about half of a call's time alone (3.4 s of 6.9 s per LLM call, against 0.35 s
# in queues: ``queue_choice --attribute``). Each prompt stalls whoever decodes beside it, so
# the order decides whose decodes pay: a prompt of a query that is safe (miss probability
# at most ``HOLD_SAFE``) waits in agentflow's queue while a call of a query at risk (miss
# probability at least ``HOLD_AT_RISK``) decodes on that instance, as long as it could wait
# for that call to end and still keep more slack than the call has now. Released by the
# next admission the instance makes (a first token, a finish, a dispatch there) once that
# no longer holds: its own slack falls as it waits, and the at-risk call ends or runs late.
# Holding every prompt of more slack than a decoding co-runner (no bounds) was measured
# worse: at 1.5 x L1 it held 14-21% of admissions and P95 rose 14-15% on two of three seeds.
#
# The wait is bounded too: the prompt is held for an at-risk call only while that call's
# expected remainder on the instance is at most ``HOLD_WAIT_PER_STALL`` times the prompt's own
# prefill seconds there. Why: holding buys the at-risk call about the prompt's prefill time
# (its chunks would lengthen that call's decode steps by about as much) and costs the held
# call the at-risk call's whole remainder (the hold lasts until that call ends): a long
# wait for a short stall is a net loss of time. Measured (paper-4gpu, trace1, 80 queries,
# depth 2, 1.5 and 2 x L1, seeds 1-10: 20 cells), k = 4 against no bound: mean latency
# 0.984x (lower in 18 of 20 cells), P95 0.995x (+-0.006: no clear change; 11 lower, 8
# higher); k = 1 holds too little (P95 0.957 and 0.975 of md+fcfs on seeds 1-3 and 4-7,
# against 0.960 and 0.956 unbounded); k = 8 is as k = 4 (P95 0.990x of unbounded, 14 cells).
#
# Second rule, whatever the decoders' risk (``_spares_stall``): the prompt of a safe query
# also waits while the decoders here that finish soonest would each be spared its prefill
# chunks for less than the wait: for some j, j x its prefill seconds > the j-th smallest
# expected remainder w_j of the other queries' decoding calls, and w_j is at most
# ``HOLD_SPARE_SLACK_SHARE`` of its slack. Why: every decoder beside a prompt pays the
# prompt's whole prefill (its chunks lengthen each of their steps), so holding it while j of
# them end saves j x prefill seconds of decode time for w_j of its own; the slack cap keeps a
# safe query from waiting itself towards risk (a query without a deadline has no slack to
# share: the rule leaves it alone). The at-risk rule above never acts where no
# query nears its deadline (hetero-8 at 1.5-2 x L1: 665 of 666 stall seconds are safe on safe);
# this one does. Measured (trace1, 80 queries, depth 2, 1.5 and 2 x L1, seeds 1-20: 40 cells
# per cluster), flowsage / md+fcfs P95 paired against without it: hetero-8 x0.973 +-0.009
# (lower in 28 of 40), paper-4gpu x1.005 +-0.006 (19 of 40), all 80 x0.988 +-0.006. Share
# 0.05: hetero x0.978, paper x1.010 (seeds 1-10); no cap: x0.976 / x1.031 — on paper-4gpu a
# 70B prompt's prefill is seconds, long enough that holds capped only by the whole slack pushed
# safe queries into the tail. Re-measured before landing (stop 52, on 4534c02, the rule off
# and on in one process, seeds 1-20 at 1.5, 2 and 3 x L1: 60 cells per cluster): hetero-8
# x0.969 +-0.008 (lower in 46 of 60; per load x0.971 / x0.974 / x0.961), paper-4gpu x1.000
# +-0.005 (29 of 60; x0.997 / x1.009 / x0.992), all 120 x0.984 +-0.005; mean latency
# hetero-8 x0.975 +-0.003, paper-4gpu x0.999 +-0.003. On seeds 1-3 alone it reads worse on
# paper-4gpu at 1.5 x (x1.034): three seeds are inside one cell's 3-6% spread.
# Rules measured and not taken (the budget in rank order, stopping safe calls for an at-risk
# one, a hold by projected latency, ...): docs/scheduler.md, "Where the queue order acts".
RANK_HOLD = True
HOLD_SAFE = 0.02
HOLD_AT_RISK = 0.4
HOLD_WAIT_PER_STALL: float | None = 4.0  # None: no bound on the wait
HOLD_SPARE_SLACK_SHARE: float | None = 0.01  # None: the second rule off


def hold_for_rank(coordinator: Any, queue: RunningQueue, call: ScheduledCall,
                  now: float) -> bool:
    """Whether ``call`` (the best waiting call on ``queue``, which runs something) waits.

    Priced in the order that needs least: a co-runner whose remainder is surely too long to
    matter to either rule (``remaining.remaining_at_least_s``: one multiply) is left out;
    each other decoding co-runner's own remainder on the instance is priced once (its
    residual is kept on the call, ``remaining.remaining_s``), which the second rule and the
    wait bound both read; then the second rule, which reads no paths;
    then the at-risk rule, reading a co-runner's query's critical path (slack and miss
    probability from one read: often a put-off pass to make, ``WorkflowPaths._settle``)
    only where the wait bound leaves it in. The tests are pure, the hold is the first rule
    or the second, and each test only skips a co-runner, so the answer is the one the
    stop-53 order gives (``_hold_for_rank_priced``, kept as the reference: what
    ``_WAIT_FIRST = False`` runs; tests/scheduler/test_gatecut_exact.py compares every
    decision); a paths pass not made here is made as of its report when someone reads
    the paths, or replaced by the query's next event's own pass: the same floats."""
    if not RANK_HOLD:
        return False
    if not _WAIT_FIRST:
        return _hold_for_rank_priced(coordinator, queue, call, now)
    query = call.query
    deadline = query.deadline
    if deadline is None:
        mine = math.inf  # no slack to lose, nothing to miss (``slack_s``, ``miss_probability``)
    else:
        remaining = float(coordinator.remaining_s(query, now))
        mine = deadline - now - remaining
        if not mine > 0:
            return False
        z = mine / remaining_spread_s(query, remaining)
        if 0.5 * math.erfc(z / _SQRT2) > HOLD_SAFE:
            return False
    name = queue.name
    stall = float(coordinator.time_models[name].prefill_s(call.tokens_on(name)))
    bound = HOLD_WAIT_PER_STALL
    share = HOLD_SPARE_SLACK_SHARE
    spare = share is not None and math.isfinite(mine)  # a query without a deadline has
    limit = share * mine if share is not None and spare else -math.inf  # no slack to share
    # A co-runner whose remainder is surely above the wait bound (the first rule skips it)
    # and at least the second rule's cap (it can neither act nor come before one that does
    # in that rule's order) is left out unpriced (``remaining_at_least_s``); without a
    # bound the first rule reads every co-runner.
    above = bound * stall if bound is not None and _BOUND_SKIP else math.inf
    decoding: list[tuple[float, ScheduledCall]] = []  # (its remainder here, co-runner)
    for r in queue.running:
        if r.attained_tokens == 0 or r.query is query:
            continue  # still prefilling itself, or its own query's sibling
        if above < math.inf:
            least = remaining_at_least_s(coordinator, r, name)
            if least > above and least >= limit:
                continue
        decoding.append((remaining_s(coordinator, r, name, now), r))
    if not decoding:
        return False
    if spare:  # the second rule first: it reads no paths
        waits = sorted([w for w, _ in decoding])
        for j, w in enumerate(waits):
            if w < limit and (j + 1) * stall > w:
                return True
    for wait, r in decoding:
        if bound is not None and wait > bound * stall:
            continue  # a long wait for a short stall saved
        theirs_q = r.query
        their_deadline = theirs_q.deadline
        if their_deadline is None:
            continue  # infinite slack: never less than the call's
        theirs_left = float(coordinator.remaining_s(theirs_q, now))
        theirs = their_deadline - now - theirs_left
        if theirs >= mine:
            continue
        z = theirs / remaining_spread_s(theirs_q, theirs_left)
        if 0.5 * math.erfc(z / _SQRT2) < HOLD_AT_RISK:
            continue
        if mine - wait <= theirs:
            continue  # it could not wait for r to end and keep more slack than r has now
        return True
    return False


# the co-runner-cheap order above (False: ``_hold_for_rank_priced``, stop 53's; tests compare)
_WAIT_FIRST = True
# and in it, co-runners that cannot matter left unpriced (False: every one priced; tests compare)
_BOUND_SKIP = True
_SQRT2 = math.sqrt(2.0)


def _hold_for_rank_priced(coordinator: Any, queue: RunningQueue, call: ScheduledCall,
                          now: float) -> bool:
    """``hold_for_rank`` as stop 53 priced it: every decoding co-runner's slack and miss
    probability first (the reference the tests compare the order above with)."""
    mine = slack_s(coordinator, call.query, now)
    if not mine > 0 or miss_probability(coordinator, call.query, now) > HOLD_SAFE:
        return False
    stall: float | None = None  # the call's prefill seconds here, priced once if needed
    for r in queue.running:
        if r.attained_tokens == 0 or r.query is call.query:
            continue  # still prefilling itself, or its own query's sibling
        theirs = slack_s(coordinator, r.query, now)
        if theirs >= mine or miss_probability(coordinator, r.query, now) < HOLD_AT_RISK:
            continue
        wait = remaining_s(coordinator, r, queue.name, now)
        if mine - wait <= theirs:
            continue  # it could not wait for r to end and keep more slack than r has now
        if HOLD_WAIT_PER_STALL is not None:
            if stall is None:
                stall = float(coordinator.time_models[queue.name].prefill_s(
                    call.tokens_on(queue.name)))
            if wait > HOLD_WAIT_PER_STALL * stall:
                continue  # a long wait for a short stall saved
        return True
    if HOLD_SPARE_SLACK_SHARE is None or not math.isfinite(mine):
        return False  # off, or a query without a deadline: no slack to take a share of
    if stall is None:
        stall = float(coordinator.time_models[queue.name].prefill_s(
            call.tokens_on(queue.name)))
    return _spares_stall(coordinator, queue, call, now, stall,
                         HOLD_SPARE_SLACK_SHARE * mine)


def _spares_stall(coordinator: Any, queue: RunningQueue, call: ScheduledCall, now: float,
                  stall: float, limit: float) -> bool:
    """Whether, for some j, the j decoding calls (of other queries) on ``queue`` that end
    soonest are spared more decode seconds (j x ``stall``, the held prompt's prefill) than
    ``call`` waits for them (the j-th smallest expected remainder, at most ``limit``)."""
    left = sorted(remaining_s(coordinator, r, queue.name, now) for r in queue.running
                  if r.attained_tokens > 0 and r.query is not call.query)
    return any(w < limit and (j + 1) * stall > w for j, w in enumerate(left))
