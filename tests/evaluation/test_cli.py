"""``agentflow eval`` on the command line: clear errors for bad arguments, and a replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.cli.main import main
from agentflow.config import AgentFlowConfig
from agentflow.evaluation import EvalError, parse_dataset_spec, run_eval
from agentflow.llm.scripted import ScriptedBackend


def fails(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentflow: error: ")
    return err


@pytest.mark.parametrize("argv,message", [
    (["--dataset", "nope:x"], "unknown kind 'nope'"),
    (["--dataset", "spider"], "give the folder"),
    (["--dataset", "spider:/no/such/folder"], "folder not found"),
    (["--dataset", "demo", "--pipeline", "chesss"], "unknown pipeline 'chesss'"),
    (["--dataset", "demo", "--pipeline", "single,single"], "pipeline listed twice: single"),
    (["--dataset", "demo", "--policy", "fastest"], "unknown policy 'fastest'"),
    (["--dataset", "demo", "--policy", "oracle"], "exists only in the simulator"),
    (["--dataset", "demo", "--arrival", "gamma:2"], "needs --rate"),
    (["--dataset", "demo", "--rate", "1", "--arrival", "zipf"], "unknown arrival process"),
    (["--dataset", "demo", "--rate", "0"], "--rate must be a positive"),
    (["--dataset", "demo", "--limit", "0"], "--limit must be a positive"),
    (["--dataset", "demo", "--slo-scale", "-1"], "--slo-scale must be positive"),
    (["--dataset", "demo", "--traces", "t.jsonl"], "give --cluster too"),
    (["--cluster", "paper-4gpu", "--slo", "5"], "--slo (seconds) is for real mode"),
    (["--cluster", "no-such-cluster"], "unknown cluster"),
    (["--cluster", "paper-4gpu"], "no recorded real run"),
    (["--cluster", "paper-4gpu", "--traces", "missing.jsonl"], "file not found"),
    (["--pipeline", "single"], "--dataset is required"),
])
def test_bad_arguments_give_one_clear_line(capsys, tmp_path: Path, argv, message) -> None:
    err = fails(capsys, ["eval", *argv, "--out", str(tmp_path / "out")])
    assert message in err, err
    assert not (tmp_path / "out" / "summary.json").exists()


def test_config_and_cluster_are_exclusive(capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--dataset", "demo", "--config", "x.yaml", "--cluster", "paper-4gpu"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(EvalError, match="give one of them"):
        run_eval("demo", out=tmp_path, config=AgentFlowConfig(), cluster="paper-4gpu")


def test_bad_config_file_and_wrong_layout(capsys, tmp_path: Path, bird_dir: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("instances: []\n")
    err = fails(capsys, ["eval", "--dataset", "demo", "--config", str(bad),
                         "--out", str(tmp_path / "o1")])
    assert "--config" in err and "at least one instance" in err
    err = fails(capsys, ["eval", "--dataset", f"spider:{bird_dir}", "--out", str(tmp_path / "o2")])
    assert "is not a Spider folder" in err
    err = fails(capsys, ["eval", "--dataset", f"bird:{bird_dir}:test",
                         "--out", str(tmp_path / "o3")])
    assert "is not a BIRD folder with split 'test'" in err


def test_dataset_specs(tmp_path: Path) -> None:
    assert parse_dataset_spec("demo").split == "dev"
    spec = parse_dataset_spec(f"bird:{tmp_path}:train")
    assert (spec.kind, spec.root, spec.split) == ("bird", str(tmp_path.resolve()), "train")
    assert parse_dataset_spec(f"spider:{tmp_path}").split == "dev"


def test_cli_replays_a_trace_file(capsys, tmp_path: Path) -> None:
    # record two questions in real mode (scripted backend, NOT a model), replay them by CLI
    out = tmp_path / "out"
    real = run_eval("demo", out=out, pipelines="single", policies="vllm", limit=2,
                    arrival="steps:40/1,5/1", config=AgentFlowConfig(fewshot=None),
                    progress=False, plots=False,
                    backends={"scripted-0": ScriptedBackend({"generate_sql": "SELECT 1"})})
    assert real["settings"]["arrivals"] == "steps:40/1,5/1, seed 0"
    assert main(["eval", "--cluster", "mixed-qwen", "--out", str(out), "--policy",
                 "vllm,oracle", "--rate", "0.5", "--arrival", "gamma:2", "--no-plots"]) == 0
    printed = capsys.readouterr().out
    assert "simulated mode on mixed-qwen" in printed and "report.md" in printed
    summary = json.loads((out / "simulated-mixed-qwen" / "summary.json").read_text())
    assert list(summary["runs"]) == ["single__vllm", "single__oracle"]
    assert summary["settings"]["arrival"] == "gamma:2"
    assert all(r["accuracy"]["correct"] == 0 for r in summary["runs"].values())
