"""Does online alpha tuning earn its keep? Fluctuating load, hexgen-flow and flowsage.

    agentflow bench alpha_tuning [--trace FILE] [--queries 400] [--low 0.015 --high 0.045]

Arrivals step between a low and a high rate (``steps:LOW/D,HIGH/D``). Each preset runs with
alpha tuned online (forked replays of the last ``--window`` seconds, every ``--window``
seconds, grid 0..1 by 0.25), with every fixed alpha of the grid, and the best fixed alpha is
reported next to alpha=0 — P95 and SLO attainment side by side, same arrivals.
"""

from __future__ import annotations

import argparse

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.metrics import scale_key
from agentflow.sim.alpha import DEFAULT_GRID, OnlineAlphaTuner
from agentflow.sim.cluster import load_cluster
from agentflow.sim.experiment import build_workload, run_policy
from agentflow.sim.slo import IdleLatency
from agentflow.sim.workload import load_hexgen

TRACE = HEXGEN_TRACES / \
    "trace1.json"


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ("--queries", "100")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--cluster", default="paper-4gpu")
    p.add_argument("--queries", type=int, default=400)
    p.add_argument("--low", type=float, default=0.015)
    p.add_argument("--high", type=float, default=0.045)
    p.add_argument("--segment", type=float, default=2400.0, help="seconds per rate step")
    p.add_argument("--window", type=float, default=600.0)
    p.add_argument("--slo-scale", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    cluster = load_cluster(args.cluster)
    idle = IdleLatency(cluster)
    arrival = f"steps:{args.low}/{args.segment},{args.high}/{args.segment}"
    wl = build_workload(load_hexgen(args.trace), cluster, n=args.queries, rate=1.0,
                        arrival=arrival, seed=args.seed, idle=idle)
    s = scale_key(args.slo_scale)
    print(f"arrivals {arrival}, {args.queries} queries, deadlines {args.slo_scale:g}x "
          "the pipeline's mean idle latency")
    print(f"{'preset':<12} {'alpha':<10} {'P95 s':>8} {'mean s':>8} {'SLO@' + s:>8}")
    for preset in ("hexgen-flow", "flowsage"):
        fixed = {}
        for alpha in DEFAULT_GRID:
            fixed[alpha] = run_policy(cluster, wl, preset, slo_scale=args.slo_scale,
                                      alpha=alpha).summary()
        tuner = OnlineAlphaTuner(cluster, every_s=args.window, window_s=args.window,
                                 slo_scale=args.slo_scale)
        tuned = run_policy(cluster, wl, preset, slo_scale=args.slo_scale, alpha_tuner=tuner)
        best = min(fixed, key=lambda a: fixed[a]["p95"])
        rows = [("tuned", tuned.summary()), (f"best={best}", fixed[best]), ("0.0", fixed[0.0])]
        rows += [(f"{a}", fixed[a]) for a in DEFAULT_GRID if a not in (0.0, best)]
        for label, m in rows:
            print(f"{preset:<12} {label:<10} {m['p95']:>8.1f} {m['mean']:>8.1f} "
                  f"{m['slo_attainment'][s]:>8.2f}")
        chosen = [a for _, a in tuned.alpha_history]
        print(f"{preset:<12} tuned alphas over time: {chosen}")
        t = tuned.summary()["p95"]
        print(f"{preset:<12} P95 ratios: best fixed / tuned = {fixed[best]['p95'] / t:.2f}x, "
              f"alpha=0 / tuned = {fixed[0.0]['p95'] / t:.2f}x")


if __name__ == "__main__":
    main()
