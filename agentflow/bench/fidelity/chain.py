"""Why a query's end-to-end latency is off: its critical chain, phase by phase, and the order
each instance served its calls in, real against simulated.

Why: the per-call table (``attribution.py``) says which phase is off on average; a query's
error is what its own chain of calls adds up, and a late query's chain also waits behind
other queries' calls. A query's latency is exactly the sum of the latencies of the calls on
its critical chain (walk back from its last call to finish, each time to the parent that
finished last: a call is submitted the moment its last parent finishes, on both sides), so
the difference sim - real splits exactly into the chains' queue, prefill and decode sums.
Each side has its own chain (the simulator may finish a different parent last), so each is
walked on its own side's clock.

The order of service: on each instance, two calls that were both waiting or running at once
were started (prompt begun) in some order; a pair the simulator starts in the other order
than the real server is a scheduling disagreement, not a speed error. The real start is the
last token minus the engine's ``prompt_ms + predicted_ms``; the simulated one is the
submit plus the simulated queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentflow.bench.fidelity.attribution import PHASES, Split, calls_by_instance


@dataclass(frozen=True)
class ChainSplit(Split):
    """A query's critical chain on one side: its calls' phase sums (s), and the calls."""

    calls: tuple[str, ...] = ()


def critical_chain(last_calls: list[str], parents: dict[str, tuple[str, ...]],
                   finish: dict[str, float]) -> list[str]:
    """From the query's call that finished last back to a root, each step to the parent that
    finished last; returned root first."""
    cid = max(last_calls, key=lambda c: finish[c])
    chain = [cid]
    while parents[cid]:
        cid = max(parents[cid], key=lambda c: finish[c])
        chain.append(cid)
    return chain[::-1]


def chain_split(chain: list[str], split: dict[str, Split]) -> ChainSplit:
    return ChainSplit(*(sum(getattr(split[c], p) for c in chain) for p in PHASES),
                      calls=tuple(chain))


def start_times(submit: dict[str, float], split: dict[str, Split]) -> dict[str, float]:
    """When each call's prompt began: submit plus its queue phase (both sides define the
    queue as submit to prompt start)."""
    return {c: submit[c] + split[c].queue for c in split}


# Real starts closer than this are not told apart: the start is inferred from the caller's
# clock and the engine's timings, which leave out a few ms of HTTP on either side.
MIN_GAP_S = 0.05


def order_disagreements(instance_of: dict[str, str], real_submit: dict[str, float],
                        real_start: dict[str, float], sim_submit: dict[str, float],
                        sim_start: dict[str, float], min_gap_s: float = MIN_GAP_S
                        ) -> dict[str, tuple[int, int]]:
    """Per instance, (pairs of calls both waiting at once on the real side, started more
    than ``min_gap_s`` apart there and submitted in the same order on both sides; of those,
    pairs the simulator started in the other order). Only pairs the real server had a choice
    over count (a call submitted after the other started had none), and only pairs that
    reached both engines in the same order: a pair whose parents finished the other way
    round in the simulator is a speed difference upstream, not an order of service."""
    out = {}
    for inst, ids in calls_by_instance(instance_of).items():
        ids = sorted(ids, key=lambda c: real_start[c])
        pairs = flipped = 0
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                if real_submit[b] >= real_start[a] or \
                        real_start[b] - real_start[a] <= min_gap_s:
                    continue  # no choice was made, or none that can be told apart
                if (sim_submit[a] <= sim_submit[b]) != (real_submit[a] <= real_submit[b]):
                    continue  # arrived the other way round in the simulator
                pairs += 1
                if sim_start[b] < sim_start[a]:
                    flipped += 1
        out[inst] = (pairs, flipped)
    return out


def print_worst_queries(w: Any, real_submit: dict[str, float], real_finish: dict[str, float],
                        real_split: dict[str, Split], sim: Any, worst: int = 5) -> None:
    """The ``worst`` queries by |error|: arrival, latencies and the chain's phase
    differences (sim - real, s); then the order-of-service disagreements per instance.
    ``w`` is real_vs_sim's Workload, ``sim`` its simulated Outcome."""
    parents = {c.id: c.parents for cs in w.calls for c in cs}
    instance_of = {c.id: c.instance for cs in w.calls for c in cs}
    rows = []
    for q, calls in enumerate(w.calls):
        ids = [c.id for c in calls]
        real = max(real_finish[i] for i in ids) - w.arrivals[q]
        rows.append((abs(sim.query_latency(w, q) - real) / real, q, real))
    print("worst queries: latency, and their critical chains' phase sums, sim - real (s)")
    print(f"{'query':>5} {'arrives':>7} {'real_s':>7} {'sim_s':>7} {'chain r/s':>9} "
          f"{'queue':>6} {'prefill':>7} {'decode':>7}")
    for _, q, real in sorted(rows, reverse=True)[:worst]:
        ids = [c.id for c in w.calls[q]]
        rc = chain_split(critical_chain(ids, parents, real_finish), real_split)
        sc = chain_split(critical_chain(ids, parents, sim.finish), sim.split)
        print(f"{q:5d} {w.arrivals[q]:7.0f} {real:7.1f} "
              f"{sim.query_latency(w, q):7.1f} {len(rc.calls):4d}/{len(sc.calls):<4d} "
              f"{sc.queue - rc.queue:+6.1f} {sc.prefill - rc.prefill:+7.1f} "
              f"{sc.decode - rc.decode:+7.1f}")
    flips = order_disagreements(instance_of, real_submit, start_times(real_submit, real_split),
                                sim.submit, start_times(sim.submit, sim.split))
    print("order of service: of the pairs that waited together on the real side (started "
          f"> {MIN_GAP_S * 1e3:.0f} ms apart) and arrived in the same order on both, the "
          "simulator started the other way round " + ", ".join(
              f"{n} {f}/{p}" for n, (p, f) in sorted(flips.items())))
