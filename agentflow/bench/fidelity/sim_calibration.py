"""Check the simulated GPU instance against measured vLLM latencies, and time it.

    agentflow bench sim_calibration [--data ../shared/traces/vllm-latency]
                                         [--speed-calls 20000] [--no-speed]

1. Re-fits the calibrated constants (agentflow.sim.calibration.fit_constants) on the
   even-indexed half of the 484 requests and on the odd half, next to the values stored in
   agentflow.hardware.CALIBRATIONS (what the paper-4gpu cluster uses).
2. Per GPU: median and 90th-percentile relative error |sim - measured| / measured on the fit
   half and the held-out half, for
     - sim (calibrated, prompts prefix-cached as in the measurement),
     - sim (stock uncalibrated profile, same replay),
     - sim (calibrated, cold prompts: full prefill computed) — the data hold no prefill,
     - the reference HexGen-Flow rule: decode 0.035 / 0.058 / 0.0545 s per token, without
       prefill and with a prefill a + b * input least-squares fitted on the fit half.
3. Decode step time against batch size (1k-token contexts), next to the reference rule.
4. Speed: a synthetic stream of calls (sizes drawn from the measured requests) over the four
   paper-4gpu instances, driven like the lead's driver (next_event_time / step_until / add),
   wall time on this machine.
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from pathlib import Path

import numpy as np

from agentflow import hardware
from agentflow.bench.paths import SHARED
from agentflow.sim import calibration as cal
from agentflow.sim.engine import SimInstance

DEFAULT_DATA = SHARED / "traces" / "vllm-latency"


def stats(errors: np.ndarray) -> str:
    return f"{np.median(errors) * 100:6.2f}% {np.percentile(errors, 90) * 100:6.2f}%"


def calibration_report(data_dir: Path) -> None:
    data = cal.load_vllm_latency(data_dir)
    n = len(next(iter(data.values())))
    fit_mask, held_mask = cal.split_halves(n)
    model = hardware.paper_model()
    print(f"# Calibration: {n} requests, Llama-3.1-70B w4/kv4, one GPU per instance")
    print(f"fit half = even indices ({fit_mask.sum()}), held-out half = odd ({held_mask.sum()})")
    even = cal.fit_constants(data, fit_mask)
    odd = cal.fit_constants(data, held_mask)
    print(f"step_overhead_s fixed at {even.step_overhead_s * 1e3:.1f} ms (prior, not fitted)")
    print(f"{'GPU':6} {'':22} {'bw_eff':>7} {'attn_bw_eff':>11} {'req_overhead_s':>14}")
    for label in data:
        stored = hardware.calibration_for(hardware.gpu(cal.GPU_LABELS[label]), model)
        for name, c in (("stored (CALIBRATIONS)", stored),
                        ("fit on even half", even.constants[label]),
                        ("fit on odd half", odd.constants[label])):
            print(f"{label:6} {name:22} {c.bw_efficiency:7.3f} {c.attn_bw_efficiency:11.3f} "
                  f"{c.request_overhead_s:14.4f}")
    print()
    print("# Relative error |sim - measured| / measured: median and p90, fit half | held-out half")
    print(f"{'GPU':6} {'predictor':48} {'fit half (med p90)':>18}   {'held-out (med p90)':>18}")
    for label, rows in data.items():
        measured = np.array([r[2] for r in rows])
        stock = hardware.gpu(cal.GPU_LABELS[label])
        preds = {
            "sim, calibrated, prompts cached (as measured)":
                cal.simulate_rows(cal.paper_factory(label), rows),
            "sim, stock profile (uncalibrated), cached":
                cal.simulate_rows(cal.paper_factory(label, use_calibration=False), rows),
            "sim, calibrated, cold prompts (full prefill)":
                cal.simulate_rows(cal.paper_factory(label), rows, prompts_cached=False),
            f"reference: {cal.REFERENCE_DECODE_S[label]} s/token, no prefill":
                cal.reference_latency(label, rows),
        }
        fit_rows = [r for r, keep in zip(rows, fit_mask) if keep]
        a, b = cal.fit_reference_prefill(label, fit_rows)
        preds[f"reference + prefill {a:+.3f} {b * 1e3:+.4f}ms*input (LS)"] = \
            cal.reference_latency(label, rows, (a, b))
        for name, pred in preds.items():
            err = cal.relative_errors(pred, measured)
            print(f"{label:6} {name:48} {stats(err[fit_mask]):>18}   {stats(err[held_mask]):>18}")
        del stock
    print()


def batching_report() -> None:
    model = hardware.paper_model()
    print("# Decode step time (ms) vs batch size, every sequence at a 1,024-token context")
    batches = (1, 8, 32, 128)
    print(f"{'instance':28} " + " ".join(f"{'b=' + str(b):>8}" for b in batches)
          + "   b=128 / b=1   reference (any batch)")
    for label, gname in cal.GPU_LABELS.items():
        inst = SimInstance(hardware.gpu(gname), model)
        ts = [inst.decode_step_time(b, 1024) * 1e3 for b in batches]
        print(f"{gname + ' 70B-w4/kv4':28} " + " ".join(f"{t:8.1f}" for t in ts)
              + f"   {ts[-1] / ts[0]:8.2f}x   {cal.REFERENCE_DECODE_S[label] * 1e3:.1f}")
    inst = SimInstance(hardware.gpu("A100-80G"), model)
    per_tok = [inst.decode_step_time(b, 1024) / b * 1e3 for b in batches]
    print("A100 ms per generated token: " + ", ".join(
        f"b={b}: {t:.2f}" for b, t in zip(batches, per_tok)))
    print()


def speed_report(data_dir: Path, calls: int, rate: float, seed: int = 0) -> None:
    data = cal.load_vllm_latency(data_dir)
    sizes = [(i, o) for i, o, _ in next(iter(data.values()))]
    rnd = random.Random(seed)
    model = hardware.paper_model()
    insts = [SimInstance(hardware.gpu(g), model, max_num_seqs=64, name=n)
             for n, g in hardware.PAPER_4GPU]
    heap: list = []
    version = [0] * len(insts)

    def resched(k: int, now: float) -> None:
        version[k] += 1
        t = insts[k].next_event_time()
        if t is not None:
            heapq.heappush(heap, (max(t, now), 1, k, version[k]))

    t = 0.0
    for c in range(calls):
        t += rnd.expovariate(rate)
        heapq.heappush(heap, (t, 0, c, 0))
    finished = events = wakeups = 0
    lat: list[float] = []
    rr = 0
    start = time.perf_counter()
    while heap:
        now, kind, k, ver = heapq.heappop(heap)
        if kind == 0:
            i, o = rnd.choice(sizes)
            inst = rr % len(insts)
            rr += 1
            insts[inst].add(f"c{k}", i, o, rnd.randint(0, 3), now)
            resched(inst, now)
            continue
        if ver != version[k]:
            continue
        wakeups += 1
        evs = insts[k].step_until(now)
        events += len(evs)
        for e in evs:
            if e.kind == "finished":
                finished += 1
                lat.append(e.queue_s + e.total_s)
        resched(k, now)
    wall = time.perf_counter() - start
    steps = sum(i.steps for i in insts)
    plans = sum(i.plans for i in insts)
    print(f"# Speed: {calls} calls, Poisson {rate}/s round-robin over paper-4gpu "
          f"(max_num_seqs 64), simulated {now:.0f} s")
    print(f"finished {finished}, events {events}, driver wake-ups {wakeups}, "
          f"iterations {steps}, scheduling decisions {plans}, "
          f"preemptions {sum(i.preemptions for i in insts)}")
    print(f"wall {wall:.2f} s -> {steps / wall:,.0f} iterations/s, "
          f"{calls / wall:,.0f} calls/s, {wall / calls * 1e6:.0f} us per call")
    print(f"tokens per iteration {sum(i.tokens_computed for i in insts) / steps:.1f}, "
          f"mean call latency {np.mean(lat):.1f} s (p95 {np.percentile(lat, 95):.1f} s)")


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--speed-calls", "2000")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--speed-calls", type=int, default=20000)
    ap.add_argument("--rate", type=float, default=1.0, help="calls per second (speed test)")
    ap.add_argument("--no-speed", action="store_true")
    args = ap.parse_args(argv)
    calibration_report(args.data)
    batching_report()
    if not args.no_speed:
        speed_report(args.data, args.speed_calls, args.rate)


if __name__ == "__main__":
    main()
