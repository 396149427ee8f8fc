import json
import subprocess
import sys
from pathlib import Path

from agentflow.cli.main import main
from agentflow.datasets import load_spider
from agentflow.datasets.check import check_dataset


def test_check_bird_layout_prints_summary_line(bird_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "records.jsonl"
    assert main(["datasets", "check", str(bird_dir), "--jsonl", str(out), "--rule", "bird"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "4 passed, 0 failed"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["reason"] for r in records] == ["match"] * 4
    assert records[1]["evidence"] == "Italo Calvino refers to author.name"


def test_check_reports_a_broken_gold_query_and_exits_nonzero(spider_dir: Path, capsys) -> None:
    questions = json.loads((spider_dir / "dev.json").read_text())
    questions.append({"db_id": "library", "question": "broken", "query": "SELECT nope FROM book"})
    (spider_dir / "dev.json").write_text(json.dumps(questions))
    assert main(["datasets", "check", str(spider_dir), "--engine", "duckdb",
                 "--duckdb-dir", str(spider_dir / "duck")]) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "4 passed, 1 failed"
    assert "dev_4 [library] gold_error" in out and "nope" in out


def test_user_errors_are_one_clear_line(tmp_path: Path, capsys) -> None:
    assert main(["datasets", "check", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentflow: error: dataset folder not found")


def test_to_duckdb_single_file_and_folder(spider_dir: Path, tmp_path: Path, capsys) -> None:
    sqlite_file = spider_dir / "database" / "library" / "library.sqlite"
    out = str(tmp_path / "l.duckdb")
    assert main(["datasets", "to-duckdb", str(sqlite_file), "--out", out]) == 0
    assert (tmp_path / "l.duckdb").is_file()
    assert main(["datasets", "to-duckdb", str(spider_dir), "--out", str(tmp_path / "all")]) == 0
    assert (tmp_path / "all" / "library" / "library.duckdb").is_file()
    assert "converted 1 databases" in capsys.readouterr().out


def test_console_script_runs_as_a_module(bird_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "agentflow", "datasets", "check", str(bird_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "4 passed, 0 failed"


def test_shared_spider_dev_gold_passes_on_sqlite(shared_spider: Path) -> None:
    report = check_dataset(load_spider(shared_spider, "dev"), engine="sqlite")
    assert (report.passed, report.failed) == (972, 0)


def test_shared_spider_dev_on_duckdb_fails_only_on_listed_dialect_gaps(
        shared_spider: Path, tmp_path: Path) -> None:
    """Each gold's DuckDB answer is judged against its SQLite answer (not against itself, which
    could never show a changed answer). A DuckDB failure is either a gold query leaning on
    SQLite's implicit text->number casts, or a changed answer to a query whose answer SQL
    leaves open: ties under ORDER BY ... LIMIT."""
    report = check_dataset(load_spider(shared_spider, "dev"), engine="duckdb",
                           duckdb_dir=tmp_path / "duck")
    assert report.passed >= 930
    changed = 0
    for record in report.failures():
        v = record.verdict
        if v.reason == "mismatch":
            changed += 1
            assert v.detail.startswith("answer differs from SQLite's"), v
            sql = record.example.gold_sql.upper()
            assert "ORDER BY" in sql and "LIMIT" in sql, record.example
        else:
            assert v.reason == "gold_error", v
            assert "explicit" in v.detail and "cast" in v.detail
    assert changed > 0  # comparing with SQLite shows answers that changed
