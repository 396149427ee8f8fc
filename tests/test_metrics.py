"""The one vocabulary of metrics: every report's "met the SLO" is agentflow.metrics'."""

from __future__ import annotations

import pytest

from agentflow.api import Answer
from agentflow.metrics import (
    Outcome,
    absolute_attainment,
    attainment,
    attainment_table,
    latency_stats,
    meets_goodput_target,
    scale_key,
)


def test_only_done_queries_meet_an_slo() -> None:
    outs = [Outcome("done", 10.0, 10.0), Outcome("done", 25.0, 10.0),
            Outcome("failed", 1.0, 10.0), Outcome("rejected", None, 10.0),
            Outcome("cancelled", 0.5, 10.0)]
    assert attainment(outs, 1.0) == pytest.approx(1 / 5)  # the fast failures do not count
    assert attainment(outs, 3.0) == pytest.approx(2 / 5)
    assert attainment([], 2.0) is None
    assert meets_goodput_target(outs[:2], 3.0) and not meets_goodput_target(outs, 3.0)


def test_one_key_format_for_every_attainment_table() -> None:
    assert [scale_key(s) for s in (1, 1.0, 1.5, 2.0, 1.25, 10)] == [
        "1", "1", "1.5", "2", "1.25", "10"]
    table = attainment_table([Outcome("done", 1.0, 1.0)], (1.0, 1.25))
    assert table == {"1": 1.0, "1.25": 1.0}


def test_absolute_slos_and_answers_agree() -> None:
    answers = [Answer("q1", "?", "db", "chess", "done", None, "SELECT 1", latency_s=2.0,
                      slo_s=3.0),
               Answer("q2", "?", "db", "chess", "failed", "no SQL", None, latency_s=0.1,
                      slo_s=3.0),
               Answer("q3", "?", "db", "chess", "done", None, "SELECT 1", latency_s=9.0,
                      slo_s=3.0),
               Answer("q4", "?", "db", "chess", "done", None, "SELECT 1", latency_s=9.0)]
    assert [a.met_slo for a in answers] == [True, False, False, None]
    outs = [Outcome.of(a.to_dict()) for a in answers]
    assert absolute_attainment(outs) == {"n": 3, "met": 1, "attainment": pytest.approx(1 / 3)}


def test_latency_stats_skip_missing_values() -> None:
    stats = latency_stats([1.0, None, 3.0, 2.0])
    assert (stats["n"], stats["mean"], stats["p50"], stats["max"]) == (3, 2.0, 2.0, 3.0)
    assert latency_stats([])["p95"] is None
