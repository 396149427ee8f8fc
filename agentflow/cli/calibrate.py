"""``agentflow calibrate --cluster FILE``: fit this host's profile of the cluster's local
instances and store it, so the simulator times them as this machine runs them.

For every ``(profile, model)`` of the cluster's local instances (``llama_server`` backends:
their hardware is this host) it times single requests over a grid of prompt and output
lengths, batches of equal requests between lone ones, and a decode joined by a prompt, on
every such instance at once, as the cluster serves (``--one-at-a-time``: one after another;
``agentflow.sim.host_calibration``, the same measurements as ``real_vs_sim --calibrate``),
with a fixed speed probe before and after each instance's rows whose CPU seconds are stored
with the fit (a replay times it again to match its load to the calibration's), fits the
profile's efficiencies and
overheads on all of their rows, and stores the fit keyed by this host's CPU model (and GPU
model / driver: ``agentflow.sim.host_profiles``). The rows price a core beside busy
neighbours; after them the same probe is timed on each instance alone and beside the others
busy (``--corun-rounds``, ``host_calibration.measure_corun``) and the median ratio is stored
as the host's co-run factor, which the simulator applies while a local engine's neighbours
are idle (``agentflow.sim.host_corun``). Instances on other machines (``openai``
backends) are listed and skipped: their hardware is not this host's.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentflow.config import InstanceConfig


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="fit and store this host's profile of a cluster's "
                       "local instances",
                       description="Time the cluster's local (llama_server) instances on "
                       "single and batched requests, fit their hardware profile, and store "
                       "it for this host's CPU (and GPU); the simulator then times local "
                       "instances with it.")
    p.add_argument("--cluster", required=True, help="cluster file (as serve --config reads)")
    p.add_argument("--repeats", type=int, default=2, help="rounds of the timing grid (2)")
    p.add_argument("--instances", help="comma-separated instance names to time (default: "
                   "every local instance)")
    p.add_argument("--wall-clock", dest="cpu_clock", action="store_false",
                   help="time the rows on the wall clock, scaled to a dedicated core by the "
                   "share of its core each server got over each row (default: on each "
                   "server's own CPU clock, /proc/<pid>/task/*/schedstat, which other "
                   "work on the machine does not stretch)")
    p.add_argument("--no-cpu-share", dest="cpu_share", action="store_false",
                   help="with --wall-clock: fit the wall times as measured, not scaled by "
                   "the share")
    p.add_argument("--one-at-a-time", dest="together", action="store_false",
                   help="time the instances one after another (default: all at once, as the "
                   "cluster serves: a core beside busy neighbours costs more CPU seconds per "
                   "unit of work than one timed alone, where cores share caches, memory or "
                   "a physical core)")
    p.add_argument("--corun-rounds", type=int, default=2, metavar="N",
                   help="after the rows, time the speed probe on each instance alone and "
                   "beside the others busy, N alternating rounds, and store the median "
                   "alone/beside ratio as the host's co-run factor (cpu_alone_factor: the "
                   "simulator prices a local engine's work at it while its neighbours are "
                   "idle); 0 skips it (factor 1). Default 2; not with --one-at-a-time")
    p.add_argument("--tries", type=int, default=1, metavar="N",
                   help="calibrate again while the speed probe moved more than 10%% within "
                   "a try, at most N tries in all (default 1); the fit is the last try's "
                   "rows, and every try's probes are kept: each instance's speed reference "
                   "is the median of all of them (the machine's typical speed, not the calm "
                   "phase a stable try caught), and the co-run factor the median over every "
                   "try's pairs")
    p.add_argument("--single-only", dest="fit_batched", action="store_false",
                   help="fit on single requests only (default: the batched rows too)")
    p.add_argument("--tokenizer", help="a .gguf file or Hugging Face tokenizer for the prompts "
                   "(default: the served model's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts (0)")
    p.add_argument("--json", help="also write the measured rows and the fit to this file")
    p.add_argument("--refit", metavar="JSON",
                   help="no engines: fit the rows an earlier --json saved again (a change of "
                   "the fit checked, or stored, on measurements already taken)")
    p.add_argument("--dry-run", action="store_true",
                   help="fit and print, but do not store")
    p.set_defaults(func=cmd_calibrate)


def local_groups(cluster_path: str, only: set[str] | None
                 ) -> tuple[dict[tuple[str, str], list[tuple[str, InstanceConfig]]], list[str]]:
    """The cluster's local instances grouped by (profile, model), and the names skipped."""
    from agentflow.sim.cluster import load_cluster

    groups: dict[tuple[str, str], list[tuple[str, InstanceConfig]]] = {}
    skipped = []
    names = []
    for name, cfg in load_cluster(cluster_path).expanded():
        names.append(name)
        if only is not None and name not in only:
            continue
        if (cfg.backend or {}).get("type") != "llama_server":
            skipped.append(name)
            continue
        groups.setdefault((str(cfg.gpu), str(cfg.model)), []).append((name, cfg))
    if only is not None and only - set(names):
        raise ValueError(f"no instance {sorted(only - set(names))} in {cluster_path}; it has "
                         f"{', '.join(names)}")
    return groups, skipped


def cmd_calibrate(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from agentflow import hardware
    from agentflow.sim import host_calibration as calib
    from agentflow.sim import host_profiles
    from agentflow.sim.engine import engine_for

    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if args.corun_rounds < 0:
        raise ValueError("--corun-rounds must be >= 0")
    if args.tries < 1:
        raise ValueError("--tries must be >= 1")
    only = set(args.instances.split(",")) if args.instances else None
    groups, skipped = local_groups(args.cluster, only)
    for name in skipped:
        print(f"skipped {name}: not a local instance (its hardware is not this host's)")
    if not groups:
        raise ValueError(f"{args.cluster}: no local (llama_server) instance to calibrate")
    host = host_profiles.this_host()
    print(f"# host: {host.describe()}; load {os.getloadavg()[0]:.1f}")
    measure_args = argparse.Namespace(cluster=args.cluster, tokenizer=args.tokenizer,
                                      seed=args.seed, repeats=args.repeats,
                                      cpu_clock=args.cpu_clock,
                                      corun_rounds=args.corun_rounds if args.together
                                      else 0)
    saved: dict[str, dict] = {}
    for (base, model_name), members in groups.items():
        rows: list[tuple] = []
        batched: list[tuple] = []
        joined: list[tuple] = []
        probes: list[float] = []
        corun: list[tuple[float, float]] = []
        instance_probes: dict[str, list[float]] = {}
        tries: list[dict] = []
        if args.refit:
            key = f"{base} / {model_name}"
            try:
                old = json.loads(Path(args.refit).read_text())[key]
            except KeyError:
                raise ValueError(f"{args.refit}: no rows of {key}") from None
            rows = [tuple(r) for r in old["rows"]]
            batched = [tuple(r) for r in old["batched"]]
            joined = [tuple(r) for r in old["joined"]]
            if old.get("speed_probe_shapes") and tuple(map(tuple, old["speed_probe_shapes"])) \
                    == calib.SPEED_PROBE and old.get("speed_probe_cpu_s"):
                probes = [float(old["speed_probe_cpu_s"])]
            corun = [(float(a), float(b)) for a, b in old.get("corun_pairs", ())]
            if probes:  # the probe's shapes match: its per-instance runs are comparable
                instance_probes = {n: [float(x) for x in v]
                                   for n, v in old.get("instance_probes", {}).items()}
            print(f"# refit of {len(rows)} single, {len(batched)} batched and {len(joined)} "
                  f"joined rows from {args.refit}")
        if not args.refit:
            names = [n for n, _ in members]
            print(f"# {base} / {model_name}: timing {', '.join(names)} "
                  + ("at once, as the cluster serves" if args.together or len(names) == 1
                     else "one after another"))
            for t in range(1, args.tries + 1):
                measured: dict[str, calib.Measured] = {}
                for group in [names] if args.together else [[n] for n in names]:
                    measured.update(calib.measure_together(measure_args, group))
                try_probes = [x for m in measured.values() for x in m.probes]
                for n, m in measured.items():
                    instance_probes.setdefault(n, []).extend(calib.busy_probe_samples(m))
                    corun += m.corun
                warning = calib.probe_spread_warning(try_probes)
                tries.append({"speed_probe_runs": try_probes, "moved": warning is not None,
                              "corun_pairs": [list(x) for m in measured.values()
                                              for x in m.corun]})
                if warning is None or t == args.tries:
                    break
                print(f"try {t}: {warning}")
                print(f"# try {t + 1} of at most {args.tries}: calibrating again "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
            # the fit is the last try's rows (the stable one, if any was)
            for m in measured.values():
                rows += m.rows
                batched += m.batched
                joined += m.joined
                probes += m.probes
        name, cfg = members[0]
        limits = calib.engine_limits(cfg)
        model = engine_for(name, limits, hardware.gpu(base)).model
        fit = calib.fit_rows(hardware.gpu(base), model, limits, rows, batched, joined,
                           cpu_share=args.cpu_share, fit_batched=args.fit_batched)
        constants: dict[str, float] = {str(f): float(getattr(fit.profile, f))
                                       for f in calib.STORED_FIELDS}
        entry = host_profiles.HostProfile(
            base=base, model=model_name, host=host, constants=constants,
            fit_error={"median": fit.median_error, "max": fit.max_error},
            instances=tuple(n for n, _ in members),
            speed_probe_cpu_s=float(np.mean(probes)) if probes else 0.0,
            speed_probe_shapes=calib.SPEED_PROBE if probes else (),
            alone_factor=calib.corun_factor(corun), corun_pairs=tuple(corun),
            instance_probes={n: tuple(v) for n, v in instance_probes.items()} if probes
            else {})
        if probes and args.refit:
            print(f"speed probe of the saved rows: {probes[0]:.3f} CPU-s")
        elif probes:
            print(f"speed probe ({len(probes)} runs, before and after each instance's rows): "
                  f"mean {np.mean(probes):.3f} CPU-s, range {min(probes):.3f}-"
                  f"{max(probes):.3f}; a replay that times it again matches its load to "
                  "this one's")
            warning = calib.probe_spread_warning(probes)
            if warning:
                print(warning)
        speeds = entry.instance_speeds()
        if speeds:
            print(f"speed reference per instance (the median of its probes with its "
                  f"neighbours busy, {len(tries) or 'saved'} tr{'y' if len(tries) == 1 else 'ies'}"
                  f"), over the fitted rows' {entry.speed_probe_cpu_s:.3f} CPU-s: " + ", ".join(
                      f"{n} {entry.instance_reference(n, calib.SPEED_PROBE):.3f} CPU-s "
                      f"(x{v:.3f}, {len(entry.instance_probes[n])} probes)"
                      for n, v in speeds.items())
                  + "; the simulator prices each instance's engine at its factor")
        if corun:
            ratios = [a / b for a, b in corun]
            print(f"co-run factor (cpu_alone_factor): {entry.alone_factor:.3f}, the median "
                  f"alone/beside-busy ratio of the speed probe over {len(corun)} pairs "
                  f"(range {min(ratios):.3f}-{max(ratios):.3f}); the simulator prices a "
                  "local engine's work at it while its neighbours are idle")
        elif len(members) > 1:
            print("co-run factor: not measured (1.0)")
        refs = calib.reference_times(fit.profile, model, limits)
        print("reference times on the fit (s, dedicated core): "
              + ", ".join(f"{k} {v:.4f}" for k, v in refs.items()))
        print(f"{base} / {model_name} on {host.describe()}: "
              + ", ".join(f"{k}={v:.4g}" for k, v in constants.items())
              + f"; fit median {fit.median_error * 100:.1f}%, max {fit.max_error * 100:.1f}% "
              f"over {len(rows)} single and {len(batched)} batched rows")
        if not args.dry_run:
            path = host_profiles.save(entry)
            print(f"stored in {path}")
        saved[f"{base} / {model_name}"] = {**entry.to_json(), "reference_s": refs,
                                          "rows": fit.rows,
                                          "speed_probe_runs": probes,
                                          "tries": tries,
                                          "batched": fit.batched, "joined": fit.joined}
    print(f"# load at the end {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(saved, indent=1))
    return 0
