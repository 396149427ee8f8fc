"""A grid of independent cells (simulations), run one after another or as Ray tasks.

Why a map and nothing more: a policy comparison or a goodput search is a list of
simulations that share their inputs (trace, cluster, workload) and never talk to each other.
Each cell is deterministic given its inputs (seeded), so running it in another process on
another machine gives the same numbers; only the wall time changes. The shared ``context``
is sent to the cluster once (``ray.put``), not once per cell.

    results = run_grid(simulate_one, policies, context=inputs)              # serial
    results = run_grid(simulate_one, policies, context=inputs, ray="auto")  # on a cluster

``fn(cell, context)`` must be picklable by reference (a module-level function of an
installed module) and so must cells, context and results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

C = TypeVar("C")
R = TypeVar("R")


class GridCellError(RuntimeError):
    """A cell raised; says which one."""


@dataclass
class GridRun:
    results: list[Any]
    wall_s: float
    where: str  # "serial" or "ray: N CPUs"


def _run_cell(fn: Callable[[Any, Any], Any], cell: Any, context: Any) -> Any:
    return fn(cell, context)


def run_grid(fn: Callable[[C, Any], R], cells: Sequence[C], *, context: Any = None,
             ray: str | None = None, num_cpus: float = 1.0,
             on_result: Callable[[int, R], None] | None = None) -> list[R]:
    """``[fn(cell, context) for cell in cells]``, in order; with ``ray`` (an address or
    ``local``) each cell is a Ray task reserving ``num_cpus``. ``on_result(i, result)`` is
    called as each cell finishes (in completion order on Ray)."""
    return run_grid_timed(fn, cells, context=context, ray=ray, num_cpus=num_cpus,
                          on_result=on_result).results


def run_grid_timed(fn: Callable[[C, Any], R], cells: Sequence[C], *, context: Any = None,
                   ray: str | None = None, num_cpus: float = 1.0,
                   on_result: Callable[[int, R], None] | None = None) -> GridRun:
    """``run_grid`` plus the wall time of the whole grid (connection excluded)."""
    cells = list(cells)
    if ray is None:
        start = time.perf_counter()
        results = []
        for i, cell in enumerate(cells):
            results.append(fn(cell, context))
            if on_result is not None:
                on_result(i, results[-1])
        return GridRun(results, time.perf_counter() - start, "serial")
    from agentflow.distributed import connect_ray

    rt = connect_ray(ray)
    start = time.perf_counter()
    task = rt.remote(num_cpus=num_cpus)(_run_cell)
    shared = rt.put(context)
    refs = [task.remote(fn, cell, shared) for cell in cells]
    index = {ref: i for i, ref in enumerate(refs)}
    out: list[Any] = [None] * len(refs)
    pending = list(refs)
    try:
        while pending:
            ready, pending = rt.wait(pending, num_returns=1)
            i = index[ready[0]]
            try:
                out[i] = rt.get(ready[0])
            except rt.exceptions.RayTaskError as err:
                raise GridCellError(f"grid cell {i} ({cells[i]!r}) failed: "
                                    f"{err.cause if err.cause is not None else err}") from None
            if on_result is not None:
                on_result(i, out[i])
    except BaseException:
        for ref in pending:
            rt.cancel(ref)
        raise
    cpus = rt.cluster_resources().get("CPU", 0)
    return GridRun(out, time.perf_counter() - start, f"ray: {cpus:g} CPUs")
