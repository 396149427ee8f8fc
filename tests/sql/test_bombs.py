"""Issue 20 §3: resource bombs are stopped, on SQLite, DuckDB and PostgreSQL.

The statements are those of ``agentflow bench sql_bombs`` (the issue's four, their variants on
every engine, and builders that stay under the guard's caps). Those the guard refuses are
checked through a real ``Database`` in this process; each one is also run in a fresh process
(its peak RSS is its own) and must be answered with its memory under the stated bound. No
assertion compares wall-clock times: a child still running after ``CAP_S`` (30x the limit) is
what "not stopped" means here.
"""

from __future__ import annotations

import pytest

from agentflow.bench.security.sql_bombs import BOMBS, MEMORY_BOUND_MB, make_sqlite, run_one
from agentflow.datasets.to_duckdb import convert_sqlite_to_duckdb
from agentflow.sql import Database, RejectedStatementError
from agentflow.sql.formats import MAX_FORMAT_WIDTH

LIMIT_S = 2.0
CAP_S = 60.0

REFUSED = [(b.engine, b.sql) for b in BOMBS if b.stopper == "guard"]
ENGINE_STOPPED = [(b.engine, b.sql) for b in BOMBS if b.stopper == "engine"]
ISSUE = REFUSED[:4]


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("bombs")
    sqlite_path = make_sqlite(base / "bombs.sqlite")
    return {"sqlite": str(sqlite_path),
            "duckdb": str(convert_sqlite_to_duckdb(sqlite_path, base / "bombs.duckdb").dst)}


@pytest.fixture(scope="module")
def pg_url(pg_server) -> str:
    pg_server.create_database("bombs")
    pg_server.create_reader("bomber", "b0mb-pass", "bombs")
    return pg_server.url("bomber", "bombs", "b0mb-pass")


def _target(request, targets: dict[str, str], engine: str) -> str:
    return request.getfixturevalue("pg_url") if engine == "postgresql" else targets[engine]


def test_the_split_covers_every_statement() -> None:
    assert len(REFUSED) >= 15 and len(ENGINE_STOPPED) >= 8
    assert {e for e, _ in REFUSED} == {e for e, _ in ENGINE_STOPPED} == \
        {"sqlite", "duckdb", "postgresql"}


@pytest.mark.parametrize("engine,sql", REFUSED)
def test_the_guard_refuses_it_before_it_runs(request, targets, engine: str, sql: str) -> None:
    with Database.open(_target(request, targets, engine)) as db:
        with pytest.raises(RejectedStatementError) as info:
            db.execute(sql, timeout_s=LIMIT_S)
    assert any(word in str(info.value) for word in
               ("format", "runs SQL given as text", f"{MAX_FORMAT_WIDTH:,}", "would build"))


@pytest.mark.parametrize("engine,sql", ISSUE)
def test_the_issue_statements_in_a_fresh_process(request, targets, engine: str,
                                                  sql: str) -> None:
    r = run_one(_target(request, targets, engine), engine, sql, LIMIT_S, cap_s=CAP_S)
    assert r.kind == "rejected", (r.kind, r.error)
    assert r.peak_mb is not None and r.peak_mb < MEMORY_BOUND_MB[engine], r


@pytest.mark.slow
@pytest.mark.parametrize("engine,sql", ENGINE_STOPPED)
def test_builders_under_the_caps_are_stopped_by_the_engine_or_the_watchdog(
        request, targets, engine: str, sql: str) -> None:
    r = run_one(_target(request, targets, engine), engine, sql, LIMIT_S, cap_s=CAP_S)
    # (the guard's expansion and width bounds now refuse some before they run)
    assert r.kind in ("timeout", "execution_error", "too_complex", "rejected"), (r.kind, r.error)
    assert r.peak_mb is not None and r.peak_mb < MEMORY_BOUND_MB[engine], r


@pytest.mark.parametrize("dialect,sql", [
    ("sqlite", "SELECT printf('%5.2f|%-8s|%08d|%.3s|%c', 3.14159, 'ab', 42, 'abcdef', 'x')"),
    ("sqlite", "SELECT printf('%.*f', 2, 3.14159), printf('%%'), format('%*d', 5, 1)"),
    ("duckdb", "SELECT printf('%5.2f|%-8s|%08d', 3.14159, 'ab', 42), "
               "format('{:>10}|{:<5}|{:.2f}|{}|{{}}', 'a', 'b', 2.5, 7)"),
    ("postgres", "SELECT format('%s|%-10s|%5s|%1$s|%%', 'a', 'b', 'c'), "
                 "format('%*s', 10, 'x')"),
])
def test_ordinary_formats_pass(dialect: str, sql: str) -> None:
    from agentflow.sql import check_query

    check_query(sql, dialect)


@pytest.mark.parametrize("dialect,sql", [
    ("sqlite", f"SELECT printf('%{MAX_FORMAT_WIDTH + 1}d', 1)"),
    ("sqlite", f"SELECT printf('%.{MAX_FORMAT_WIDTH + 1}f', 1)"),
    ("sqlite", "SELECT printf('%*d', -999999999, 1)"),
    ("sqlite", "SELECT printf(s, 1) FROM t"),
    ("duckdb", f"SELECT format('{{:{MAX_FORMAT_WIDTH + 1}}}', 1)"),
    ("duckdb", "SELECT format('{:>{}}', 'x', 5)"),
    ("duckdb", "SELECT \"printf\"('%0999999999d', 1)"),
    ("duckdb", "SELECT PRINTF('%0999999999d', 1)"),
    ("postgres", "SELECT format('%1$999999999s', 'x')"),
    ("postgres", "SELECT format('%*1$s', 999999999)"),
    ("postgres", "SELECT pg_catalog.format('%999999999s', 1)"),
])
def test_widths_over_the_cap_are_refused_however_written(dialect: str, sql: str) -> None:
    from agentflow.sql import check_query

    with pytest.raises(RejectedStatementError, match="format"):
        check_query(sql, dialect)


def test_postgres_computed_sizes_are_bounded_and_small_ones_still_run(pg_url) -> None:
    """The rewrite that bounds a computed repeat/lpad size runs on the real server: a small
    size gives the same answer as before, a large one fails fast with the reason."""
    with Database.open(pg_url) as db:
        rows = db.execute("SELECT n, repeat('*', n), lpad(CAST(n AS TEXT), n + 2, '0') "
                          "FROM generate_series(1, 3) AS g(n) ORDER BY n").rows
        assert rows == [(1, "*", "001"), (2, "**", "0002"), (3, "***", "00003")]
        result = db.try_execute("SELECT repeat('ab', (SELECT 100000000))", timeout_s=LIMIT_S)
        assert result.kind == "execution_error" and "value too large" in str(result)


def test_postgres_client_gives_up_on_a_backend_that_does_not_stop(pg_url, monkeypatch) -> None:
    """Neither statement_timeout nor a cancel request lands while a backend is inside one long
    step; with both out of play, the client shuts the socket at 1.6x the limit, answers with
    the timeout, and the pool replaces the connection."""
    from agentflow.sql import QueryTimeoutError
    from agentflow.sql.database import _Interrupter

    monkeypatch.setattr(_Interrupter, "_PG_SERVER_TIMEOUT", False)
    monkeypatch.setattr(_Interrupter, "_PG_CANCEL_FACTOR", 1000.0)
    with Database.open(pg_url, pool_size=1, max_overflow=0) as db:
        with pytest.raises(QueryTimeoutError):
            db.execute("SELECT pg_sleep(30)", timeout_s=0.5)
        assert db.execute("SELECT 1", timeout_s=5).rows == [(1,)]
