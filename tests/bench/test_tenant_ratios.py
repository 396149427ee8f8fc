"""agentflow bench tenant_ratios: the issue-22 ratios over seeds, on tenant_cells-shaped files
with round numbers, so each printed figure is one you can work out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.bench.scheduler import tenant_ratios


def _cells(interactive_p95: float, light_p95: float, batch_qps: float) -> dict:
    tenant = lambda p95, qps=0.1: {"p95": p95, "qps": qps}  # noqa: E731
    return {"mixed-qwen/interactive-alone/flowsage": {"interactive": tenant(20.0)},
            "mixed-qwen/light-alone/flowsage": {"light": tenant(10.0)},
            "mixed-qwen/isolation-2x/flowsage": {"interactive": tenant(interactive_p95),
                                                 "batch": tenant(0, batch_qps)},
            "mixed-qwen/fairness/flowsage": {"light": tenant(light_p95),
                                             "heavy": tenant(0, 0.2)}}


def _write(folder: Path, seeds: dict[str, dict]) -> list[Path]:
    folder.mkdir()
    for name, cells in seeds.items():
        (folder / name).write_text(json.dumps(cells))
    return sorted(folder.iterdir())


def test_ratios_geomean_targets_and_flood_throughput(tmp_path: Path) -> None:
    off = _write(tmp_path / "off", {"seed0.json": _cells(30.0, 16.0, 0.2),
                                    "seed1.json": _cells(20.0, 12.0, 0.2)})
    on = _write(tmp_path / "on", {"seed0.json": _cells(22.0, 13.0, 0.18),
                                  "seed1.json": _cells(22.0, 12.0, 0.18)})
    lines = tenant_ratios.summarise({"off": off, "on": on})
    iso = next(x for x in lines if x.startswith("mixed-qwen isolation-2x")).split()
    # off: 1.5 and 1.0 -> geomean sqrt(1.5) = 1.225, one seed within 1.2, throughput x1
    # on: 1.1 twice, both within, batch at 0.9 of off's
    assert iso[2:] == ["1.225", "(1/2)", "x1.000", "1.100", "(2/2)", "x0.900"]
    fair = next(x for x in lines if x.startswith("mixed-qwen fairness")).split()
    assert fair[2:] == [f"{(1.6 * 1.2) ** 0.5:.3f}", "(1/2)", "x1.000",
                        f"{(1.3 * 1.2) ** 0.5:.3f}", "(2/2)", "x1.000"]
    worst = next(x for x in lines if x.startswith("worst ratio")).split()
    assert worst[2:] == ["1.600", "1.300"]


def test_labels_run_on_different_seeds_are_refused(tmp_path: Path) -> None:
    a = _write(tmp_path / "a", {"seed0.json": _cells(20.0, 10.0, 0.2)})
    b = _write(tmp_path / "b", {"seed1.json": _cells(20.0, 10.0, 0.2)})
    with pytest.raises(SystemExit, match="same seeds"):
        tenant_ratios.summarise({"a": a, "b": b})


def test_a_bad_argument_is_a_usage_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        tenant_ratios.main(["no-equals-sign"])
    with pytest.raises(SystemExit):
        tenant_ratios.main([f"x={tmp_path}/nothing*.json"])
    assert "no file matches" in capsys.readouterr().err
