"""agentflow.confidence_fit: the statistics, the database split, the logistic fit, the threshold
rule and the out-of-sample folds, on small hand-made sets whose answers are known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow.confidence_fit import (
    Judged,
    at_threshold,
    auroc,
    bootstrap_auroc,
    choose_threshold,
    cross_fit,
    fit_and_check,
    fit_logistic,
    fold_of,
    split_by_database,
    wilson,
)


def test_auroc_counts_ties_half_and_needs_both_classes() -> None:
    assert auroc([0.9, 0.1], [True, False]) == 1.0
    assert auroc([0.1, 0.9], [True, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.9, 0.5, 0.5], [True, True, False]) == 0.75
    assert auroc([0.2, 0.3], [False, False]) is None
    low, high = bootstrap_auroc([0.9, 0.8, 0.2, 0.1] * 5, [True, True, False, False] * 5)
    assert low == high == 1.0


def test_wilson_interval_holds_the_proportion_and_stays_in_range() -> None:
    low, high = wilson(0, 10)
    assert low == 0.0 and 0.2 < high < 0.35
    low, high = wilson(5, 10)
    assert low < 0.5 < high
    assert wilson(0, 0) is None


def test_split_keeps_each_database_on_one_side_and_does_not_depend_on_the_rows() -> None:
    rows = [Judged(f"q{i}", f"db{i % 12}", 0.5, i % 3 == 0) for i in range(120)]
    fit, held = split_by_database(rows, seed=3)
    assert fit and held and len(fit) + len(held) == 120
    assert not {r.db_id for r in fit} & {r.db_id for r in held}
    fit2, _ = split_by_database(rows[:40], seed=3)  # fewer rows: same databases, same sides
    assert {r.db_id for r in fit2} <= {r.db_id for r in fit}
    with pytest.raises(ValueError):
        split_by_database(rows, fit_share=1.0)


def test_logistic_weights_follow_the_signal_and_constant_features_get_none() -> None:
    rows = ([Judged(f"a{i}", "db", 0.9, True, {"share": 1.0, "executed": 1.0})
             for i in range(8)]
            + [Judged(f"b{i}", "db", 0.3, False, {"share": 0.33, "executed": 1.0,
                                                   "empty": float(i % 2)}) for i in range(30)]
            + [Judged("c", "db", 0.3, True, {"share": 0.33, "executed": 1.0})])
    model = fit_logistic(rows, l2=0.5)
    weights = dict(zip(model.names, model.weights, strict=True))
    assert weights["share"] > 1.0
    assert weights["empty"] < 0
    assert weights["executed"] == 0.0 and weights["taught"] == 0.0  # never varied
    assert model.predict({"share": 1.0, "executed": 1.0}) > 0.5 > model.predict(
        {"share": 0.33, "executed": 1.0, "empty": 1.0})
    with pytest.raises(ValueError):
        fit_logistic(rows, l2=0.0)
    with pytest.raises(ValueError):
        fit_logistic([])


def test_threshold_is_the_lowest_reaching_the_precision_else_the_most_precise() -> None:
    scores = [0.95, 0.67, 0.67, 0.38, 0.38, 0.38, 0.38, 0.1]
    labels = [False, True, True, True, False, False, False, False]
    # >= 0.525 keeps 3 answers, 2 right (67%): the lowest threshold reaching 50%
    assert choose_threshold(scores, labels) == 0.525
    assert at_threshold(scores, labels, 0.525) == {"done_right": 2, "done_wrong": 1,
                                                   "unsure_right": 1, "unsure_wrong": 4}
    # 90% is out of reach: the most precise threshold (0.525, 67%) rather than none at all
    assert choose_threshold(scores, labels, precision=0.9) == 0.525
    assert choose_threshold([0.2, 0.8], [False, False]) is None
    assert at_threshold(scores, labels, None)["done_wrong"] == 5  # no threshold: all done


def _synthetic(n_db: int = 10) -> list[Judged]:
    rows = []
    for d in range(n_db):
        for i in range(10):
            right = i < 2
            share = 1.0 if right or i == 2 else 0.33
            rows.append(Judged(f"{d}-{i}", f"db{d}", 0.1 + 0.85 * share, right,
                               {"executed": 1.0, "share": share}))
    return rows


def test_fit_and_check_reports_the_held_out_side_with_the_fit_sides_threshold() -> None:
    out = fit_and_check(_synthetic(), seed=1)
    fit_dbs = out["fit"]["rule"]["databases"]
    held = out["held_out"]["rule"]
    assert fit_dbs + held["databases"] == 10
    assert held["threshold"] == out["fit"]["rule"]["threshold"] is not None
    # share 1.0 answers are right 2 of 3 times: the threshold keeps them, holds back the rest
    assert held["done_wrong"] * 2 == held["done_right"]
    assert held["unsure_right"] == 0
    assert held["auroc"] is not None and held["auroc"] > 0.8
    assert set(held["by_level"]) == {"high", "medium", "low"}


def test_cross_fit_scores_every_question_once_out_of_sample() -> None:
    rows = _synthetic(12)
    out = cross_fit(rows, folds=3, seed=0)
    assert out["n"] == len(rows)
    assert sum(f["held_out"] for f in out["per_fold"]) == len(rows)
    for f in out["per_fold"]:
        assert f["fitted_on"] + f["held_out"] == len(rows)
    assert out["rule"]["done_right"] + out["rule"]["unsure_right"] == out["correct"]
    assert all(fold_of(r.db_id, 3) in range(3) for r in rows)
    with pytest.raises(ValueError):
        cross_fit(rows, folds=1)
    with pytest.raises(ValueError):
        cross_fit([r for r in rows if r.db_id == "db0"], folds=2)


SPIDER = Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets" / "spider"


@pytest.mark.skipif(not (SPIDER / "dev.json").exists(), reason="shared Spider data absent")
def test_calibration_bench_fits_on_recorded_answers(tmp_path: Path) -> None:
    """The bench re-judges real records against Spider's gold on the real databases, then
    fits and checks: a gold SQL recorded as the prediction is right, a SELECT * is wrong."""
    dev = json.loads((SPIDER / "dev.json").read_text())
    records = []
    for i, ex in enumerate(dev[:400:10]):
        right = i % 4 == 0
        pred = ex["query"] if right else "SELECT * FROM sqlite_master"
        share = 1.0 if right else 0.33
        records.append({"example_id": f"dev_{i * 10}", "db_id": ex["db_id"],
                        "pipeline": "chess", "status": "done", "gold_sql": ex["query"],
                        "pred_sql": pred,
                        "confidence": {"score": 0.1 + 0.85 * share,
                                       "level": "high" if right else "low",
                                       "features": {"executed": 1.0, "share": share}}})
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "chess__flowsage.jsonl").write_text(
        "\n".join(json.dumps(r) for r in records) + "\n")
    (tmp_path / "eval.json").write_text(json.dumps(
        {"format": "agentflow-eval/1",
         "dataset": {"kind": "spider", "root": str(SPIDER), "split": "dev"}, "runs": {}}))
    proc = subprocess.run(
        [sys.executable, "-m", "agentflow.bench", "confidence_calibration", "--out",
         str(tmp_path), "--analyze-only", "--fit", "--json", str(tmp_path / "s.json")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["correct"] == 10 and summary["select_star"] == 30
    assert "SELECT * predictions: 30 of 40" in proc.stdout
    cross = summary["fit"]["cross"]
    assert cross["n"] == 40 and cross["rule"]["done_wrong"] == 0
    assert cross["rule"]["auroc"] == 1.0
