"""agentflow bench gpu_step_check: its shape bookkeeping without PyTorch, and the whole script
on the CPU (tiny model) where PyTorch is installed."""

from __future__ import annotations

import json

import pytest

from agentflow import hardware
from agentflow.bench.fidelity import gpu_step_check as g


def test_copies_exceed_four_l2_caches_and_stop_at_the_cap():
    assert g.copies_for(2 * 4096 * 6144) * 2 * 4096 * 6144 >= 4 * g.L2_BYTES  # qkv: 50 MB
    assert g.copies_for(1e12) == 1
    assert g.copies_for(1.0) == 8
    assert g.copies_for(1.0, cap=4) == 4


def test_the_summary_counts_ratios_inside_the_band():
    rows = [g.Row("gemm", "a", 10.0, 10.5), g.Row("gemm", "b", 10.0, 5.0),
            g.Row("step", "c", 2.0, 2.0)]
    assert rows[1].ratio == 0.5
    lines = g.summarize(rows)
    assert "within 0.90-1.10: 1/2" in lines[0] and "min 0.500" in lines[0]
    assert "within 0.90-1.10: 1/1" in lines[1]


def test_default_shapes_fit_an_h200():
    """The largest decode-attention KV and the steps' weights stay far below 141 GB."""
    m = hardware.model("Llama-3.1-8B")
    kvd = m.kv_heads * m.head_dim
    assert max(2 * b * (c + 1) * kvd * 2 for b, c in g.DECODE) < 8e9
    assert m.weight_bytes < 20e9


def test_the_script_runs_end_to_end_on_the_cpu(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    tiny = hardware.ModelProfile("tiny-test", params_b=0.001, active_params_b=0.001, layers=2,
                                 hidden=64, heads=4, kv_heads=2, head_dim=16, ffn_hidden=128,
                                 vocab=256)
    monkeypatch.setitem(hardware.MODELS, "tiny-test", tiny)
    out = tmp_path / "check.json"
    assert g.main(["--quick", "--device", "cpu", "--model", "tiny-test", "--json",
                   str(out)]) == 0
    text = capsys.readouterr().out
    assert "FAILED" not in text
    saved = json.loads(out.read_text())
    groups = {r["group"] for r in saved["rows"]}
    assert groups == {"gemm", "elementwise", "kv_write", "lm_head", "decode_attn",
                      "prefill_attn", "step"}
    assert all(r["measured_us"] > 0 and r["predicted_us"] > 0 for r in saved["rows"])
    step = [r for r in saved["rows"] if r["group"] == "step"]
    assert all("sum_of_measured_ops_us" in r["extra"] for r in step)
