"""Runaway SQL statements against the 1 s limit: time to stop and peak RSS, one process each.

    python3 benchmarks/sql_limits.py [--limit 1.0]

Prints one line per statement (engine, outcome, seconds, peak RSS MB). Each statement runs in
a fresh process, so its peak RSS is its own. The statements are the ones of issue 11 §2 and
tests/test_sql_limits.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb  # noqa: E402
from tests.conftest import make_library_sqlite  # noqa: E402
from tests.test_sql_limits import _CHILD, RUNAWAYS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_path = make_library_sqlite(Path(tmp) / "library.sqlite")
        paths = {"sqlite": sqlite_path,
                 "duckdb": convert_sqlite_to_duckdb(sqlite_path, Path(tmp) / "l.duckdb").dst}
        print(f"{'engine':7} {'outcome':16} {'seconds':>8} {'peak MB':>8}  statement")
        for engine, sql in RUNAWAYS:
            out = subprocess.run([sys.executable, "-c", _CHILD, str(paths[engine]), sql,
                                  str(args.limit)], capture_output=True, text=True,
                                 cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{engine:7} {r['kind']:16} {r['elapsed']:8.2f} {r['peak_mb']:8.0f}  {sql[:70]}")


if __name__ == "__main__":
    main()
