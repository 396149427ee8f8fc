"""``agentflow bench``: every benchmark is listed, answers --help, has a --quick form, and the
package finds its modules by name (no sys.path edits)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow.bench import registry
from agentflow.cli.main import main

BENCH_DIR = Path(registry.__file__).parent


def test_every_module_with_a_main_is_a_listed_benchmark(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    listing = capsys.readouterr().out
    for group in registry.GROUPS:
        for path in sorted((BENCH_DIR / group).glob("*.py")):
            is_benchmark = "\ndef main(" in path.read_text() or "\nasync def main(" in \
                path.read_text()
            assert (f"  {path.stem} " in listing) == is_benchmark, path
    assert len(registry.benchmarks()) >= 25


@pytest.mark.parametrize("name", sorted(registry.benchmarks()))
def test_each_benchmark_answers_help_and_names_its_quick_form(name: str, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["bench", name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: agentflow bench {name}" in out
    assert "--quick" in out  # the registry's line, or the benchmark's own flag


def test_quick_puts_the_benchmarks_arguments_first_so_the_users_win() -> None:
    bench = registry.find("scheduler-overhead")
    args = registry.expand_quick(bench, ["--quick", "--repeat", "3"])
    assert args[-2:] == ["--repeat", "3"] and "--quick" not in args
    assert args[:len(bench_quick := registry.quick_args(bench) or ())] == list(bench_quick)
    # a benchmark that parses --quick itself gets it unchanged
    assert registry.expand_quick(registry.find("real_vs_sim"), ["--quick"]) == ["--quick"]


def test_an_unknown_name_is_one_clear_line_with_the_close_ones(capsys) -> None:
    assert main(["bench", "schedular_overhead"]) == 2
    err = capsys.readouterr().err
    assert "no benchmark named 'schedular_overhead'" in err
    assert "did you mean scheduler_overhead" in err


def test_python_dash_m_runs_the_same_command() -> None:
    done = subprocess.run([sys.executable, "-m", "agentflow.bench", "max_tokens_clip"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "generate_candidate" in done.stdout


def test_no_benchmark_edits_sys_path() -> None:
    offenders = [str(p) for p in BENCH_DIR.rglob("*.py") if "sys.path" in p.read_text()]
    assert offenders == []


def test_every_benchmark_has_a_row_in_the_benchmarks_page() -> None:
    """docs/benchmarks.md lists what `agentflow bench --help` lists: a benchmark added without
    its row (or a row left for one removed) fails here."""
    from agentflow.bench.registry import benchmarks

    doc = (Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md").read_text()
    rows = set(re.findall(r"^\| `agentflow bench (\w+)`", doc, flags=re.M))
    assert rows == set(benchmarks())


def test_benchmarks_find_the_shared_data_through_one_path() -> None:
    """AGENTFLOW_SHARED moves the shared data for every benchmark: none builds its own path
    to a ``shared`` folder beside the checkout (seven did, so a fresh clone elsewhere could
    not run them)."""
    bench = Path(__file__).resolve().parents[2] / "agentflow" / "bench"
    own = [str(p.relative_to(bench)) for p in bench.rglob("*.py")
           if p.name != "paths.py" and '"shared"' in p.read_text(encoding="utf-8")]
    assert own == []


def test_the_docs_name_only_benchmarks_that_exist() -> None:
    """A benchmark removed or folded into another leaves no `agentflow bench NAME` behind in the
    README, the docs pages or a module's docstring."""
    root = Path(__file__).resolve().parents[2]
    texts = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "agentflow").rglob("*.py"))]
    named = {(m, str(p.relative_to(root))) for p in texts
             for m in re.findall(r"agentflow bench ([a-z][\w-]*)", p.read_text())}
    stale = sorted((m, p) for m, p in named if m.replace("-", "_") not in registry.benchmarks())
    assert stale == []


def test_the_listing_speaks_to_users_not_to_the_issue_tracker() -> None:
    """`agentflow bench --help` is read by people who never saw the issues: a summary says
    what a benchmark measures, not which issue asked for it."""
    assert [b.name for b in registry.benchmarks().values()
            if re.search(r"\bissue[- ]?\d", b.summary, flags=re.I)] == []
