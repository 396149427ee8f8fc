"""Tenant isolation and fairness ratios over several seeds, side by side: for each tenant cell,
its P95 over the same tenant's P95 alone, per seed, from ``tenant_cells --json`` files.

    agentflow bench tenant_ratios off=DIR_OFF/seed*.json fair=DIR_FAIR/seed*.json

Each argument is ``LABEL=GLOB`` (one file per seed, each with the alone scenarios:
``--scenarios isolation-1.5x,isolation-2x,fairness,light-alone,interactive-alone``); files
are paired across labels by name, so run every label on the same seeds. Printed per cell and
label: the geometric mean of its ratios over the seeds, how many seeds meet the target
(isolation: interactive P95 / alone <= 1.2; fairness: light P95 / alone <= 1.3), and the
flooding tenant's throughput (batch, heavy) over the first label's; then over all cells the
geometric mean, the count within target and the worst ratio. Why several seeds: a cell's
interactive tenant has 40 queries and the light one 24, so its P95 is its second-worst query
and moves by 0.1-0.5 between seeds (paper-4gpu fairness 1.27-1.50 over seeds 0-2 on one
commit); a change is judged on the mean over seeds, not on one seed's cell.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from pathlib import Path
from typing import Any

from agentflow.bench.scheduler.policy_suite import geomean

CLUSTERS = ("paper-4gpu", "hetero-8", "mixed-qwen")
# cell -> (scenario, tenant measured, its alone scenario, the flooding tenant, target)
CELLS = {"isolation-1.5x": ("interactive", "interactive-alone", "batch", 1.2),
         "isolation-2x": ("interactive", "interactive-alone", "batch", 1.2),
         "fairness": ("light", "light-alone", "heavy", 1.3)}


def cell_ratios(figures: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """``cluster scenario`` -> (P95 / alone, flooding tenant's answers per second), for the
    flowsage cells whose alone run is in the same file."""
    out: dict[str, tuple[float, float]] = {}
    for cluster in CLUSTERS:
        for scen, (tenant, alone_scen, flood, _) in CELLS.items():
            cell = figures.get(f"{cluster}/{scen}/flowsage")
            alone = figures.get(f"{cluster}/{alone_scen}/flowsage")
            if not cell or not alone:
                continue
            p95, alone_p95 = cell[tenant]["p95"], alone[tenant]["p95"]
            if p95 is None or not alone_p95:
                continue
            out[f"{cluster} {scen}"] = (p95 / alone_p95, cell[flood]["qps"])
    return out


def summarise(groups: dict[str, list[Path]]) -> list[str]:
    """The table's lines; ``groups``: label -> files (one per seed, paired by name)."""
    labels = list(groups)
    names = {label: {p.name: p for p in paths} for label, paths in groups.items()}
    seeds = sorted(set.intersection(*(set(n) for n in names.values())))
    if not seeds:
        raise SystemExit("no file name is common to every label: run them on the same seeds")
    data = {label: [cell_ratios(json.loads(names[label][s].read_text())) for s in seeds]
            for label in labels}
    cells = [c for c in data[labels[0]][0] if all(c in d for ds in data.values() for d in ds)]
    width = 24
    lines = [f"{len(seeds)} seeds ({', '.join(seeds)}); per cell: geomean of P95 / alone, "
             f"seeds within target, flood throughput / {labels[0]}'s",
             "cell".ljust(26) + "".join(label.rjust(width) for label in labels)]
    ratios: dict[str, list[float]] = {label: [] for label in labels}
    met = {label: 0 for label in labels}
    flood: dict[str, list[float]] = {label: [] for label in labels}
    for cell in cells:
        target = CELLS[cell.split(" ", 1)[1]][3]
        row = cell.ljust(26)
        for label in labels:
            rs = [d[cell][0] for d in data[label]]
            qs = [d[cell][1] / b[cell][1] for d, b in zip(data[label], data[labels[0]])]
            ok = sum(r <= target for r in rs)
            ratios[label] += rs
            met[label] += ok
            flood[label] += qs
            row += f"{geomean(rs):.3f} ({ok}/{len(rs)}) x{geomean(qs):.3f}".rjust(width)
        lines.append(row)
    lines.append("all cells".ljust(26) + "".join(
        f"{geomean(ratios[lb]):.3f} ({met[lb]}/{len(ratios[lb])}) x{geomean(flood[lb]):.3f}"
        .rjust(width) for lb in labels))
    lines.append("worst ratio".ljust(26) + "".join(
        f"{max(ratios[lb], default=math.nan):.3f}".rjust(width) for lb in labels))
    return lines


# `agentflow bench NAME --quick`: a short run (registry.expand_quick)
QUICK_ARGS: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("groups", nargs="+", metavar="LABEL=GLOB",
                   help="a label and the tenant_cells --json files of its seeds")
    args = p.parse_args(argv)
    groups: dict[str, list[Path]] = {}
    for spec in args.groups:
        label, sep, pattern = spec.partition("=")
        if not sep or not label:
            p.error(f"expected LABEL=GLOB, got {spec!r}")
        paths = [Path(f) for f in sorted(glob.glob(pattern))]
        if not paths:
            p.error(f"{label}: no file matches {pattern!r}")
        groups[label] = paths
    print("\n".join(summarise(groups)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
