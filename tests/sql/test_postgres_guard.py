"""Issue 20 §2 on a real PostgreSQL server: the guard's allow-list, for a reader role and for
the misconfiguration it exists for (agentflow given a superuser URL).

Each refused statement is first shown to *work* on the server without the guard (a raw
superuser session in a read-only transaction), so the test proves the guard is what stops it.
The server is the session's ``pg_server`` (tests/conftest.py), as in tests/sql/test_postgres.py.
"""

from __future__ import annotations

import pytest

from agentflow.sql import Database, RejectedStatementError, SqlError
from tests.sql.test_allowlist import ATTACKS, ISSUE_STATEMENTS, _spellings

PASSWORD = "gu4rd-Pa55"

SETUP_SQL = """
CREATE TABLE orders (order_id int PRIMARY KEY, customer text NOT NULL, city text,
    total numeric(10, 2), placed_at timestamptz, tags text[], profile jsonb);
INSERT INTO orders VALUES
  (1, 'Ada', 'Lyon', 120.50, '2024-02-01 10:00+00', '{vip,early}', '{"tier": "gold"}'),
  (2, 'Bruno', 'Porto', 15.00, '2024-02-03 12:00+00', '{}', '{"tier": "basic"}'),
  (3, 'Ada', 'Lyon', 80.00, '2024-04-01 09:30+00', '{vip}', NULL),
  (4, 'Chen', NULL, 210.25, '2024-06-02 18:45+00', NULL, '{"tier": "gold"}');
"""

POSTGRES_ISSUE = [sql for dialect, sql in ISSUE_STATEMENTS if dialect == "postgres"]


@pytest.fixture(scope="module")
def server(pg_server):
    pg_server.create_database("guarddb")
    with pg_server.admin_connect("guarddb") as conn:
        if not conn.execute("SELECT 1 FROM pg_tables WHERE tablename = 'orders'").fetchone():
            conn.execute(SETUP_SQL)
    pg_server.create_reader("guard_reader", PASSWORD, "guarddb")
    return pg_server


@pytest.fixture(scope="module")
def reader(server):
    db = Database.open(server.url("guard_reader", "guarddb", PASSWORD), db_id="guarddb")
    yield db
    db.close()


@pytest.fixture(scope="module")
def superuser(server):
    """agentflow misconfigured with the superuser's URL (Unix socket, trust auth)."""
    db = Database.open(f"postgresql://postgres@/guarddb?host={server.socket_dir}"
                       f"&port={server.port}", db_id="guarddb-su")
    yield db
    db.close()


def _raw_read_only(server, sql: str):
    """Run ``sql`` as the superuser in a read-only transaction, without the guard."""
    with server.admin_connect("guarddb") as conn:
        conn.autocommit = False
        conn.execute("SET TRANSACTION READ ONLY")
        try:
            return conn.execute(sql).fetchall()
        finally:
            conn.rollback()


def _side_effects(server) -> dict[str, int]:
    with server.admin_connect("guarddb") as conn:
        return {
            "large_objects": conn.execute(
                "SELECT count(*) FROM pg_largeobject_metadata").fetchone()[0],
            "advisory_locks": conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()[0],
        }


def test_without_the_guard_the_server_would_run_them(server) -> None:
    """The control: read-only mode alone lets a superuser read files and import one."""
    assert _raw_read_only(server, "SELECT pg_read_file('/etc/hostname')")[0][0]
    assert _raw_read_only(server, "SELECT count(*) FROM pg_ls_dir('.')")[0][0] > 0
    assert _raw_read_only(server, "SELECT lo_import('/etc/hostname')")[0][0] > 0  # rolled back
    assert _raw_read_only(server, 'SELECT "pg_backend_pid"()')[0][0] > 0


@pytest.mark.parametrize("role", ["reader", "superuser"])
@pytest.mark.parametrize("sql", POSTGRES_ISSUE)
def test_the_issue_statements_are_refused(request, server, role: str, sql: str) -> None:
    db = request.getfixturevalue(role)
    before = _side_effects(server)
    with pytest.raises(RejectedStatementError, match=r"function \w+\(\)"):
        db.execute(sql, timeout_s=5)
    assert _side_effects(server) == before


@pytest.mark.parametrize("name,args,schema", ATTACKS["postgres"])
def test_every_spelling_is_refused_for_the_superuser(superuser, server, name: str, args: str,
                                                     schema: str) -> None:
    before = _side_effects(server)
    calls = _spellings(name, args) + [f"{schema}.{name}({args})", f'"{schema}"."{name}"({args})',
                                      f"{schema.upper()}.{name.upper()}/**/({args})"]
    for call in calls:
        for sql in (f"SELECT {call}", f"SELECT * FROM {call} AS f",
                    f"WITH c AS (SELECT {call} AS x) SELECT x FROM c",
                    f"SELECT order_id FROM orders ORDER BY {call}",
                    f"SELECT sum(total) OVER (ORDER BY {call}) FROM orders",
                    f"SELECT order_id FROM orders WHERE order_id IN (SELECT {call})"):
            with pytest.raises(RejectedStatementError) as info:
                superuser.execute(sql, timeout_s=5)
            assert name in str(info.value), sql
    assert _side_effects(server) == before


def test_no_other_backend_is_killed_and_the_pool_still_works(reader, superuser) -> None:
    sql = ('SELECT "pg_terminate_backend"(pid) FROM pg_stat_activity '
           'WHERE pid <> "pg_backend_pid"()')
    for db in (reader, superuser):
        with pytest.raises(RejectedStatementError):
            db.execute(sql)
    assert reader.execute("SELECT count(*) FROM orders").rows == [(4,)]
    assert superuser.execute("SELECT count(*) FROM orders").rows == [(4,)]


@pytest.mark.parametrize("sql", [
    "SELECT city, count(*), sum(total), avg(total), min(placed_at), max(total), "
    "string_agg(customer, ', ' ORDER BY customer), array_agg(order_id ORDER BY order_id), "
    "count(*) FILTER (WHERE total > 50), bool_or(total > 100), stddev_samp(total), "
    "percentile_cont(0.5) WITHIN GROUP (ORDER BY total) FROM orders GROUP BY city "
    "ORDER BY 2 DESC NULLS LAST",
    "SELECT upper(customer), lower(city), initcap(customer), length(customer), "
    "substring(customer FROM 1 FOR 2), left(customer, 1), right(customer, 1), "
    "lpad(order_id::text, 5, '0'), concat_ws('-', customer, city), customer || '!', "
    "split_part('a,b', ',', 2), regexp_replace(customer, '[aeiou]', '', 'g'), "
    "position('a' IN customer), strpos(customer, 'a'), replace(customer, 'a', 'A'), "
    "trim(both ' ' FROM ' x '), btrim(' y '), translate(customer, 'a', 'b'), "
    "format('%s lives in %-8s (%5s)', customer, city, order_id), customer ILIKE 'a%', "
    "customer ~ '^A', md5(customer), reverse(customer) FROM orders",
    "SELECT date_trunc('month', placed_at), extract(year FROM placed_at), "
    "date_part('dow', placed_at), to_char(placed_at, 'YYYY-MM'), age(placed_at, "
    "'2024-01-01'::timestamptz), placed_at + interval '7 days', now() > placed_at, "
    "make_date(2024, 1, 2), placed_at::date, current_date - placed_at::date, "
    "to_date('2024-03-04', 'YYYY-MM-DD') FROM orders",
    "SELECT customer, row_number() OVER w, rank() OVER (PARTITION BY city ORDER BY total), "
    "dense_rank() OVER (ORDER BY total), lag(total) OVER w, lead(total, 1, 0) OVER w, "
    "sum(total) OVER (PARTITION BY city), ntile(2) OVER w, first_value(customer) OVER w, "
    "cume_dist() OVER w FROM orders WINDOW w AS (ORDER BY placed_at) ORDER BY 1",
    "SELECT profile->>'tier', profile->'tier', jsonb_typeof(profile), "
    "tags @> ARRAY['vip'], cardinality(tags), array_length(tags, 1), tags[1], "
    "array_to_string(tags, '|'), coalesce(city, 'unknown'), nullif(city, 'Lyon'), "
    "greatest(total, 100), least(total, 100), round(total, 1), abs(total - 100), "
    "ceil(total), floor(total), sqrt(total), power(2, 3), 2 ^ 3, mod(order_id, 2), "
    "CASE WHEN total > 100 THEN 'big' ELSE 'small' END, total::int, "
    "CAST(order_id AS text) FROM orders",
    "SELECT g, u FROM generate_series(1, 3) AS g, unnest(ARRAY['a', 'b']) AS u",
    "SELECT key, value FROM orders, jsonb_each_text(profile) WHERE profile IS NOT NULL",
    "WITH big AS (SELECT customer, sum(total) AS spent FROM orders GROUP BY customer "
    "HAVING sum(total) > 100) SELECT customer FROM big WHERE EXISTS (SELECT 1 FROM orders o "
    "WHERE o.customer = big.customer AND o.city = 'Lyon') UNION SELECT 'none' ORDER BY 1",
    "SELECT pg_catalog.upper(customer), \"lower\"(customer) FROM orders",
])
def test_ordinary_analytics_runs(reader, sql: str) -> None:
    result = reader.try_execute(sql, timeout_s=30)
    assert not isinstance(result, SqlError), f"{result.kind}: {result}"
    assert result.rows


@pytest.mark.parametrize("sql", [
    "SELECT rolname FROM pg_roles",
    "SELECT usename FROM pg_catalog.pg_user",
    "SELECT current_setting('data_directory')",
    "SELECT datname FROM pg_database",
])
def test_catalog_that_names_other_tenants_is_refused_unless_the_view_is_an_admins(
        reader, server, sql: str) -> None:
    """Issue 35 §9: role names and server paths. The server itself would answer (shown
    first), the guard refuses it for a tenant, and an admin's view (``with_catalog``) runs it."""
    if "data_directory" not in sql:
        assert _raw_read_only(server, sql)
    with pytest.raises(RejectedStatementError, match="catalog|allow-list|did not run"):
        reader.execute(sql)
    if "data_directory" in sql:
        return  # readable by superusers and pg_read_all_settings only: the reader is neither
    assert reader.with_catalog().execute(sql).rows
