"""The calibration's clock: a server's own CPU seconds, which other work on its core does not
stretch (real child processes, a real busy loop beside them)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentflow.sim.host_calibration import ServerClock, process_cpu_s, server_pid

# A fixed amount of work, then a wait for stdin so its CPU time can be read after it.
WORK = "import sys\nx = 0\nfor i in range({n}): x += i\nprint('done', flush=True)\nsys.stdin.read()"
SPIN = "while True: pass"


def _child(code: str, core: int | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    if core is not None:
        os.sched_setaffinity(proc.pid, {core})
    return proc


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.skipif(process_cpu_s(os.getpid()) is None, reason="no /proc schedstat")
def test_the_cpu_clock_counts_a_servers_work_not_the_time_it_waits():
    sleeper = _child("import time; time.sleep(30)")
    try:
        clock = ServerClock(SimpleNamespace(process=SimpleNamespace(pid=sleeper.pid)))
        assert clock.cpu
        c0, t0 = clock.now(), time.perf_counter()
        time.sleep(0.3)
        assert time.perf_counter() - t0 >= 0.3
        assert clock.now() - c0 < 0.05  # asleep: no CPU time
    finally:
        _stop(sleeper)


def _rel_spread(values: list[float]) -> float:
    """Median absolute deviation over the median: how far the values disagree."""
    mid = statistics.median(values)
    return statistics.median(abs(v - mid) for v in values) / mid


@pytest.mark.skipif(process_cpu_s(os.getpid()) is None or not hasattr(os, "sched_setaffinity"),
                    reason="no /proc schedstat or CPU affinity")
def test_a_busy_loop_on_the_same_core_stretches_wall_time_not_cpu_time():
    """The same fixed work alone and beside a hog pinned to its core: the wall time grows
    (the hog takes its share of the core), the CPU clock's reading of it barely moves.

    Judged on pairs: each pair runs the work alone and beside the hog back to back (in
    alternating order), and the medians of the pairs' ratios are compared. Other processes
    on the machine change what a unit of work costs in CPU seconds (shared caches, memory
    bandwidth, a busy sibling hyperthread) from one second to the next; one 'alone' run and
    one 'hog' run taken under different outside load once read 1.66x, as if the hog had
    done it. Pairs are added, up to a bound, until their CPU ratios agree. On the wall clock
    the hog's pairs would read about 2x and the stretch about 1: both checks fail."""
    core = sorted(os.sched_getaffinity(0))[0]
    n = 1_500_000  # ~0.1 s of CPU: short pairs, so that more of them fit in a busy minute

    def run(with_hog: bool) -> tuple[float, float]:
        hog = _child(SPIN, core) if with_hog else None
        try:
            if hog is not None:
                time.sleep(0.2)  # the hog is spinning before the work starts
            t0 = time.perf_counter()
            worker = _child(WORK.format(n=n), core)
            try:
                assert worker.stdout is not None and worker.stdout.readline() == "done\n"
                wall = time.perf_counter() - t0
                cpu = process_cpu_s(worker.pid)
                assert cpu is not None
                return cpu, wall
            finally:
                _stop(worker)
        finally:
            if hog is not None:
                _stop(hog)

    pairs: list[tuple[float, float, float, float]] = []  # cpu, wall alone; cpu, wall hog
    for i in range(9):
        order = (False, True) if i % 2 == 0 else (True, False)
        got = {with_hog: run(with_hog) for with_hog in order}
        pairs.append((*got[False], *got[True]))
        if len(pairs) >= 5 and _rel_spread([ch / ca for ca, _, ch, _ in pairs]) < 0.1:
            break
    cpu_ratio = statistics.median(ch / ca for ca, _, ch, _ in pairs)
    stretch = statistics.median(wh / ch for _, _, ch, wh in pairs)
    assert stretch > 1.4, pairs  # the hog took a large share of the core
    assert 0.7 < cpu_ratio < 1.4, pairs


def test_a_backend_without_a_local_process_is_timed_on_the_wall_clock():
    for backend in (SimpleNamespace(), SimpleNamespace(process=SimpleNamespace(pid=None))):
        assert server_pid(backend) is None
        clock = ServerClock(backend)
        assert not clock.cpu
        a = clock.now()
        time.sleep(0.01)
        assert clock.now() - a >= 0.01
    # and on request, a local one too
    assert not ServerClock(SimpleNamespace(process=SimpleNamespace(pid=os.getpid())),
                           use_cpu=False).cpu


@pytest.mark.skipif(process_cpu_s(os.getpid()) is None, reason="no /proc schedstat")
def test_a_server_gone_mid_calibration_is_an_error_not_a_frozen_clock():
    proc = _child("import time; time.sleep(30)")
    clock = ServerClock(SimpleNamespace(process=SimpleNamespace(pid=proc.pid)))
    assert clock.cpu
    _stop(proc)
    assert process_cpu_s(proc.pid) is None
    with pytest.raises(RuntimeError, match="gone"):
        clock.now()


def test_reference_times_compare_two_fits_on_times():
    """Two fits of one host are compared on what they predict: a profile with twice the
    weight bandwidth decodes faster, and a prompt's time does not depend on the decode."""
    from dataclasses import replace

    from agentflow import hardware
    from agentflow.config import InstanceConfig
    from agentflow.sim.engine import engine_for
    from agentflow.sim.host_calibration import REFERENCE_SHAPES, engine_limits, reference_times

    cfg = engine_limits(InstanceConfig(name="cpu-0", gpu="Xeon-core", model="gemma-3-270m",
                                       backend={"type": "llama_server", "parallel": 4}))
    g = hardware.gpu("Xeon-core")
    model = engine_for("cpu-0", cfg, g).model
    base = reference_times(g, model, cfg)
    fast = reference_times(replace(g, bw_efficiency=2 * g.bw_efficiency), model, cfg)
    assert list(base) == [name for name, *_ in REFERENCE_SHAPES]
    assert all(v > 0 for v in base.values())
    assert fast["p32 o96"] < 0.9 * base["p32 o96"]
    assert base["4 x p32 o64"] > base["p32 o96"] * 64 / 96  # a batch costs more than one


@pytest.mark.slow
def test_calibrate_refit_recovers_the_profile_that_timed_the_rows(tmp_path, capsys):
    """Rows timed by a known host (Xeon-core with 1.8x its bandwidth, above the old bound of
    1), saved as `agentflow calibrate --json` saves them: `--refit` fits them again without
    engines and its reference times come back within 5% of that host's."""
    from dataclasses import replace

    from agentflow import hardware
    from agentflow.cli.main import main
    from agentflow.sim import host_calibration as c
    from agentflow.sim.cluster import load_cluster
    from agentflow.sim.engine import engine_for

    cluster = Path(__file__).resolve().parents[2] / "examples" / "cluster-llama-server-2cpu.yaml"
    name, cfg = load_cluster(str(cluster)).expanded()[0]
    limits = c.engine_limits(cfg)
    base = hardware.gpu("Xeon-core")
    model = engine_for(name, limits, base).model
    truth = replace(base, bw_efficiency=1.8, decode_compute_efficiency=0.22)
    rows = []
    for p in c.CAL_PROMPTS:
        for o in c.CAL_OUTPUTS:
            ttft, total = c.sim_single(truth, model, limits, p, o)
            rows.append((p, o, ttft, total, 1.0, ttft, total))
    batched = [(b, p, o, c.sim_batch(truth, model, limits, b, p, o)[1], 1.0,
                c.sim_single(truth, model, limits, p, o)[1], 1.0)
               for b in c.CAL_BATCHES for p, o in c.CAL_BATCH_SHAPES]
    saved = tmp_path / "cal.json"
    saved.write_text(json.dumps({"Xeon-core / gemma-3-270m": {"rows": rows, "batched": batched,
                                                              "joined": []}}))
    out = tmp_path / "refit.json"
    assert main(["calibrate", "--cluster", str(cluster), "--instances", name, "--refit",
                 str(saved), "--dry-run", "--json", str(out)]) == 0
    assert "refit of 12 single, 4 batched" in capsys.readouterr().out
    got = json.loads(out.read_text())["Xeon-core / gemma-3-270m"]["reference_s"]
    want = c.reference_times(truth, model, limits)
    assert got == pytest.approx(want, rel=0.05)
