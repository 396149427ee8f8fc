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
