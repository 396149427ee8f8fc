"""``agentflow eval`` end to end with a scripted backend (NOT a model) on the demo database:
real mode over 2 pipelines x 2 policies, resuming, simulated replay, Spider/BIRD layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.config import AgentFlowConfig
from agentflow.datasets import load_dataset
from agentflow.evaluation import EvalError, run_eval, spider_hardness
from agentflow.evaluation.spec import sample_examples
from agentflow.llm.scripted import ScriptedBackend

LIMIT, SEED = 8, 3
WRONG_ROWS = "SELECT 1"
BROKEN = "SELECT nope FROM nowhere"


def answering(gold: dict[str, str], plan: dict[str, str]):
    """A script answering each question by ``plan``: "right" (its gold SQL), "wrong" (SQL
    that runs but returns other rows) or "broken" (SQL that does not run)."""
    questions = sorted(gold, key=len, reverse=True)

    def sql_for(prompt: str) -> str:
        question = next(q for q in questions if q in prompt)
        return {"right": gold[question], "wrong": WRONG_ROWS, "broken": BROKEN}[plan[question]]

    def script(request) -> str:
        if request.stage in ("generate_sql", "generate_candidate", "revise", "refine"):
            return sql_for(request.prompt)
        if request.stage == "decomposer":
            return " the question\n-- SQL:\n" + sql_for(request.prompt)
        return {"extract_keywords": "stores, books", "selector": " stores, books"}.get(
            request.stage, " yes")
    return script


def factory(script, calls: list | None = None):
    def make(pipeline: str, policy: str):
        backend = ScriptedBackend(script, latency_s=0.002)
        if calls is not None:
            calls.append(backend)
        return {"scripted-0": backend}
    return make


@pytest.fixture(scope="module")
def demo_plan():
    dataset = load_dataset("demo")
    sample = sample_examples(dataset, LIMIT, SEED)
    outcomes = ["right", "wrong", "right", "broken", "right", "wrong", "wrong", "right"]
    plan = {e.question: o for e, o in zip(sample, outcomes)}
    plan.update({e.question: "wrong" for e in dataset.examples if e.question not in plan})
    gold = {e.question: e.gold_sql for e in dataset.examples}
    return dataset, sample, dict(zip([e.id for e in sample], outcomes)), answering(gold, plan)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory, demo_plan):
    _, _, _, script = demo_plan
    out = tmp_path_factory.mktemp("eval") / "out"
    summary = run_eval("demo", out=out, pipelines="single,chess", policies="vllm,flowsage",
                       limit=LIMIT, seed=SEED, config=AgentFlowConfig(fewshot=None),
                       backends=factory(script), rate=50.0, arrival="poisson", progress=False)
    return out, summary


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_real_mode_writes_every_report(real_run) -> None:
    out, summary = real_run
    keys = ["single__vllm", "single__flowsage", "chess__vllm", "chess__flowsage"]
    assert list(summary["runs"]) == keys
    assert json.loads((out / "summary.json").read_text())["runs"].keys() == set(keys)
    for name in ("slo_attainment.png", "latency_cdf.png", "stage_breakdown.png",
                 "accuracy_by_difficulty.png", "accuracy_by_database.png"):
        assert (out / "plots" / name).stat().st_size > 1000
    for key in keys:
        assert len(read_jsonl(out / "records" / f"{key}.jsonl")) == LIMIT
        assert len(read_jsonl(out / "traces" / f"{key}.jsonl")) == LIMIT
    report = (out / "report.md").read_text()
    assert "**Mode: real.**" in report and "nothing below is simulated" in report
    assert "scripted backend (NOT a model" in report
    assert "critical path" in report and "without queue waits" in report
    for key in keys:
        assert f"| {key} | {LIMIT} | 50.0% (4/8) | 50.0% (4/8) |" in report
    assert "![SLO attainment vs SLO scale](plots/slo_attainment.png)" in report


def test_accuracy_matches_the_script(real_run, demo_plan) -> None:
    out, summary = real_run
    _, sample, outcome, _ = demo_plan
    by_level: dict[str, list[str]] = {}
    for e in sample:
        by_level.setdefault(e.difficulty, []).append(outcome[e.id])
    for key, run in summary["runs"].items():
        acc = run["accuracy"]
        assert (acc["n"], acc["correct"], acc["accuracy"]) == (8, 4, 0.5)
        assert acc["correct_bird"] == 4
        assert acc["by_reason"]["match"] == 4 and acc["by_reason"]["mismatch"] == 3
        assert acc["by_reason"]["pred_error"] == 1
        assert run["status"] == {"done": 7, "failed": 1}
        for level, outcomes in by_level.items():
            got = run["by_difficulty"][level]
            assert (got["n"], got["correct"]) == (len(outcomes), outcomes.count("right"))
        assert run["by_database"]["bookshop"]["correct"] == 4
        records = {r["example_id"]: r for r in read_jsonl(out / "records" / f"{key}.jsonl")}
        for e in sample:
            r = records[e.id]
            assert r["gold_sql"] == e.gold_sql and r["difficulty"] == e.difficulty
            assert r["correct"] is (outcome[e.id] == "right")
            want_sql = {"right": e.gold_sql, "wrong": WRONG_ROWS, "broken": BROKEN}
            assert r["pred_sql"] == want_sql[outcome[e.id]]
            assert r["reason"] == {"right": "match", "wrong": "mismatch",
                                   "broken": "pred_error"}[outcome[e.id]]
            assert r["status"] == ("failed" if outcome[e.id] == "broken" else "done")
            assert r["latency_s"] > 0 and 0 < r["idle_latency_s"] <= r["latency_s"] + 1e-6
            assert r["calls"] >= 1 and r["prompt_tokens"] > 0 and r["completion_tokens"] > 0
            assert r["spider_hardness"] == spider_hardness(e.gold_sql)


def test_latency_numbers(real_run) -> None:
    _, summary = real_run
    single, chess = summary["runs"]["single__vllm"], summary["runs"]["chess__vllm"]
    assert single["usage_per_question"]["calls"] == 1.0
    assert chess["usage_per_question"]["calls"] >= 4.0  # keywords + 3 candidates (+ revisions)
    assert set(single["stages"]) == {"generate_sql", "execute"}
    assert {"extract_keywords", "generate_candidate", "select"} <= set(chess["stages"])
    for run in summary["runs"].values():
        lat = run["latency_s"]
        # percentiles are over answered questions: the "broken" one fails (agentflow.metrics)
        assert lat["n"] == run["status"]["done"] == 7
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert run["throughput_qps"] > 0
        curve = [v for v in run["slo_curve"].values()]
        assert curve == sorted(curve) and curve[-1] <= 1.0  # attainment grows with the scale
        assert set(run["slo_attainment"]) >= {"1", "2", "5"}
        assert run["stages"]["execute"]["queue_s_mean"] == 0.0  # tools never queue


def test_resume_skips_finished_questions(tmp_path: Path, demo_plan) -> None:
    _, sample, _, script = demo_plan
    out = tmp_path / "out"
    calls: list[ScriptedBackend] = []
    common = {"out": out, "pipelines": "single", "policies": "vllm", "seed": SEED,
              "config": AgentFlowConfig(fewshot=None), "backends": factory(script, calls),
              "progress": False, "plots": False}
    first = run_eval("demo", limit=4, **common)
    assert first["runs"]["single__vllm"]["asked_now"] == 4
    assert len(calls[-1].calls) == 4
    # a larger sample with the same seed holds the first: only the new questions are asked
    second = run_eval("demo", limit=LIMIT, **common)
    run = second["runs"]["single__vllm"]
    assert (run["asked_now"], run["reused"], run["questions"]) == (4, 4, LIMIT)
    assert len(calls[-1].calls) == 4
    assert {r["example_id"] for r in read_jsonl(out / "records" / "single__vllm.jsonl")} \
        == {e.id for e in sample}
    # nothing left to ask; a question that was cancelled last time is asked again
    n_backends = len(calls)
    again = run_eval("demo", limit=LIMIT, **common)
    assert again["runs"]["single__vllm"]["asked_now"] == 0 and len(calls) == n_backends
    records = read_jsonl(out / "records" / "single__vllm.jsonl")
    cancelled = {**records[0], "status": "cancelled"}
    with (out / "records" / "single__vllm.jsonl").open("a") as fh:
        fh.write(json.dumps(cancelled) + "\n")
    last = run_eval("demo", limit=LIMIT, **common)
    assert last["runs"]["single__vllm"]["asked_now"] == 1
    assert last["runs"]["single__vllm"]["accuracy"]["n"] == LIMIT
    # a different configuration cannot silently mix with the recorded answers
    with pytest.raises(EvalError, match="different configuration"):
        run_eval("demo", limit=LIMIT, **{**common, "config": AgentFlowConfig(
            fewshot=None, sql_timeout_s=3.0)})
    with pytest.raises(EvalError, match="holds an evaluation of demo"):
        run_eval(f"spider:{tmp_path}", limit=LIMIT, **common)


def test_simulated_mode_replays_the_recording_for_every_preset(real_run) -> None:
    out, real = real_run
    summary = run_eval(out=out, cluster="paper-4gpu", rate=2.0, seed=1, progress=False)
    sim_out = out / "simulated-paper-4gpu"
    presets = ["vllm", "hexgen-flow", "sagesched", "llf", "flowsage"]
    assert list(summary["runs"]) == [f"{p}__{q}" for p in ("single", "chess") for q in presets]
    assert summary["mode"] == "simulated" and summary["out"] == str(sim_out)
    for key, run in summary["runs"].items():
        pipeline = run["pipeline"]
        recorded = real["runs"][f"{pipeline}__vllm"]
        assert run["recorded_policy"] == "vllm"  # the first recorded run of the pipeline
        assert run["accuracy"] == recorded["accuracy"]  # accuracy comes from the recording
        assert run["questions"] == LIMIT and run["latency_s"]["n"] == run["status"]["done"]
        assert run["usage_per_question"] == recorded["usage_per_question"]
        records = read_jsonl(sim_out / "records" / f"{key}.jsonl")
        assert {r["mode"] for r in records} == {"simulated"}
        assert all(r["latency_s"] > 0 and r["idle_latency_s"] > 0 for r in records)
    for name in ("summary.json", "report.md", "plots/slo_attainment.png",
                 "plots/latency_cdf.png", "plots/stage_breakdown.png"):
        assert (sim_out / name).is_file()
    report = (sim_out / "report.md").read_text()
    assert "**Mode: simulated.**" in report and "accuracy is measured" in report
    assert "latency is simulated" in report and "paper-4gpu" in report
    # same trace, same seed, same policy: same simulated result
    again = run_eval(out=out, cluster="paper-4gpu", pipelines="chess", policies="flowsage",
                     rate=2.0, seed=1, progress=False, plots=False)
    assert again["runs"]["chess__flowsage"]["latency_s"] == \
        summary["runs"]["chess__flowsage"]["latency_s"]


def test_simulated_mode_from_a_trace_file_judges_it_afresh(real_run, tmp_path: Path) -> None:
    out, _real = real_run
    summary = run_eval("demo", out=tmp_path / "sim", cluster="h100-8b-4",
                       traces=out / "traces" / "single__flowsage.jsonl", policies="vllm",
                       rate=1.0, progress=False, plots=False)
    run = summary["runs"]["single__vllm"]
    assert run["accuracy"]["correct"] == 4 and run["accuracy"]["n"] == LIMIT
    assert run["recorded_policy"] is None


def test_simulated_mode_runs_its_queries_in_the_slo_class(real_run, tmp_path: Path) -> None:
    out, _real = real_run
    trace = out / "traces" / "single__flowsage.jsonl"

    def replay(**kw):
        name = kw.get("slo_class", "default")
        summary = run_eval("demo", out=tmp_path / name, cluster="paper-4gpu", traces=trace,
                           policies="flowsage", rate=1.0, progress=False, plots=False, **kw)
        records = read_jsonl(tmp_path / name / "simulated-paper-4gpu" / "records" /
                             "single__flowsage.jsonl")
        return summary, records

    summary, records = replay()  # batch by default, as in real mode
    assert summary["settings"]["slo_class"] == "batch"
    assert {r["slo_class"] for r in records} == {"batch"}  # as the scheduler admitted it
    summary, records = replay(slo_class="interactive")
    assert summary["settings"]["slo_class"] == "interactive"
    assert {r["slo_class"] for r in records} == {"interactive"}
    with pytest.raises(EvalError, match="--slo-class: unknown SLO class 'urgent'"):
        replay(slo_class="urgent")


def test_spider_layout_uses_spider_hardness(spider_dir: Path, tmp_path: Path) -> None:
    dataset = load_dataset(spider_dir)
    gold = {e.question: e.gold_sql for e in dataset.examples}
    plan = {q: "right" for q in gold}
    plan[dataset.examples[0].question] = "wrong"
    summary = run_eval(f"spider:{spider_dir}:dev", out=tmp_path / "out", pipelines="single",
                       policies="sagesched", config=AgentFlowConfig(fewshot=None),
                       backends={"scripted-0": ScriptedBackend(answering(gold, plan))},
                       progress=False, plots=False)
    run = summary["runs"]["single__sagesched"]
    assert (run["accuracy"]["correct"], run["accuracy"]["n"]) == (3, 4)
    assert run["difficulty_sources"] == ["spider hardness"]
    levels = [spider_hardness(e.gold_sql) for e in dataset.examples]
    assert {k: v["n"] for k, v in run["by_difficulty"].items()} == \
        {lv: levels.count(lv) for lv in set(levels)}
    assert run["by_database"]["library"]["correct"] == 3


def test_bird_layout_uses_its_labels(bird_dir: Path, tmp_path: Path) -> None:
    dataset = load_dataset(bird_dir)
    gold = {e.question: e.gold_sql for e in dataset.examples}
    summary = run_eval(f"bird:{bird_dir}", out=tmp_path / "out", pipelines="single",
                       policies="llf", config=AgentFlowConfig(fewshot=None),
                       backends={"scripted-0": ScriptedBackend(
                           answering(gold, {q: "right" for q in gold}))},
                       progress=False, plots=False)
    run = summary["runs"]["single__llf"]
    assert run["accuracy"]["accuracy"] == 1.0 and run["accuracy"]["accuracy_bird"] == 1.0
    assert run["difficulty_sources"] == ["bird label"]
    assert {k: v["n"] for k, v in run["by_difficulty"].items()} == \
        {"simple": 2, "moderate": 1, "challenging": 1}


def test_eval_and_simulate_report_the_same_attainment_on_the_same_trace(real_run,
                                                                        tmp_path: Path) -> None:
    """One metrics vocabulary: `agentflow eval --cluster --traces` (no dataset: the replayed
    lines carry no usage, which used to crash the summary) and `agentflow simulate` agree."""
    from agentflow.cli.main import main

    out, _real = real_run
    trace = out / "traces" / "chess__flowsage.jsonl"
    recorded = read_jsonl(trace)
    assert {r["status"] for r in recorded} == {"done", "failed"}  # "broken" answers fail
    summary = run_eval(out=tmp_path / "eval", cluster="paper-4gpu", traces=trace,
                       policies="flowsage,vllm", rate=0.5, seed=4, progress=False,
                       plots=False)
    sim_json = tmp_path / "sim.json"
    assert main(["simulate", "--trace", str(trace), "--cluster", "paper-4gpu", "--policy",
                 "flowsage,vllm", "--rate", "0.5", "--seed", "4", "--queries",
                 str(len(recorded)), "--slo-scale", "2", "--json", str(sim_json)]) == 0
    simulated = json.loads(sim_json.read_text())["policies"]
    for policy in ("flowsage", "vllm"):
        evaluated = summary["runs"][f"chess__{policy}"]["slo_attainment"]
        assert simulated[policy]["slo_attainment"] == {
            k: evaluated[k] for k in simulated[policy]["slo_attainment"]}
        assert simulated[policy]["failed"] == sum(r["status"] == "failed" for r in recorded)
        # a failed query never meets an SLO, however generous
        assert evaluated["5"] <= 1 - simulated[policy]["failed"] / len(recorded)
        # and the other shared numbers agree too
        run = summary["runs"][f"chess__{policy}"]
        assert run["latency_s"]["p95"] == pytest.approx(simulated[policy]["p95"])
        assert run["throughput_qps"] == pytest.approx(simulated[policy]["throughput_qps"])


def test_latency_cdf_is_over_answered_questions(tmp_path: Path, monkeypatch) -> None:
    """The CDF plot shows the distribution the P50/P95 table is computed from: a quick
    failure is not an answered question (agentflow.metrics)."""
    from matplotlib.axes import Axes

    from agentflow.evaluation.report import write_plots
    from agentflow.evaluation.scoring import summarize_run

    records = [{"status": "done", "latency_s": 2.0, "idle_latency_s": 1.0, "correct": True,
                "reason": "match", "difficulty": "easy", "db_id": "demo"},
               {"status": "failed", "latency_s": 0.5, "idle_latency_s": 1.0, "correct": False,
                "reason": "pred_error", "difficulty": "easy", "db_id": "demo"}]
    summary = {"mode": "real", "runs": {"r": summarize_run(records, slo_scale=2.0)}}
    steps: list[list[float]] = []
    real_step = Axes.step
    monkeypatch.setattr(Axes, "step", lambda self, x, *a, **k: (steps.append(list(x)),
                                                                 real_step(self, x, *a, **k)))
    write_plots(tmp_path, summary, {"r": records})
    assert steps == [[2.0]]
    assert summary["runs"]["r"]["latency_s"]["n"] == 1
