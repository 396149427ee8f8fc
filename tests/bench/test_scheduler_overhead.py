"""scheduler_overhead measures decisions as serving makes them (finished calls report their
times, so time models learn), reads cluster files, and prints the growth across clusters."""

from __future__ import annotations

from agentflow.bench.scheduler import scheduler_overhead
from agentflow.scheduler import Coordinator


def test_it_learns_by_default_and_prints_the_growth(capsys, monkeypatch, tmp_path) -> None:
    learned: list[int] = []
    done = Coordinator.on_call_done

    def spy(self, call, **kw):
        learned.append(kw.get("total_s", 0.0) > 0)
        return done(self, call, **kw)

    monkeypatch.setattr(Coordinator, "on_call_done", spy)
    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\ninstances:\n  - {gpu: H100, model: Llama-3.1-8B, count: 2}\n")
    scheduler_overhead.main(["--sizes", "10", "--repeat", "3", "--policies", "vllm",
                             "--cluster", "h100-8b-4", "--cluster", str(cluster)])
    out = capsys.readouterr().out
    assert learned and all(learned)
    assert "cluster two (2 instances)" in out and "learning" in out
    assert "growth of the p99 at 10 waiting, h100-8b-4 -> two" in out
    learned.clear()
    scheduler_overhead.main(["--sizes", "10", "--repeat", "3", "--policies", "vllm",
                             "--clusters", "h100-8b-4", "--no-learn"])
    assert learned and not any(learned)
    assert "no learning" in capsys.readouterr().out



def test_no_query_holds_two_calls_of_one_node_so_decisions_repeat(monkeypatch) -> None:
    """Every round readies a call of a node of its own: were it one of the graph's nodes, the
    query would hold two calls of one node and the critical path would read whichever its
    set yields, so flowsage's keys, and its decisions, could change from run to run."""
    seen: list[tuple[str, str]] = []
    ready = Coordinator.on_call_ready

    def spy(self, query_id, **kw):
        seen.append((query_id, kw["node_id"]))
        return ready(self, query_id, **kw)

    monkeypatch.setattr(Coordinator, "on_call_ready", spy)
    logs = []
    for _ in range(2):
        log: list[tuple[str, str, int]] = []
        scheduler_overhead.measure("flowsage", 400, 60, "hetero-64", log=log)
        logs.append(log)
    half = seen[:len(seen) // 2]
    assert len(half) > 400 and len(set(half)) == len(half)
    assert len(logs[0]) >= 60 and logs[0] == logs[1]


def test_the_pooled_p99_reads_every_pair_s_rounds() -> None:
    """Two runs of 100 rounds pooled: the p99 is the 199th of 200 (``int(0.99 * 200)``), so one
    run's two slow rounds no longer decide it alone; each run's own p99 is its 2nd largest."""
    fast = [1.0] * 98 + [50.0, 60.0]
    slow = [2.0] * 100
    assert scheduler_overhead.pooled_p99([fast, slow]) == 50.0
    assert scheduler_overhead.pooled_p99([slow, slow]) == 2.0
    assert scheduler_overhead.pooled_p99([[3.0]]) == 3.0
