"""PostgreSQL: a huge value is refused by the server before it crosses to the client.

PostgreSQL has no per-value limit (a text may reach 1 GB), and libpq reads a FETCH, and each
row's values, whole before the client can count a byte: a 240 MB ``string_agg`` ran 12 s on a
10 s limit and took the client to 754 MB (the bound is 512 + 100 MB). Now the statement runs
wrapped so that the server refuses a row over ``POSTGRES_ROW_BYTES``, rows come 64 per FETCH,
and the rows before the refused one are the answer, marked cut by bytes. A real server (the
session's ``pg_server``); peak memory is a fresh process's own (``sql_bombs.run_one``).
"""

from __future__ import annotations

import pytest

from agentflow.bench.security.sql_bombs import MEMORY_BOUND_MB, run_one
from agentflow.sql import Database, ExecutionError
from agentflow.sql.database import POSTGRES_ROW_BYTES

pytestmark = [pytest.mark.timeout(180), pytest.mark.postgres]
HUGE = "SELECT string_agg(repeat('x', 8000), '') FROM generate_series(1, 30000)"  # 240 MB


@pytest.fixture(scope="module")
def url(pg_server) -> str:
    pg_server.create_database("values")
    pg_server.create_reader("valuer", "va1ue-pass", "values")
    return pg_server.url("valuer", "values", "va1ue-pass")


def test_a_240_mb_value_is_refused_by_the_server_in_a_fresh_process(url) -> None:
    # a limit long enough for the server to build it: before, it arrived (754 MB, 12 s)
    r = run_one(url, "postgresql", HUGE, 30.0, cap_s=120)
    assert r.kind == "execution_error" and f"{POSTGRES_ROW_BYTES:,}" in (r.error or ""), r
    assert r.peak_mb is not None and r.peak_mb < MEMORY_BOUND_MB["postgresql"] - 300, r


def test_rows_before_an_oversized_one_are_the_answer_cut_by_bytes(url) -> None:
    sql = ("SELECT g, CASE WHEN g <= 150 THEN 'small ' || g ELSE repeat('x', 2000000) END AS v "
           "FROM generate_series(1, 200) AS s(g)")  # streams: no sort of the big rows
    with Database.open(url) as db:
        result = db.execute(sql, timeout_s=30)
    assert result.truncated_by == "bytes" and result.columns == ["g", "v"]
    assert 1 <= len(result.rows) <= 150
    assert result.rows == [(g, f"small {g}") for g in range(1, len(result.rows) + 1)]


def test_the_wrapper_keeps_order_duplicate_names_types_and_the_row_cap(url) -> None:
    with Database.open(url) as db:
        result = db.execute("SELECT g AS a, -g AS a, g::numeric / 2 AS half, 'x%' AS pct "
                            "FROM generate_series(1, 5) AS s(g) ORDER BY g DESC", timeout_s=30)
        assert result.columns == ["a", "a", "half", "pct"]
        assert [r[:2] for r in result.rows] == [(g, -g) for g in range(5, 0, -1)]
        assert float(result.rows[0][2]) == 2.5 and result.rows[0][3] == "x%"
        capped = db.execute("SELECT g FROM generate_series(1, 1000) AS s(g)", max_rows=300)
        assert len(capped.rows) == 300 and capped.truncated_by == "rows"
        many = db.execute("SELECT repeat('y', 900000) || g FROM generate_series(1, 300) AS s(g)",
                          timeout_s=30)  # rows under the row cap stop at the answer's cap
        assert many.truncated_by == "bytes" and 10 <= len(many.rows) <= 20


def test_a_first_row_over_the_cap_is_a_clear_error(url) -> None:
    with Database.open(url) as db:
        with pytest.raises(ExecutionError, match="the most one row may carry"):
            db.execute("SELECT repeat('z', 3000000)", timeout_s=30)
        assert db.execute("SELECT 1", timeout_s=5).rows == [(1,)]  # the pool is fine after
