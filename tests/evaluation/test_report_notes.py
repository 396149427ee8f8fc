"""What the eval report says about itself: the one-at-a-time caveat, the attainment rule as
the code computes it, and accuracy bars that say their value even at 0%."""

from __future__ import annotations

from pathlib import Path

from agentflow.evaluation.report import sequential_caveat, write_plots, write_report
from agentflow.evaluation.scoring import summarize_run
from agentflow.metrics import Outcome, attainment

RECORDS = [{"status": "done", "latency_s": 2.0, "idle_latency_s": 1.0, "correct": False,
            "reason": "mismatch", "difficulty": "easy", "db_id": "demo"},
           {"status": "failed", "latency_s": 0.5, "idle_latency_s": 1.0, "correct": False,
            "reason": "pred_error", "difficulty": "hard", "db_id": "demo"}]


def _summary(rate, policies=("vllm", "flowsage")) -> dict:
    runs = {f"single__{p}": summarize_run(RECORDS, slo_scale=2.0) for p in policies}
    return {"mode": "real", "runs": runs,
            "measured": {"statement": "measured.", "items": {}},
            "dataset": {"kind": "demo", "root": "demo", "split": "dev", "questions": 2},
            "settings": {"pipelines": ["single"], "policies": list(policies), "limit": 2,
                         "seed": 0, "rate": rate, "arrival": None, "arrivals": "x",
                         "slo_scale": 2.0, "instances": ""},
            "idle_latency": "critical path", "files": {}}


def test_one_at_a_time_runs_say_policies_cannot_differ(tmp_path: Path) -> None:
    report = write_report(tmp_path / "report.md", _summary(None), {}).read_text()
    assert "one at a time" in report and "cannot differ" in report
    assert sequential_caveat(_summary(2.0)) is None  # under a real arrival rate they can
    assert "cannot differ" not in (sequential_caveat(_summary(None, ("vllm",))) or "")
    assert sequential_caveat({**_summary(None), "mode": "simulated"}) is None


def test_the_attainment_text_matches_the_rule(tmp_path: Path) -> None:
    report = write_report(tmp_path / "report.md", _summary(2.0), {}).read_text()
    section = report.split("## SLO attainment vs SLO scale")[1].split("##")[0]
    assert "answered (status done)" in section and "never meet it" in section
    # and that is what the code computes: the failed question within 2x counts as missed
    assert attainment([Outcome.of(r) for r in RECORDS], 2.0) == 0.5


def test_accuracy_bars_are_labelled_even_at_zero(tmp_path: Path, monkeypatch) -> None:
    from matplotlib.axes import Axes

    labels: list[list[str]] = []
    real = Axes.bar_label
    monkeypatch.setattr(Axes, "bar_label", lambda self, c, labels_=None, **k: (
        labels.append(list(k.get("labels") or [])), real(self, c, **k))[1])
    made = write_plots(tmp_path, _summary(None, ("vllm",)), {"single__vllm": RECORDS})
    assert "Accuracy by difficulty" in made
    assert ["0%", "0%"] in labels  # easy and hard, both 0% and both labelled
