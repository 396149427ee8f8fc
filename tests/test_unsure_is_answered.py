"""An "unsure" answer (below min_confidence, which is on by default) is still an answer: it
counts as answered in the serving metrics, keeps its CSV link, and its record is replayable."""

from __future__ import annotations

from types import SimpleNamespace

from agentflow.evaluation.scoring import COMPLETED
from agentflow.metrics import meets, throughput
from agentflow.server.results import result_links


def test_unsure_meets_the_slo_and_counts_in_throughput() -> None:
    assert meets("unsure", 1.0, 2.0) and meets("done", 1.0, 2.0)
    assert not meets("failed", 1.0, 2.0) and not meets("unsure", 3.0, 2.0)
    qps, span = throughput([("s", 0.0, 1.0, "done"), ("s", 0.0, 2.0, "unsure"),
                            ("s", 0.0, 3.0, "failed")])
    assert span == 2.0 and qps == 1.0  # two answered over 0..2 s; the failure is not answered


def test_unsure_answer_keeps_its_csv_link_and_counts_as_completed() -> None:
    answer = SimpleNamespace(status="unsure", columns=["n"], rows=[[3]],
                             question="How many stores are there?")
    assert result_links("q1", answer)["csv"] == "/v1/queries/q1/rows.csv"
    failed = SimpleNamespace(status="failed", columns=["n"], rows=[[3]], question="x")
    assert result_links("q1", failed) == {}
    assert "unsure" in COMPLETED
