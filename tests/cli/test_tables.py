"""CLI tables stay readable when stdout is a file or a pipe (rich would fold them to 80)."""

from __future__ import annotations

import io

from rich.console import Console

from agentflow.cli import table_console
from agentflow.cli.ask import progress_text, timeline_table
from agentflow.cli.evaluate import print_summary


def _summary() -> dict:
    run = {"questions": 5, "accuracy": {"accuracy": 0.6, "accuracy_bird": 0.6},
           "latency_s": {"mean": 12.3, "p50": 11.0, "p95": 20.1, "p99": 22.4},
           "throughput_qps": 0.031, "slo_attainment": {"2": 0.8},
           "usage_per_question": {"calls": 17.2}}
    return {"mode": "simulated", "settings": {"slo_scale": 2.0, "cluster": "paper-4gpu"},
            "runs": {"single__flowsage": run, "chess__hexgen-flow": run}, "out": "artifacts/x"}


def test_eval_summary_is_wide_when_not_a_terminal(monkeypatch) -> None:
    buffer = io.StringIO()
    monkeypatch.setattr("sys.stdout", buffer)
    print_summary(table_console(), _summary())
    text = buffer.getvalue()
    rows = [line for line in text.splitlines() if "single__flowsage" in line]
    assert rows and "60.0%" in rows[0] and "17.2" in rows[0], text
    assert "…" not in text, text


class _Answer:
    stages = [{"node_id": "generate_candidate.2", "kind": "llm", "start": 0.5, "end": 3.25,
               "error": None, "summary": "SELECT name FROM stores WHERE city = 'Lisbon' " * 3,
               "llm_calls": [{"instance": "local", "queue_s": 0.1, "run_s": 2.5,
                              "prompt_tokens": 800, "completion_tokens": 30}]},
              {"node_id": "execute.1.1", "kind": "tool", "start": 3.3, "end": 3.31,
               "error": None, "summary": "2 rows", "llm_calls": []}]


def test_ask_timeline_never_wraps_stage_names_in_a_narrow_terminal() -> None:
    for width in (80, 100):
        console = Console(width=width, file=io.StringIO())
        console.print(timeline_table(_Answer(), width))
        text = console.file.getvalue()
        lines = text.splitlines()
        assert any("generate_candidate.2" in line and "800/30" in line for line in lines), text
        assert any("execute.1.1" in line for line in lines), text
        assert all(len(line) <= width for line in lines)
        assert sum("SELECT" in line for line in lines) <= 1  # the result never wraps


def test_progress_line_names_running_stages_and_elapsed_time() -> None:
    line = progress_text("chess", ["revise.1.1", "generate_candidate.2"], 7, 12.34, 60)
    assert "revise.1.1" in line and "generate_candidate.2" in line
    assert "7 stages done" in line and "12.3s" in line and "SLO 60s" in line
