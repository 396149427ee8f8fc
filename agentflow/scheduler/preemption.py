"""Preemption across SLO classes: stop lower-class calls that are already running so a
better-class call does not wait for them or share its batches with them.

Why: class ranking (``scheduler.classes``) orders only the *waiting* calls. A batch call that
started a moment before an interactive one still holds its slot until it ends (on a
single-slot instance, the interactive call waits that whole remainder), and on a batching
engine every co-runner slows each decode step of the interactive call. Queue order cannot
shorten either; stopping the batch call can.

The decision (``victims``), made by the coordinator whenever a call is dispatched and cannot
start, or starts beside running calls of a worse class:

* **Whom it may stop** (the mode): with ``class``, only calls whose class position is
  strictly worse than the call's; with ``fair``, also, within a class, calls of a tenant
  over its fair share for a call of a tenant within its share — the band order the queue
  already serves (``classes.call_band``: class position x 2, plus 1 while over share).
  Why ``fair`` stops a flooder's calls for a light tenant of the same class: the queue gives
  the light tenant the next free slot, but what the flood started while the light tenant
  had nothing running there goes on beside its calls (prompt chunks that stall their steps,
  decodes that lengthen them); stopping the cheapest of it is the same trade as across
  classes, bounded the same way.
* **How many**: as few as the better call's *slowdown budget* allows — ``SLOWDOWN`` of its
  expected time alone on that instance, and never more than its deadline slack (its
  HexGen-Flow share of the time to the query's deadline, less that expected time). A call
  that cannot start waits for the earliest running call to end; if that wait is within the
  budget nothing is stopped, else just enough worse-class calls to give it a slot and its
  KV. A call that started co-runs: each co-runner adds the decode time the instance's
  learned co-runner slope predicts (``InstanceTimeModel.co_runner_slope``, net of prefill
  stalls), and one still prefilling also what is left of its prompt — every chunk of it
  stalls each step of the better call (~1.4 s a 2048-token chunk of a 70B model on an
  A100, where a decode step is ~40 ms); worse-class calls are stopped until the delay of
  those left fits the budget.
* **Which**: the cheapest to redo first — the work it loses: the part of its prompt
  prefilled so far, or once it has written, its whole prompt again plus the decode tokens
  (recompute; no partial output is kept, as vLLM's preemption by recomputation), latest
  admitted first among equals. So the victims are
  mostly calls still in prefill, whose prefill chunks are also what slows a decode most.
* **Worth it**: a victim is stopped only if its redo costs less than what stopping it saves
  the better call (``NET_SAVING``) — its expected remainder, which the better call would
  wait, or the delay it adds as a co-runner; a call nearly done is left to finish. The
  remainder is priced from the output-length distribution given the tokens written so far
  (``remaining_s``), so a call past its mean with a long tail ahead is a candidate.
* **Bounded**: a call is stopped at most ``MAX_PREEMPTIONS`` times; after that it runs to
  the end wherever it is admitted (no livelock, no starvation of the lower class).

Dispatch is unchanged: it prices instances with the worse-class calls on them. Pricing them
as already stopped (their slots free, their prefill gone) was measured and dropped: with
``NET_SAVING`` most are not stopped, and better-class calls sent to them co-ran with them.

Why ``auto`` (``fair`` under flowsage) is the default: over the tenant grid's 9 cells and 6
seeds (``agentflow bench tenant_cells``, ``agentflow bench tenant_ratios``) the cells within
their isolation and fairness targets went from 32 to 39 of 54 (``class``: 38), at 0.994x of
the flooding tenant's throughput; in serving (single-slot scripted instances, two tenants
of one class, ``agentflow bench serving_classes --flood-class interactive``) the light
tenant's P95 under the flood went from 2.25x to 1.37x of alone.

Measured before (off by default then; figures of an earlier form of the rule,
before redo counted only the prefill done and the co-runner delay the clean slope plus the
prefill left — the closing notes of issue 22 carry the later ones): loopback serving on
single-slot scripted instances, interactive P95 under a batch flood 0.58x of without, batch
answers 1.21x on a shared machine, 0.99-1.00x and 0.42-0.92x on a quiet one
(``agentflow bench serving_classes --policies flowsage --preemption off,class``); the
simulated tenant grid (``agentflow bench policy_suite --tenants``), interactive P95 -12% to +9%
per cell, batch throughput -1% to +3%, 0.07-0.5 calls stopped per batch query: on 64-slot
engines with room kept for the better class, batch co-runners are not what keeps the
interactive P95 above its alone value. The first version (no ``NET_SAVING``, dispatch
pricing the stoppable calls as gone) lost up to 18% of batch throughput on the same grid and
raised the interactive P95 in 5 of 6 cells.

A victim goes back through dispatch with its admission sequence number, so within its class
it keeps its place (arrival order) in whichever queue takes it; its query sees nothing but
time. The runtime aborts the attempt (``decisions.PreemptCall``): the simulator frees its KV
(prefix blocks stay cached, so a redo of a prompt with text hits them), serving cancels the
backend request.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from agentflow.scheduler.call import CallState, ScheduledCall
from agentflow.scheduler.classes import best_active_band, call_band, class_of, class_positions
from agentflow.scheduler.remaining import prefill_left_s, remaining_s

if TYPE_CHECKING:
    from agentflow.scheduler.instance import InstanceQueue

PREEMPTION_MODES = ("off", "class", "fair")
# The default setting: ``fair`` where the queue keeps room for better bands (flowsage's),
# off under any other policy (where an explicit mode is a config error).
AUTO = "auto"
PREEMPTION_SETTINGS = (AUTO, *PREEMPTION_MODES)
SLOWDOWN = 0.1  # share of a call's alone time it may lose to worse-class co-runners
MAX_PREEMPTIONS = 2  # per call
# Stop only calls still waiting for their first token (the cheapest to redo, and the ones
# whose prefill chunks slow a decode most). Measured as a variant (not the default rule).
PREFILL_ONLY = False
# Stop a call only when what it loses (``redo_s``) is less than what stopping it saves the
# better call: the wait for its remainder, or the decode delay it adds as a co-runner.
NET_SAVING = True


def preemption_mode(value: str | None) -> str | None:
    """The coordinator's setting from a config value: None for off (or unset)."""
    if value is None or value == "off":
        return None
    if value not in PREEMPTION_MODES:
        raise ValueError(f"preemption must be one of {', '.join(PREEMPTION_SETTINGS)}; "
                         f"got {value!r}")
    return value


def check_preemption(value: str | None, policy: str, *, fair: bool | None = None
                     ) -> str | None:
    """``preemption_mode(value)``, refused where it could not act: preemption needs the
    queue to keep room for better classes (flowsage's headroom gate, ``scheduler.classes``),
    or a stopped call would start again at once beside the call it made way for — losing
    its progress for nothing. A ValueError naming ``policy`` rather than a silent no-op.
    ``auto`` (the default) is ``fair`` where it can act and off elsewhere, without an
    error. ``fair``: whether the coordinator's queue shares by class and tenant (else from
    the policy's name)."""
    mode = "fair" if value == AUTO else preemption_mode(value)
    if mode is None:
        return None
    if fair is None:
        from agentflow.scheduler.classes import CLASS_RANKED
        from agentflow.scheduler.policies import parse_policy

        fair = CLASS_RANKED.get(parse_policy(policy).queue, False)
    if not fair:
        if value == AUTO:  # the default: on where it can act, quietly off elsewhere
            return None
        raise ValueError(f"preemption {mode!r} acts only under the flowsage queue (the "
                         f"flowsage preset, or DISPATCH+flowsage), which keeps room for "
                         f"better classes; policy {policy!r} does not: use preemption 'off' "
                         f"with it")
    return mode


def position(coordinator: Any, call: ScheduledCall) -> int:
    """Where the call's query stands for preemption (lower: may stop higher): its class
    position (0: the best class) under ``class``; its band under ``fair`` (class position
    x 2, plus 1 while its tenant is over its share), so an over-share tenant's calls are
    stoppable for an in-share tenant's of the same class."""
    if coordinator.preemption == "fair":
        return call_band(coordinator, call.query)
    classes = coordinator.slo_classes
    return class_positions(classes)[class_of(call.query, classes).rank]


def redo_s(coordinator: Any, call: ScheduledCall, instance: str, now: float) -> float:
    """Seconds of work lost if ``call`` is stopped now: the part of its prompt prefilled so
    far (what is left of it is work either way), and, once it has written, its whole prompt
    again and what it wrote."""
    model = coordinator.time_models[instance]
    done = float(model.prefill_s(call.tokens_on(instance))
                 + model.decode_s(call.attained_tokens))
    return done - prefill_left_s(coordinator, call, instance, now)


def budget_s(coordinator: Any, call: ScheduledCall, alone_s: float, now: float) -> float:
    """The delay ``call`` may take from worse-class calls: ``SLOWDOWN`` of its alone time,
    capped by its deadline slack (0 once it is late)."""
    budget = SLOWDOWN * alone_s
    deadline = call.query.deadline
    if deadline is None:
        return budget
    downstream = float(coordinator.downstream_s(call, now))
    share = (deadline - now) * alone_s / max(alone_s + downstream, 1e-9)
    return float(max(0.0, min(budget, share - alone_s)))


def victims(coordinator: Any, queue: InstanceQueue, call: ScheduledCall, now: float
            ) -> list[ScheduledCall]:
    """The running calls on ``queue`` to stop for ``call`` (waiting there, or just started
    there), cheapest to redo first; empty when nothing worse runs or the budget absorbs it."""
    mine = position(coordinator, call)
    worse = [c for c in queue.running
             if c is not call and position(coordinator, c) > mine]
    if not worse:
        return []
    stoppable = sorted((c for c in worse if c.preemptions < MAX_PREEMPTIONS
                        and (not PREFILL_ONLY or c.attained_tokens == 0)),
                       key=lambda c: (redo_s(coordinator, c, queue.name, now), -c.seq))
    if not stoppable:
        return []
    alone = coordinator.expected_s(call, queue.name)
    budget = budget_s(coordinator, call, alone, now)
    if call.state == CallState.RUNNING:
        # the decode seconds each co-runner adds (the slope learned net of prefill stalls:
        # the gate keeps new worse-band prefill off this instance), plus, for one still
        # prefilling, what is left of its prompt: every chunk of it stalls the call's steps
        _, slope, _ = coordinator._batch_coefs(clean=True)
        per = call.mean_output * float(slope[coordinator._index[queue.name]])
        delay = {c: per + prefill_left_s(coordinator, c, queue.name, now) for c in worse}
        excess = sum(delay.values()) - budget
        chosen: list[ScheduledCall] = []
        for victim in stoppable:
            if excess <= 0:
                break
            if NET_SAVING and redo_s(coordinator, victim, queue.name, now) >= delay[victim]:
                continue  # only a victim whose redo costs less than the delay it causes
            chosen.append(victim)
            excess -= delay[victim]
        return chosen
    # waiting: the headroom gate admits a waiting call only in the best band with queries in
    # flight, so stopping work for one in any other band would free a slot it may not take
    best = best_active_band(coordinator)
    if best is not None and call_band(coordinator, call.query) > best:
        return []
    # for the earliest running call to end, unless room is made
    left = {c: remaining_s(coordinator, c, queue.name, now) for c in queue.running}
    wait = min(left.values()) if left else math.inf
    if wait <= budget:
        return []
    if NET_SAVING:  # only a victim whose redo costs less than the wait its stop saves
        stoppable = [c for c in stoppable if redo_s(coordinator, c, queue.name, now) < left[c]]
    spec = queue.spec
    need = coordinator._kv_tokens(call)
    slots, kv = len(queue.running), queue.kv_tokens_in_use
    out: list[ScheduledCall] = []
    for victim in stoppable:
        if slots < spec.max_inflight and (spec.kv_token_budget is None or slots == 0
                                          or kv + need <= spec.kv_token_budget):
            break
        out.append(victim)
        slots -= 1
        kv -= victim.kv_reserved
    fits = slots < spec.max_inflight and (spec.kv_token_budget is None or slots == 0
                                          or kv + need <= spec.kv_token_budget)
    return out if fits else []  # stopping what may be stopped would not make room
