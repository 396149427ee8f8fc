"""The replay's machine figures: steal is read apart from work done inside the machine."""
from __future__ import annotations

import time

import pytest

from agentflow.bench.fidelity import environment as env

STAT = ("cpu  1000 200 300 5000 100 10 20 400 0 0\n"
        "cpu0 500 100 150 2500 50 5 10 200 0 0\n")


def test_cpu_times_splits_steal_from_busy():
    busy, steal = env.cpu_times(STAT, 100.0)
    # user + nice + system + irq + softirq; idle (5000) and iowait (100) left out
    assert busy == pytest.approx((1000 + 200 + 300 + 10 + 20) / 100)
    assert steal == pytest.approx(4.0)


def test_cpu_times_rejects_other_text():
    with pytest.raises(ValueError, match="aggregate cpu line"):
        env.cpu_times("cpu0 1 2 3 4 5 6 7 8\n", 100.0)
    with pytest.raises(ValueError):
        env.cpu_times("", 100.0)


def test_real_proc_stat_moves_forward_with_work():
    busy0, steal0 = env.machine_busy_s(), env.steal_s()
    if busy0 is None or steal0 is None:
        pytest.skip("no /proc/stat here")
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    busy1, steal1 = env.machine_busy_s(), env.steal_s()
    assert busy1 is not None and steal1 is not None
    assert busy1 - busy0 >= 0.2  # this loop's own 0.3 CPU-s, at 100 ticks/s
    assert steal1 >= steal0


def test_quietness_line_names_steal_apart_from_other_processes():
    q = env.Quietness()
    q.begin()
    out = q.end(engines_cpu_s=0.0)
    if "steal_s" not in out:
        pytest.skip("no /proc/stat here")
    assert out["steal_s"] >= 0
    line = q.line()
    assert "hypervisor steal" in line and "other processes" in line
