"""rvs_repeat: the real side's own repeat error, from saved real_vs_sim runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.bench.fidelity import rvs_repeat

ROOT = Path(__file__).resolve().parents[2]

ARGS = {"trace": "t.json", "rate": 0.05, "queries": 2, "skip": 0, "scale": 0.1,
        "max_prompt": None, "max_output": None, "assign": "query", "seed": 0,
        "cluster": "c.yaml"}


def write(path: Path, calls: list[float], queries: list[float], *, sim=(0.1, 0.2),
          first=None, **args) -> str:
    saved = {"args": {**ARGS, **args}, "calls": [{"id": f"q0/{i}"} for i in range(len(calls))],
             "call_real_s": calls, "query_real_s": queries,
             "median_call_error": sim[0], "p95_query_error": sim[1]}
    if first is not None:
        saved["calibrate_first"] = {"figures": {"median_call_error": first[0],
                                                "p95_query_error": first[1]}}
    path.write_text(json.dumps(saved))
    return str(path)


def test_identical_runs_have_no_repeat_error(tmp_path):
    a = write(tmp_path / "a.json", [1.0, 2.0, 4.0], [5.0, 8.0])
    b = write(tmp_path / "b.json", [1.0, 2.0, 4.0], [5.0, 8.0])
    out = rvs_repeat.summarise(rvs_repeat.load_runs([a, b]))
    assert out["repeat_median_call_error"] == 0.0
    assert out["repeat_p95_query_error"] == 0.0


def test_repeat_error_is_real_vs_sims_formula_with_the_other_run_in_the_sims_place(tmp_path):
    a = write(tmp_path / "a.json", [1.0, 2.0, 4.0], [10.0, 10.0])
    b = write(tmp_path / "b.json", [1.5, 2.0, 2.0], [12.0, 5.0])
    ra, rb = rvs_repeat.load_runs([a, b])
    # calls |b-a|/a = 0.5, 0, 0.5 -> median 0.5; queries 0.2, 0.5 -> P95 0.485
    assert rvs_repeat.repeat_error(ra, rb) == pytest.approx((0.5, 0.485))
    # the other way round: |a-b|/b = 1/3, 0, 1 -> 1/3; queries 1/6, 1 -> P95 0.9583
    assert rvs_repeat.repeat_error(rb, ra) == pytest.approx((1 / 3, 1 / 6 + 0.95 * 5 / 6))


def test_headline_is_calibrate_first_when_the_run_had_it(tmp_path):
    a = write(tmp_path / "a.json", [1.0], [1.0], sim=(0.3, 0.4), first=(0.1, 0.2))
    b = write(tmp_path / "b.json", [1.0], [1.0], sim=(0.3, 0.4))
    ra, rb = rvs_repeat.load_runs([a, b])
    assert (ra.sim_median_call, ra.sim_p95_query) == (0.1, 0.2)
    assert (rb.sim_median_call, rb.sim_p95_query) == (0.3, 0.4)


def test_pairs_across_cluster_files_stay_out_of_the_summary(tmp_path):
    a = write(tmp_path / "a.json", [1.0], [1.0])
    b = write(tmp_path / "b.json", [1.0], [1.0])
    c = write(tmp_path / "c.json", [3.0], [3.0], cluster="other.yaml")
    out = rvs_repeat.summarise(rvs_repeat.load_runs([a, b, c]))
    assert len(out["pairs"]) == 6 and sum(p["same_cluster"] for p in out["pairs"]) == 2
    assert out["repeat_median_call_error"] == 0.0


def test_runs_of_other_workloads_or_calls_are_refused(tmp_path, capsys):
    a = write(tmp_path / "a.json", [1.0, 2.0], [3.0])
    with pytest.raises(ValueError, match="rate"):
        rvs_repeat.load_runs([a, write(tmp_path / "b.json", [1.0, 2.0], [3.0], rate=0.1)])
    with pytest.raises(ValueError, match="calls are not"):
        rvs_repeat.load_runs([a, write(tmp_path / "c.json", [1.0], [3.0])])
    with pytest.raises(ValueError, match="at least two"):
        rvs_repeat.load_runs([a])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SystemExit):
        rvs_repeat.main([a, str(tmp_path / "bad.json")])
    assert "bad.json" in capsys.readouterr().err


def test_main_prints_the_two_last_lines(tmp_path, capsys):
    a = write(tmp_path / "a.json", [1.0, 2.0], [4.0])
    b = write(tmp_path / "b.json", [1.2, 2.0], [5.0])
    rvs_repeat.main([a, b, "--json", str(tmp_path / "out.json")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("repeat error, median per call: ")
    assert lines[-1].startswith("repeat error, P95 per query: ")
    assert json.loads((tmp_path / "out.json").read_text())["pairs"]
