"""``agentflow bench sim_speed``'s records digest: what lets two checkouts be compared on
identical results. The same run hashes the same; another seed's arrivals do not."""

from __future__ import annotations

import pytest

from agentflow.bench.paths import HEXGEN_TRACES
from agentflow.bench.scheduler.sim_speed import replay

TRACE = HEXGEN_TRACES / "trace2.json"


@pytest.mark.skipif(not TRACE.is_file(), reason="shared traces absent")
def test_the_digest_is_the_runs_records() -> None:
    a = replay("hetero-64", TRACE, 20, 6.0, "flowsage", seed=0)
    b = replay("hetero-64", TRACE, 20, 6.0, "flowsage", seed=0)
    c = replay("hetero-64", TRACE, 20, 6.0, "flowsage", seed=1)
    assert a[0] == b[0] and a[2] == b[2] == 20 and a[3] == b[3]
    assert len(a[3]) == 16 and c[3] != a[3]


def test_a_fresh_clone_replays_the_shipped_demo_trace(tmp_path, monkeypatch, capsys) -> None:
    """Without ../shared the benchmark ran nothing ("no trace at ..."); it now says so and
    replays the demo trace that ships with the project."""
    from agentflow.bench.scheduler import sim_speed

    monkeypatch.setattr(sim_speed, "HEXGEN_TRACES", tmp_path / "absent")
    sim_speed.main(["--cluster", "hetero-64", "--queries", "10", "--rate", "6"])
    out = capsys.readouterr().out
    assert "replaying the demo trace that ships" in out and "trace.jsonl at 6 q/s" in out


@pytest.mark.skipif(not TRACE.is_file(), reason="shared traces absent")
def test_windows_watch_the_run_without_changing_it() -> None:
    """``--window``: the run with the window clock watching is the same run (same digest),
    and its windows count every ``window`` finished calls, in simulated-time order."""
    windows: list = []
    plain = replay("hetero-64", TRACE, 20, 6.0, "flowsage", seed=0)
    watched = replay("hetero-64", TRACE, 20, 6.0, "flowsage", seed=0, windows=windows,
                     window=50)
    assert watched[0] == plain[0] and watched[3] == plain[3]
    assert [w.calls for w in windows] == list(range(50, plain[0] + 1, 50))
    assert all(w.rate > 0 for w in windows)
    assert [w.sim_s for w in windows] == sorted(w.sim_s for w in windows)
