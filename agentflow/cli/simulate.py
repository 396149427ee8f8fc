"""``agentflow simulate``: every listed policy on the same arrivals, on a simulated cluster."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentflow.cli import table_console
from agentflow.metrics import scale_key
from agentflow.scheduler.fast_lane import FAST_LANE_CALLS, parse_fast_lane
from agentflow.scheduler.lengths import LENGTH_MODELS
from agentflow.scheduler.policies import policy_help
from agentflow.scheduler.preemption import AUTO, PREEMPTION_SETTINGS
from agentflow.scheduler.shards import DEFAULT_ROUTE, ROUTES, SUMMARY_S


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="compare scheduling policies on a simulated cluster",
                       description="Replay a trace on a simulated heterogeneous cluster under "
                                   "each policy, with identical arrivals.")
    p.add_argument("--trace", default=None,
                   help="HexGen-Flow JSON or agentflow JSONL trace (default: the demo trace "
                        "that ships with agentflow, databases/demo/trace.jsonl: chess "
                        "queries recorded by agentflow on the demo database)")
    p.add_argument("--format", choices=["auto", "hexgen", "agentflow"], default="auto",
                   help="trace format: HexGen-Flow JSON, agentflow JSONL, or auto (default: "
                        "by content)")
    p.add_argument("--cluster", default="paper-4gpu", help="a name (paper-4gpu, ...) or YAML")
    p.add_argument("--policy", default="vllm,hexgen-flow,sagesched,flowsage",
                   help="comma-separated policies; " + policy_help().replace("%", "%%"))
    # --predictor: the flag's earlier name, still accepted
    p.add_argument("--length-model", "--predictor", dest="length_model", default=None,
                   choices=list(LENGTH_MODELS),
                   help="length model for every listed policy that names none (e.g. "
                        "--length-model oracle runs each policy with true lengths)")
    p.add_argument("--rate", type=float, default=1.0, help="mean arrival rate, queries/s")
    p.add_argument("--arrival", default="poisson",
                   help="poisson | gamma:CV | steps:RATE/SECONDS,RATE/SECONDS,...")
    p.add_argument("--queries", type=int, default=200,
                   help="number of queries to replay (default 200; the trace is cycled); "
                        "with --tenant, per tenant")
    p.add_argument("--tenant", action="append", default=[], type=_tenant,
                   metavar="NAME:RATE:SLO_SECONDS[:CLASS[:WEIGHT]]",
                   help="a tenant sharing the cluster (repeatable): its own arrivals at RATE "
                        "q/s (seed derived from --seed and NAME), deadline SLO_SECONDS "
                        "('none': its class's default) and SLO class (interactive, "
                        "standard, batch) and share WEIGHT among the tenants of its class "
                        "rank (default 1; 2 gets twice the instance time of 1 while both "
                        "wait); replaces --rate; per-tenant metrics in the JSON under "
                        "policies[P].tenants")
    p.add_argument("--deadline-admission", choices=("off", "reject", "batch"), default="off",
                   help="refuse (reject: would_miss_deadline) or move to batch a query whose "
                        "remaining critical path cannot meet its deadline at the current "
                        "load (default off)")
    p.add_argument("--preemption", choices=PREEMPTION_SETTINGS, default=AUTO,
                   help="stop running lower-class calls for a better class's call (class), "
                        "and over-share tenants' calls for an in-share tenant's (fair); "
                        "auto: fair under the flowsage queue, else off "
                        "(scheduler.preemption; default auto, as in serving)")
    p.add_argument("--fast-lane", type=parse_fast_lane, default=FAST_LANE_CALLS,
                   metavar="N|off",
                   help="on the fastest instance, a tenant outranked by a present one runs "
                        "at most N calls at once (scheduler.fast_lane; default "
                        f"{FAST_LANE_CALLS}, as in serving; off: never held)")
    p.add_argument("--coordinators", type=_shards, default=1, metavar="K",
                   help="split the instances into K shards, each with its own coordinator "
                        "(a share of every GPU kind each), and route each query to one "
                        "(scheduler.shards; default 1: one coordinator)")
    p.add_argument("--shard-route", choices=ROUTES, default=DEFAULT_ROUTE,
                   help="how a query picks its shard with --coordinators > 1: p2c (default: "
                        "the less loaded of two drawn shards, by load summaries at most "
                        f"{SUMMARY_S:g} s old), least (the least loaded of all), hash (the "
                        "query id, no load read)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed for arrivals and sampling; same seed, same result (default 0)")
    p.add_argument("--slo-scale", type=float, default=2.0,
                   help="deadline given to the scheduler, as a multiple of idle latency "
                        "(see --deadline)")
    p.add_argument("--deadline", choices=("fixed", "idle-scaled"), default="fixed",
                   help="fixed (default): one SLO per pipeline, as serving's slo_seconds: "
                        "--slo-scale x the pipeline's mean idle latency over the trace; "
                        "idle-scaled: --slo-scale x each query's own idle latency")
    p.add_argument("--alpha", type=float, default=None, help="fixed workload_balanced alpha")
    p.add_argument("--cached-prefix", type=_cached_prefix, default=0.0,
                   help="fraction of each prompt served from a prefix cache (default 0: "
                        "cold prompts), or 'auto': model each instance's automatic prefix "
                        "cache (LRU over 16-token blocks) from the prompts' text — agentflow "
                        "traces only; HexGen-Flow traces have no text and run cold")
    p.add_argument("--tune-alpha", action="store_true",
                   help="re-tune alpha online from forked simulations of the recent window")
    p.add_argument("--fault", action="append", default=[], metavar="KIND:INSTANCE@T",
                   help="inject a fault (repeatable): down:NAME@SECONDS, up:NAME@SECONDS, "
                        "slow:NAME@SECONDSxFACTOR; instances are named <gpu>-<n> "
                        "(e.g. a100-80g-0)")
    p.add_argument("--goodput", action="store_true",
                   help="also find each policy's goodput (>= 90%% within --slo-scale)")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run the policies (with their goodput searches) as Ray tasks: a "
                        "cluster address (auto, HOST:6379, ray://HOST:10001) or 'local' "
                        "(the default without a value). Same numbers as the serial run")
    p.add_argument("--json", type=Path, default=None,
                   help="also write every policy's metrics to this JSON file")
    p.add_argument("--plot", type=Path, default=None, help="SLO attainment vs scale (PNG)")
    p.add_argument("--compiled", action="store_true",
                   help="run on the mypyc-compiled copy of the simulator's hot modules "
                        "(agentflow.compiled; built into its cache first if needed; the "
                        "same results)")
    p.set_defaults(func=cmd_simulate, simulate_parser=p)
    steps = p.add_subparsers(dest="simulate_command", metavar="SUBCOMMAND",
                             title="subcommands")
    from agentflow.cli import step as step_cli

    step_cli.register(steps)


def _tenant(value: str) -> Any:
    from agentflow.sim.workload import TenantSpec

    try:
        return TenantSpec.parse(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _shards(value: str) -> int:
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of shards, got "
                                         f"{value!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"the number of shards must be >= 1, got {k}")
    return k


def _cached_prefix(value: str) -> float | str:
    if value == "auto":
        return value
    try:
        frac = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1) or 'auto', got "
                                         f"{value!r}") from None
    if not 0.0 <= frac < 1.0:
        raise argparse.ArgumentTypeError(f"fraction must be in [0, 1), got {frac}")
    return frac


def cmd_simulate(args: argparse.Namespace) -> int:
    from agentflow.distributed import require_ray
    from agentflow.distributed.grid import run_grid_timed
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.experiment import build_workload
    from agentflow.sim.slo import IdleLatency
    from agentflow.sim.workload import load_trace

    console = Console(stderr=True)
    if args.compiled:  # the same command in a child whose hot modules are the compiled copy
        import sys

        from agentflow import compiled

        rest = [a for a in sys.argv[1:] if a != "--compiled"]
        try:
            return compiled.run_module("agentflow", rest)
        except compiled.CompileError as err:
            console.print(f"agentflow simulate --compiled: {err}", highlight=False)
            return 2
    if args.trace is None:
        from agentflow.datasets.demo import TRACE_FILE

        if not TRACE_FILE.is_file():
            args.simulate_parser.error(f"no --trace given and the shipped demo trace is not "
                                       f"here ({TRACE_FILE}): give --trace FILE")
        args.trace = str(TRACE_FILE)
        console.print(f"no --trace: replaying the demo trace {TRACE_FILE}", highlight=False)
    if args.ray is not None:
        try:
            require_ray()
        except ImportError as err:
            console.print(f"agentflow: error: {err}", highlight=False)
            return 2
    from agentflow.sim.faults import Fault

    cluster = load_cluster(args.cluster)
    if args.coordinators > 1:
        from agentflow.scheduler.shards import check_shards

        try:
            check_shards(args.coordinators, len(cluster.expanded()))
        except ValueError as err:
            args.simulate_parser.error(str(err))
        if args.tune_alpha:
            args.simulate_parser.error("--tune-alpha forks one coordinator; it does not run "
                                       "with --coordinators > 1")
    faults = [Fault.parse(f) for f in args.fault]
    trace = load_trace(args.trace, args.format)
    from agentflow.scheduler.policies import parse_policy, with_length_model

    policies = [with_length_model(p.strip(), args.length_model)
                for p in args.policy.split(",") if p.strip()]
    from agentflow.scheduler.preemption import check_preemption

    for policy in policies:
        parse_policy(policy)  # a bad name fails before any simulation runs
        check_preemption(args.preemption, policy)  # and preemption where it cannot act
    idle = IdleLatency(cluster, cached_prefix=args.cached_prefix)
    if args.tenant:
        from agentflow.sim.experiment import build_tenant_workload
        from agentflow.slo_classes import resolve_class

        try:
            for spec in args.tenant:
                resolve_class(spec.slo_class)
            workload = build_tenant_workload(trace, cluster, args.tenant, n=args.queries,
                                             arrival=args.arrival, seed=args.seed, idle=idle)
        except ValueError as err:
            args.simulate_parser.error(str(err))
    else:
        workload = build_workload(trace, cluster, n=args.queries, rate=args.rate,
                                  arrival=args.arrival, seed=args.seed, idle=idle)
    context = PolicyCellInputs(cluster=cluster, trace=trace, workload=workload, idle=idle,
                               faults=faults, options=_cell_options(args))
    grid = run_grid_timed(policy_cell, policies, context=context, ray=args.ray,
                          on_result=lambda i, s: console.print(
                              f"  {policies[i]}: done in {s['sim_wall_s']:.1f}s",
                              highlight=False))
    results = dict(zip(policies, grid.results))
    console.print(f"  {len(policies)} policies in {grid.wall_s:.1f}s ({grid.where})",
                  highlight=False)
    out = {"config": {"trace": str(args.trace), "cluster": cluster.name,
                      "rate": args.rate, "arrival": args.arrival, "queries": args.queries,
                      "seed": args.seed, "slo_scale": args.slo_scale,
                      "deadline": args.deadline, "alpha": args.alpha,
                      "cached_prefix": args.cached_prefix, "faults": args.fault,
                      "tune_alpha": args.tune_alpha},
           "policies": results}
    if args.tenant:  # only then: a run without tenants writes what it always wrote
        out["config"]["tenants"] = [vars(t) for t in args.tenant]
        out["config"]["deadline_admission"] = args.deadline_admission
    elif args.deadline_admission != "off":
        out["config"]["deadline_admission"] = args.deadline_admission
    if args.preemption != AUTO:  # the default is not written: runs write what they wrote
        out["config"]["preemption"] = args.preemption
    if args.fast_lane != FAST_LANE_CALLS:
        out["config"]["fast_lane"] = args.fast_lane
    if args.coordinators > 1:  # one coordinator writes what it always wrote
        out["config"]["coordinators"] = args.coordinators
        out["config"]["shard_route"] = args.shard_route
    print_table(table_console(140), out)
    if args.tenant:
        print_tenant_table(table_console(140), out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        clean = json.loads(json.dumps(out))
        for s in clean["policies"].values():
            s.pop("sim_wall_s", None)  # wall time differs run to run; the rest is exact
        args.json.write_text(json.dumps(clean, indent=2, sort_keys=True))
    if args.plot:
        from agentflow.sim.plots import plot_attainment

        plot_attainment(results, args.plot, title=f"{cluster.name}, {args.rate:g} q/s "
                                                  f"({args.arrival})")
        console.print(f"plot: {args.plot}", highlight=False)
    if args.json:
        console.print(f"metrics: {args.json}", highlight=False)
    return 0


@dataclass
class PolicyCellInputs:
    """What every policy's simulation shares (sent once to a Ray cluster)."""

    cluster: Any
    trace: list
    workload: Any
    idle: Any
    options: dict[str, Any]
    faults: list = field(default_factory=list)


def _cell_options(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in ("slo_scale", "alpha", "tune_alpha", "cached_prefix",
                                          "goodput", "queries", "arrival", "seed",
                                          "deadline", "deadline_admission", "preemption",
                                          "fast_lane", "coordinators", "shard_route")}


def policy_cell(policy: str, inputs: PolicyCellInputs) -> dict[str, Any]:
    """One policy on the shared workload (and its goodput search): one cell of the grid,
    the same computation whether it runs here or as a Ray task."""
    from agentflow.sim.alpha import OnlineAlphaTuner
    from agentflow.sim.experiment import goodput, run_policy

    o = inputs.options
    start = time.perf_counter()
    tuner = OnlineAlphaTuner(inputs.cluster, slo_scale=o["slo_scale"]) \
        if o["tune_alpha"] else None
    result = run_policy(inputs.cluster, inputs.workload, policy, slo_scale=o["slo_scale"],
                        alpha=o["alpha"], alpha_tuner=tuner, cached_prefix=o["cached_prefix"],
                        faults=inputs.faults, deadline=o["deadline"],
                        **_scheduler_options(o))
    summary = result.summary()
    summary["sim_wall_s"] = time.perf_counter() - start
    if result.alpha_history:
        summary["alpha_history"] = result.alpha_history
    if o["goodput"]:
        summary["goodput_qps"] = goodput(inputs.cluster, inputs.trace, policy, n=o["queries"],
                                         slo_scale=o["slo_scale"], arrival=o["arrival"],
                                         seed=o["seed"], idle=inputs.idle,
                                         cached_prefix=o["cached_prefix"],
                                         deadline=o["deadline"], **_shard_options(o))
    return summary


def _scheduler_options(o: dict[str, Any]) -> dict[str, Any]:
    """``Simulation`` settings beyond the defaults (none unless asked: unchanged runs)."""
    mode = o.get("deadline_admission", "off")
    out = {} if mode == "off" else {"deadline_admission": mode}
    if o.get("preemption", AUTO) != AUTO:  # off too: the simulator's default is auto
        out["preemption"] = o["preemption"]
    if o.get("fast_lane", FAST_LANE_CALLS) != FAST_LANE_CALLS:
        out["fast_lane"] = o["fast_lane"]
    if o.get("coordinators", 1) > 1:
        out["coordinators"] = o["coordinators"]
        out["shard_route"] = o.get("shard_route", DEFAULT_ROUTE)
    return out


def _shard_options(o: dict[str, Any]) -> dict[str, Any]:
    """The sharding settings alone (the goodput search runs the same coordinators)."""
    if o.get("coordinators", 1) <= 1:
        return {}
    return {"coordinators": o["coordinators"], "shard_route": o.get("shard_route",
                                                                    DEFAULT_ROUTE)}


def print_tenant_table(console: Console, out: dict) -> None:
    table = Table(title="per tenant")
    for c in ("policy", "tenant", "done", "rej", "p50 s", "p95 s", "p99 s", "q/s",
              "in deadline"):
        table.add_column(c, justify="right")
    for policy, s in out["policies"].items():
        for name, t in s.get("tenants", {}).items():
            def f(v, d=1):
                return "-" if v is None else f"{v:.{d}f}"
            table.add_row(policy, name, f"{t['completed']}/{t['queries']}", str(t["rejected"]),
                          f(t["p50"]), f(t["p95"]), f(t["p99"]), f(t["throughput_qps"], 3),
                          f(t["deadline_attainment"], 2))
    console.print(table)


def print_table(console: Console, out: dict) -> None:
    table = Table(title=f"{out['config']['cluster']} at {out['config']['rate']:g} q/s, "
                        f"{out['config']['queries']} queries ({out['config']['arrival']})")
    cols = ["policy", "done", "rej", "mean s", "p50 s", "p95 s", "p99 s", "q/s",
            "SLO@1", "SLO@2", "SLO@5"]
    has_goodput = any("goodput_qps" in s for s in out["policies"].values())
    if has_goodput:
        cols.append("goodput q/s")
    for c in cols:
        table.add_column(c, justify="right")
    for policy, s in out["policies"].items():
        def f(v, d=1):
            return "-" if v is None else f"{v:.{d}f}"
        row = [policy, str(s["completed"]), str(s["rejected"]), f(s["mean"]), f(s["p50"]),
               f(s["p95"]), f(s["p99"]), f(s["throughput_qps"], 3),
               *(f(s["slo_attainment"].get(scale_key(x)), 2) for x in (1, 2, 5))]
        if has_goodput:
            row.append(f(s.get("goodput_qps"), 3))
        table.add_row(*row)
    console.print(table)
