"""Where real_vs_sim's error lives: each call's latency split into queue, prefill and decode
on both sides, summed by how many calls were in flight on its instance.

Why: a median error says the simulator is off, not where. A call's latency is the wait
before its prompt starts (a slot, or a prompt batch ahead of it), the prompt's processing,
and the decode of its output; the simulator models each with a different part of its engine
(admission, chunked prefill, batched decode steps), so the phase that disagrees names the
part to fix. Splitting by concurrency separates engine physics (one call alone) from how the
engine shares a step among calls.

Real side, from the caller's clock and the engine's own account (llama-server's ``timings``
on the last streamed chunk): prefill = ``prompt_ms``, decode = ``predicted_ms``, queue =
submit -> last token minus both (HTTP, tokenisation, waiting for a slot or for the prompt
batch in flight). Without engine timings: queue 0, prefill = submit -> first token, decode =
the rest. Simulated side, from the engine's events: queue = ``queue_s``, prefill = ``ttft_s``
(start of the prompt to the first token), decode = ``total_s - ttft_s``.

Note the one difference of definition: llama-server's ``prompt_ms`` ends when the prompt's
last batch is computed, and its first token is sampled from it, so its "prefill" equals the
simulator's ``ttft_s`` (which also ends at the first token); its ``predicted_ms`` counts
from the first token on, as the simulator's decode does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PHASES = ("queue", "prefill", "decode")


@dataclass(frozen=True)
class Split:
    """One call's latency in seconds, by phase."""

    queue: float
    prefill: float
    decode: float

    @property
    def total(self) -> float:
        return self.queue + self.prefill + self.decode


def real_split(latency_s: float, ttft_s: float, timings: dict[str, Any] | None) -> Split:
    """The caller's latency split with the engine's timings where it sent them."""
    if timings and "prompt_ms" in timings and "predicted_ms" in timings:
        prefill = float(timings["prompt_ms"]) / 1000
        decode = float(timings["predicted_ms"]) / 1000
        return Split(max(0.0, latency_s - prefill - decode), prefill, decode)
    return Split(0.0, ttft_s, max(0.0, latency_s - ttft_s))


def sim_split(queue_s: float, ttft_s: float, total_s: float) -> Split:
    return Split(queue_s, ttft_s, max(0.0, total_s - ttft_s))


def calls_by_instance(instance_of: dict[str, str]) -> dict[str, list[str]]:
    """Call ids grouped by the instance that ran them (in ``instance_of``'s order)."""
    out: dict[str, list[str]] = {}
    for cid, inst in instance_of.items():
        out.setdefault(inst, []).append(cid)
    return out


def in_flight_at_submit(submit: dict[str, float], finish: dict[str, float],
                        instance_of: dict[str, str]) -> dict[str, int]:
    """For each call, the calls in flight on its instance when it was submitted, itself
    included (1 = it ran alone at its start)."""
    out = {}
    for ids in calls_by_instance(instance_of).values():
        for cid in ids:
            t = submit[cid]
            out[cid] = sum(1 for o in ids if submit[o] <= t < finish[o])
    return out


def concurrency_bin(n: int) -> str:
    return str(n) if n < 4 else "4+"


def breakdown(real: dict[str, Split], sim: dict[str, Split], conc: dict[str, int]
              ) -> dict[str, Any]:
    """Per concurrency bin and overall: calls, and per phase the real and simulated sums
    (s) and the share of the total absolute error each phase carries."""
    bins: dict[str, list[str]] = {}
    for cid, n in conc.items():
        bins.setdefault(concurrency_bin(n), []).append(cid)
    out: dict[str, Any] = {}
    for label in sorted(bins, key=lambda b: (len(b), b)) + ["all"]:
        ids = list(conc) if label == "all" else bins[label]
        row: dict[str, Any] = {"calls": len(ids)}
        err_total = 0.0
        for phase in PHASES:
            r = float(sum(getattr(real[i], phase) for i in ids))
            s = float(sum(getattr(sim[i], phase) for i in ids))
            err = float(sum(abs(getattr(sim[i], phase) - getattr(real[i], phase))
                            for i in ids))
            row[phase] = {"real_s": r, "sim_s": s, "abs_err_s": err}
            err_total += err
        for phase in PHASES:
            row[phase]["error_share"] = row[phase]["abs_err_s"] / err_total if err_total else 0.0
        rl = np.array([real[i].total for i in ids])
        sl = np.array([sim[i].total for i in ids])
        row["median_call_error"] = float(np.median(np.abs(sl - rl) / rl))
        out[label] = row
    return out


def print_breakdown(table: dict[str, Any]) -> None:
    print("where the error is (sums over calls, s; in flight = calls on the instance at "
          "submit, itself included):")
    print(f"{'in flight':>9} {'calls':>5} {'med err':>7}  " + "  ".join(
        f"{p + ' real/sim':>18} {'share':>5}" for p in PHASES))
    for label, row in table.items():
        cells = "  ".join(f"{row[p]['real_s']:8.1f}/{row[p]['sim_s']:<9.1f} "
                          f"{row[p]['error_share'] * 100:4.0f}%" for p in PHASES)
        print(f"{label:>9} {row['calls']:5d} {row['median_call_error'] * 100:6.1f}%  {cells}")


def per_call_records(ids: list[str], real: dict[str, Split], sim: dict[str, Split],
                     conc: dict[str, int], timings: dict[str, dict[str, Any] | None]
                     ) -> list[dict[str, Any]]:
    """What the --json keeps per call."""
    return [{"id": i, "in_flight": conc[i], "real": asdict(real[i]), "sim": asdict(sim[i]),
             "engine_timings": timings.get(i)} for i in ids]
