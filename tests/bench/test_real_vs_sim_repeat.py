"""real_vs_sim --repeat: the real side's own repeat error, from saved real_vs_sim runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentflow.bench.fidelity import real_vs_sim, repeat

ROOT = Path(__file__).resolve().parents[2]

ARGS = {"trace": "t.json", "rate": 0.05, "queries": 2, "skip": 0, "scale": 0.1,
        "max_prompt": None, "max_output": None, "assign": "query", "seed": 0,
        "cluster": "c.yaml"}


def write(path: Path, calls: list[float], queries: list[float], *, sim=(0.1, 0.2),
          first=None, lone=None, instances=None, outputs=None, sim_s=None, **args) -> str:
    saved = {"args": {**ARGS, **args}, "calls": [{"id": f"q0/{i}"} for i in range(len(calls))],
             "call_real_s": calls, "query_real_s": queries,
             "median_call_error": sim[0], "p95_query_error": sim[1]}
    if first is not None:
        saved["calibrate_first"] = {"figures": {"median_call_error": first[0],
                                                "p95_query_error": first[1]}}
        if lone is not None:
            saved["calibrate_first"]["instances"] = {n: {"rows": r} for n, r in lone.items()}
        if sim_s is not None:
            saved["calibrate_first"].update(call_sim_s=sim_s[0], query_sim_s=sim_s[1])
    if instances is not None:
        saved["call_instance"] = instances
    if outputs is not None:
        saved["call_output_tokens"] = outputs
    path.write_text(json.dumps(saved))
    return str(path)


def test_identical_runs_have_no_repeat_error(tmp_path):
    a = write(tmp_path / "a.json", [1.0, 2.0, 4.0], [5.0, 8.0])
    b = write(tmp_path / "b.json", [1.0, 2.0, 4.0], [5.0, 8.0])
    out = repeat.summarise(repeat.load_runs([a, b]))
    assert out["repeat_median_call_error"] == 0.0
    assert out["repeat_p95_query_error"] == 0.0


def test_repeat_error_is_real_vs_sims_formula_with_the_other_run_in_the_sims_place(tmp_path):
    a = write(tmp_path / "a.json", [1.0, 2.0, 4.0], [10.0, 10.0])
    b = write(tmp_path / "b.json", [1.5, 2.0, 2.0], [12.0, 5.0])
    ra, rb = repeat.load_runs([a, b])
    # calls |b-a|/a = 0.5, 0, 0.5 -> median 0.5; queries 0.2, 0.5 -> P95 0.485
    assert repeat.repeat_error(ra, rb) == pytest.approx((0.5, 0.485))
    # the other way round: |a-b|/b = 1/3, 0, 1 -> 1/3; queries 1/6, 1 -> P95 0.9583
    assert repeat.repeat_error(rb, ra) == pytest.approx((1 / 3, 1 / 6 + 0.95 * 5 / 6))


def test_headline_is_calibrate_first_when_the_run_had_it(tmp_path):
    a = write(tmp_path / "a.json", [1.0], [1.0], sim=(0.3, 0.4), first=(0.1, 0.2))
    b = write(tmp_path / "b.json", [1.0], [1.0], sim=(0.3, 0.4))
    ra, rb = repeat.load_runs([a, b])
    assert (ra.sim_median_call, ra.sim_p95_query) == (0.1, 0.2)
    assert (rb.sim_median_call, rb.sim_p95_query) == (0.3, 0.4)


def test_pairs_across_cluster_files_stay_out_of_the_summary(tmp_path):
    a = write(tmp_path / "a.json", [1.0], [1.0])
    b = write(tmp_path / "b.json", [1.0], [1.0])
    c = write(tmp_path / "c.json", [3.0], [3.0], cluster="other.yaml")
    out = repeat.summarise(repeat.load_runs([a, b, c]))
    assert len(out["pairs"]) == 6 and sum(p["same_cluster"] for p in out["pairs"]) == 2
    assert out["repeat_median_call_error"] == 0.0


def test_runs_of_other_workloads_or_calls_are_refused(tmp_path, capsys):
    a = write(tmp_path / "a.json", [1.0, 2.0], [3.0])
    with pytest.raises(ValueError, match="rate"):
        repeat.load_runs([a, write(tmp_path / "b.json", [1.0, 2.0], [3.0], rate=0.1)])
    with pytest.raises(ValueError, match="calls are not"):
        repeat.load_runs([a, write(tmp_path / "c.json", [1.0], [3.0])])
    with pytest.raises(ValueError, match="at least two"):
        repeat.load_runs([a])
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SystemExit):
        real_vs_sim.main(["--repeat", a, str(tmp_path / "bad.json")])
    assert "bad.json" in capsys.readouterr().err


def test_main_prints_the_two_last_lines(tmp_path, capsys):
    a = write(tmp_path / "a.json", [1.0, 2.0], [4.0])
    b = write(tmp_path / "b.json", [1.2, 2.0], [5.0])
    real_vs_sim.main(["--repeat", a, b, "--json", str(tmp_path / "out.json")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-2].startswith("repeat error, median per call: ")
    assert lines[-1].startswith("repeat error, P95 per query: ")
    assert json.loads((tmp_path / "out.json").read_text())["pairs"]


def test_the_second_run_is_speed_matched_as_the_simulator_is(tmp_path):
    """Run B on a machine 10% slower throughout: its lone requests took 1.1x, and so did
    every call; matched to A by those lone requests, B predicts A exactly, where unmatched
    it is 1/11 off on every call."""
    lone_a = {"i0": [[100, 8, 0.1, 0.5], [400, 1, 0.4, 0.4]], "i1": [[100, 8, 0.1, 0.6]]}
    lone_b = {"i0": [[101, 8, 0.11, 0.55], [400, 1, 0.44, 0.44]],
              "i1": [[100, 8, 0.11, 0.66]]}
    common = {"first": (0.2, 0.3), "instances": ["i0", "i1", "i0"], "outputs": [8, 1, 30]}
    a = write(tmp_path / "a.json", [1.0, 2.0, 4.0], [7.0], lone=lone_a,
              sim_s=([1.5, 2.0, 4.0], [7.7]), **common)
    b = write(tmp_path / "b.json", [1.1, 2.2, 4.4], [7.7], lone=lone_b, **common)
    ra, rb = repeat.load_runs([a, b])
    assert repeat.speed_factors(ra, rb) == pytest.approx({"i0": 1 / 1.1, "i1": 1 / 1.1})
    out = repeat.summarise([ra, rb])
    pair = out["pairs"][0]
    assert pair["speed_matched"] and pair["median_call_error"] == pytest.approx(0.1)
    assert pair["matched"]["median_call_error"] == pytest.approx(0.0, abs=1e-12)
    assert out["repeat_p95_query_error"] == pytest.approx(0.0, abs=1e-12)
    # the simulator on A, the same figures: errors 0.5, 0, 0 of latencies 1, 2, 4
    sim = out["sim"][0]["figures"]
    assert sim["median_call_error"] == 0.0
    assert sim["time_weighted_call_error"] == pytest.approx(0.5 / 7)
    assert sim["median_call_error_gt2"] == pytest.approx(0.25)  # calls of 8 and 30 tokens
    assert sim["p95_query_error"] == pytest.approx(0.1)
    # other lone shapes, or none: compared as recorded, and said so
    c = write(tmp_path / "c.json", [1.1, 2.2, 4.4], [7.7], first=(0.2, 0.3),
              instances=["i0", "i1", "i0"], lone={"i0": [[100, 9, 0.1, 0.5]] * 2,
                                                  "i1": [[100, 8, 0.1, 0.6]]})
    assert repeat.speed_factors(ra, repeat.load_runs([a, c])[1]) is None
    plain = repeat.summarise(repeat.load_runs([a, write(tmp_path / "d.json",
                                                                [1.1, 2.2, 4.4], [7.7])]))
    assert not plain["all_speed_matched"]
    assert plain["repeat_median_call_error"] == pytest.approx((0.1 + 1 / 11) / 2)  # both pairs


def test_the_floor_is_the_repeat_over_root_two_and_p95_is_pooled(tmp_path, capsys):
    a = write(tmp_path / "a.json", [1.0, 2.0], [4.0, 5.0])
    b = write(tmp_path / "b.json", [1.2, 2.0], [5.0, 5.0])
    real_vs_sim.main(["--repeat", a, b])
    lines = capsys.readouterr().out.strip().splitlines()
    median = float(lines[-2].rsplit(" ", 1)[1])
    floor = [ln for ln in lines if ln.startswith("sqrt(2) floor")][0]
    assert f"median per call {median / 2 ** 0.5:.4f}" in floor
    out = repeat.summarise(repeat.load_runs([a, b]))
    # pooled: both pairs' 2 queries each (errors 0.25, 0 and 0.2, 0)
    assert out["repeat_pooled_queries"] == 4
    assert out["repeat_pooled_p95_query_error"] == pytest.approx(
        float(np.percentile([0.25, 0.0, 0.2, 0.0], 95)))


def test_without_repeat_the_cluster_is_required(capsys):
    with pytest.raises(SystemExit):
        real_vs_sim.main(["--trace", "t.json", "--rate", "0.05"])
    assert "--cluster is required (unless --repeat)" in capsys.readouterr().err


def test_runs_without_lone_rows_are_matched_by_the_probe_before_as_their_headline_is(
        tmp_path):
    """No calibrate-first rows, but the speed probe before each replay: A's probe cost its
    reference (3.0), B's 1.2x it, so B's headline was priced at x1.1 (half the probe, half
    the reference); B's calls took 1.1x A's, and matched by the same pricing predict A
    exactly. A run without the probe is compared as recorded."""
    common = {"instances": ["i0", "i1", "i0"], "outputs": [8, 1, 30]}
    a = write(tmp_path / "a.json", [1.0, 2.0, 4.0], [7.0], **common)
    b = write(tmp_path / "b.json", [1.1, 2.2, 4.4], [7.7], **common)
    refs = {"i0": 3.0, "i1": 3.0}
    for path, before in ((a, {"i0": 3.0, "i1": 3.0}), (b, {"i0": 3.6, "i1": 3.6})):
        saved = json.loads(Path(path).read_text())
        saved["speed_probe"] = {"before": before, "after": before, "reference": refs}
        Path(path).write_text(json.dumps(saved))
    ra, rb = repeat.load_runs([a, b])
    assert rb.predicted_probe_s == pytest.approx({"i0": 3.3, "i1": 3.3})
    assert repeat.speed_factors(ra, rb) == pytest.approx({"i0": 1 / 1.1, "i1": 1 / 1.1})
    out = repeat.summarise([ra, rb])
    assert out["all_speed_matched"]
    assert out["pairs"][0]["matched"]["median_call_error"] == pytest.approx(0.0, abs=1e-12)
    c = write(tmp_path / "c.json", [1.1, 2.2, 4.4], [7.7], **common)
    assert repeat.speed_factors(ra, repeat.load_runs([a, c])[1]) is None
