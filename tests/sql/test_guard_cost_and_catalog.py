"""Two items of the hostile-tenant review, through the public API only (so the same test runs
on code from before the fixes, where it failed):

- a 66k-character SQL cost 9-11 s of guard CPU per call (and slowed every other query); now
  it is refused, with a typed error, in a fraction of that;
- ``pragma_database_list``, ``duckdb_databases`` (server paths) ran for any tenant; now a
  database view without the catalog refuses them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb
from agentflow.sql import Database, RejectedStatementError, SqlError, check_query

LONG = "SELECT " + " + ".join(["1"] * 16500)  # 66,000 characters, the review's size


def test_a_66k_character_statement_is_refused_cheaply() -> None:
    assert len(LONG) >= 66_000
    for dialect in ("sqlite", "duckdb", "postgres"):
        start = time.process_time()
        with pytest.raises(SqlError):
            check_query(LONG, dialect)
        cpu = time.process_time() - start
        assert cpu < 3.0, f"{dialect}: {cpu:.1f} s of guard CPU (before: 9-11 s)"


@pytest.mark.parametrize("engine,sql", [
    ("sqlite", "SELECT file FROM pragma_database_list"),
    ("duckdb", "SELECT path FROM duckdb_databases()"),
])
def test_catalog_path_functions_are_refused(library_db: Path, tmp_path: Path, engine: str,
                                            sql: str) -> None:
    path = library_db if engine == "sqlite" else \
        convert_sqlite_to_duckdb(library_db, tmp_path / "library.duckdb").dst
    with Database.open(path) as db:
        with pytest.raises(RejectedStatementError):
            db.execute(sql, timeout_s=10)
