"""agentflow on a real PostgreSQL server (issue 14): read-only for real, timeouts, schemas,
pooling and reconnects, credentials. The server is Debian's PostgreSQL, started once per test
session by the ``pg_server`` fixture (tests/conftest.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

import pytest

from agentflow.sql import (
    Database,
    QueryTimeoutError,
    RejectedStatementError,
    SqlError,
    SqlSyntaxError,
)
from agentflow.sql.database import _Interrupter
from agentflow.sql.errors import ConnectionLostError
from agentflow.sql.postgres import ReadOnlyRoleError, check_role
from tests.sql.utils import record_watchdog_fires
from tests.utils import wait_until

PASSWORD = "s3cret-Pa55"

SHOP_SQL = """
CREATE SCHEMA sales;
CREATE SCHEMA hr;
CREATE TYPE sales.order_status AS ENUM ('pending', 'shipped', 'returned');
CREATE TABLE sales.customer (customer_id int PRIMARY KEY, name text NOT NULL,
    tags text[], profile jsonb, joined_at timestamptz NOT NULL);
CREATE TABLE sales.orders (order_id int PRIMARY KEY,
    customer_id int NOT NULL REFERENCES sales.customer(customer_id),
    status sales.order_status NOT NULL, total numeric(10, 2), placed_at timestamptz);
CREATE TABLE sales.events (id bigint, kind text, at timestamptz);
CREATE TABLE hr.employee (employee_id int PRIMARY KEY, name text, salary numeric(12, 2));
CREATE VIEW sales.big_spenders AS
    SELECT c.name, sum(o.total) AS spent FROM sales.customer c
    JOIN sales.orders o USING (customer_id) GROUP BY c.name HAVING sum(o.total) > 100;
COMMENT ON TABLE sales.customer IS 'People who bought at least once';
COMMENT ON COLUMN sales.orders.total IS 'Order value in EUR, VAT included';
COMMENT ON VIEW sales.big_spenders IS 'Customers who spent over 100 EUR';
INSERT INTO sales.customer VALUES
  (1, 'Ada', '{vip,early}', '{"city": "Lyon"}', '2024-01-02 10:00+01'),
  (2, 'Bruno', '{}', '{"city": "Porto"}', '2024-03-05 12:30+00'),
  (3, 'Chen', NULL, NULL, '2024-06-01 08:15-05');
INSERT INTO sales.orders VALUES (10, 1, 'shipped', 120.50, '2024-02-01'),
  (11, 1, 'pending', 15.00, '2024-02-03'), (12, 2, 'returned', 80.00, '2024-04-01'),
  (13, 3, 'shipped', 210.25, '2024-06-02');
INSERT INTO hr.employee VALUES (1, 'Dana', 5200.00), (2, 'Eli', 4100.00);
INSERT INTO sales.events SELECT g, CASE WHEN g % 3 = 0 THEN 'view' ELSE 'click' END,
  timestamptz '2024-01-01' + g * interval '1 second' FROM generate_series(1, 60000) g;
"""

TABLES = ["sales.customer", "sales.orders", "sales.events", "hr.employee"]


@pytest.fixture(scope="module")
def shop(pg_server):
    pg_server.create_database("shop")
    with pg_server.admin_connect("shop") as conn:
        if not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'sales'").fetchone():
            conn.execute(SHOP_SQL)
            conn.execute("ANALYZE sales.customer; ANALYZE sales.orders; ANALYZE hr.employee")
    pg_server.create_reader("reader", PASSWORD, "shop")
    return pg_server


@pytest.fixture(scope="module")
def db(shop):
    database = Database.open(shop.url("reader", "shop", PASSWORD), db_id="shop",
                             search_path=["sales", "hr"], pool_size=3, max_overflow=2)
    yield database
    database.close()


def checksums(server) -> dict[str, str]:
    with server.admin_connect("shop") as conn:
        out = {t: conn.execute(f"SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), "
                               f"'')) || count(*) FROM {t} x").fetchone()[0] for t in TABLES}
        out["relations"] = str(conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace IN (SELECT oid FROM pg_namespace "
            "WHERE nspname IN ('sales', 'hr', 'public'))").fetchone()[0])
        out["large_objects"] = str(conn.execute(
            "SELECT count(*) FROM pg_largeobject_metadata").fetchone()[0])
        out["settings"] = str(conn.execute(
            "SELECT setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
            "WHERE r.rolname = 'reader'").fetchone())
    return out


# --------------------------------------------------------------------- read-only for real
ATTACKS = [
    "INSERT INTO sales.orders VALUES (99, 1, 'pending', 1, now())",
    "UPDATE sales.orders SET total = 0",
    "DELETE FROM hr.employee",
    "DROP TABLE sales.events",
    "TRUNCATE sales.orders",
    "CREATE TABLE sales.x (a int)",
    "ALTER TABLE hr.employee ADD COLUMN bonus int",
    "GRANT SELECT ON hr.employee TO PUBLIC",
    "COPY sales.orders TO PROGRAM 'touch /tmp/agentflow-pwned'",
    "COPY sales.orders FROM PROGRAM 'echo 1'",
    "COPY (SELECT 1) TO '/tmp/agentflow-pwned'",
    "SELECT pg_read_file('/etc/passwd')",
    "SELECT pg_read_binary_file('/etc/passwd')",
    "SELECT pg_ls_dir('.')",
    "SELECT lo_import('/etc/passwd')",
    "SELECT lo_export(1, '/tmp/agentflow-pwned')",
    "SELECT lo_from_bytea(0, 'x')",
    "SELECT dblink_exec('dbname=shop', 'DELETE FROM hr.employee')",
    "SELECT * FROM dblink('dbname=shop', 'SELECT 1') AS t(a int)",
    "SELECT set_config('default_transaction_read_only', 'off', false)",
    "SELECT set_config('transaction_read_only', 'off', true)",
    "SET default_transaction_read_only = off",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
    "RESET ALL",
    "SELECT * FROM sales.orders FOR UPDATE",
    "SELECT * FROM sales.orders FOR SHARE",
    "WITH d AS (DELETE FROM hr.employee RETURNING *) SELECT count(*) FROM d",
    "WITH u AS (UPDATE sales.orders SET total = 0 RETURNING 1) SELECT * FROM u",
    "CALL some_procedure()",
    "DO $$BEGIN DELETE FROM hr.employee; END$$",
    "LISTEN agentflow",
    "NOTIFY agentflow, 'hi'",
    "SELECT pg_notify('agentflow', 'hi')",
    "SELECT pg_advisory_lock(42)",
    "SELECT pg_try_advisory_lock(42)",
    "SELECT pg_advisory_xact_lock(42)",
    "SELECT pg_terminate_backend(pg_backend_pid())",
    "SELECT pg_reload_conf()",
    "SELECT nextval('some_seq')",
    "SELECT query_to_xml('DELETE FROM hr.employee', true, false, '')",
    "SELECT * INTO sales.copy FROM sales.orders",
    "CREATE EXTENSION dblink",
    "VACUUM sales.orders",
    "ANALYZE sales.orders",
    "LOCK TABLE sales.orders",
    "PREPARE p AS DELETE FROM hr.employee",
    "BEGIN READ WRITE",
    "SELECT 1; DELETE FROM hr.employee",
]

# What a read-only transaction and the reader role refuse on their own, without the guard.
SERVER_REFUSES = [a for a in ATTACKS if not any(k in a for k in (
    "pg_advisory", "pg_try_advisory", "set_config", "SET ", "RESET", "LISTEN", "NOTIFY", "CALL",
    "query_to_xml", "pg_terminate", "pg_notify", "BEGIN", "PREPARE", "; DELETE",
    "lo_from_bytea", "SELECT 1) TO", "ANALYZE"))]


@pytest.mark.parametrize("sql", ATTACKS)
def test_attack_is_rejected_by_the_guard(db, sql: str) -> None:
    """Refused before reaching PostgreSQL (NOTIFY with a payload does not even parse)."""
    with pytest.raises((RejectedStatementError, SqlSyntaxError)):
        db.execute(sql, timeout_s=2.0)


def test_attacks_leave_every_table_unchanged(db, shop) -> None:
    before = checksums(shop)
    for sql in ATTACKS:
        assert isinstance(db.try_execute(sql, timeout_s=2.0), SqlError), sql
    # pg_sleep beyond the limit is harmless: stopped by the timeout.
    assert isinstance(db.try_execute("SELECT pg_sleep(30)", timeout_s=1.0), QueryTimeoutError)
    assert checksums(shop) == before
    assert db.execute("SELECT count(*) FROM orders").rows == [(4,)]


@pytest.mark.parametrize("sql", SERVER_REFUSES)
def test_the_server_refuses_writes_without_the_guard(db, shop, sql: str) -> None:
    """Second layer: the same statements sent straight through agentflow's pooled connection
    (read-only transaction, reader role) fail in PostgreSQL itself."""
    import sqlalchemy as sa

    before = checksums(shop)
    with db.engine.connect() as conn:
        with pytest.raises(sa.exc.DBAPIError):
            conn.exec_driver_sql(sql.replace("%", "%%"))
        conn.rollback()
    assert checksums(shop) == before


def test_reader_role_is_verified_read_only(db, shop) -> None:
    check = check_role(db)
    assert check.read_only and check.read_only_default and check.role == "reader"
    with shop.admin_connect() as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'writer'").fetchone():
            conn.execute("CREATE ROLE writer LOGIN PASSWORD 'w-pass'")
    with shop.admin_connect("shop") as conn:
        conn.execute("GRANT USAGE ON SCHEMA sales TO writer")
        conn.execute("GRANT SELECT, INSERT ON sales.orders TO writer")
    url = shop.url("writer", "shop", "w-pass")
    with Database.open(url, search_path="sales") as writer:
        report = check_role(writer)
        assert not report.read_only and report.writable_tables == 1
        # Even so, agentflow's read-only transactions hold.
        before = checksums(shop)
        with writer.engine.connect() as conn:
            import sqlalchemy as sa
            with pytest.raises(sa.exc.DBAPIError, match="read-only transaction"):
                conn.exec_driver_sql("INSERT INTO sales.orders VALUES (98, 1, 'pending', 1, "
                                     "now())")
        assert checksums(shop) == before
    with pytest.raises(ReadOnlyRoleError, match="may write 1 tables"):
        Database.open(url, search_path="sales", require_read_only_role=True)


# --------------------------------------------------------------------- timeouts
LONG_STATEMENTS = ["SELECT pg_sleep(30)",
                   "SELECT count(*) FROM generate_series(1, 1000000000)",
                   "SELECT count(*) FROM events a, events b"]


def test_statement_timeout_stops_long_statements(db, monkeypatch) -> None:
    """The server's statement_timeout stops each (at 1x the limit, before the watchdog's
    cancel at 1.3x), and the pooled connection serves the next query."""
    fired = record_watchdog_fires(monkeypatch)
    for sql in LONG_STATEMENTS:
        with pytest.raises(QueryTimeoutError):
            db.execute(sql, timeout_s=1.0)
    assert db.execute("SELECT 1").rows == [(1,)]
    assert len(fired) <= len(LONG_STATEMENTS)


@pytest.mark.slow
def test_statement_timeout_stops_within_twice_the_limit(db) -> None:
    for sql in LONG_STATEMENTS:
        start = time.monotonic()
        with pytest.raises(QueryTimeoutError):
            db.execute(sql, timeout_s=1.0)
        assert (time.monotonic() - start) / 1.0 < 2.0, sql


def test_client_side_cancel_alone_stops_the_query(db, monkeypatch) -> None:
    """With the server's statement_timeout out of play, the watchdog's cancel request stops
    the query (at 1.3x the limit): the interrupt is observed, never early."""
    monkeypatch.setattr(_Interrupter, "_PG_SERVER_TIMEOUT", False)
    fired = record_watchdog_fires(monkeypatch)
    start = time.monotonic()
    with pytest.raises(QueryTimeoutError):
        db.execute("SELECT pg_sleep(30)", timeout_s=1.0)
    assert fired == ["postgresql"] and time.monotonic() - start >= 1.0
    assert db.execute("SELECT 2").rows == [(2,)]


# --------------------------------------------------------------------- schemas
def test_schema_prompt_shows_schemas_views_types_comments_and_keys(db) -> None:
    schema = db.schema()
    names = schema.table_names
    assert {"customer", "orders", "events", "big_spenders", "hr.employee"} <= set(names)
    orders = schema.table("orders")
    assert orders.column("status").values == ("pending", "shipped", "returned")
    assert orders.foreign_keys[0].ref_table == "customer"
    prompt = db.schema_prompt()
    for text in ["-- People who bought at least once", "CREATE VIEW big_spenders",
                 "-- Customers who spent over 100 EUR", "CREATE TABLE hr.employee",
                 "Order value in EUR, VAT included", "one of 'pending', 'shipped', 'returned'",
                 "timestamp with time zone", "jsonb", "text[]", "numeric(10,2)",
                 "FOREIGN KEY (customer_id) REFERENCES customer(customer_id)"]:
        assert text in prompt, text
    # Names in the prompt are names a query can use.
    assert db.execute("SELECT count(*) FROM hr.employee").rows == [(2,)]
    assert db.execute("SELECT name FROM big_spenders ORDER BY name").rows == [("Ada",),
                                                                           ("Chen",)]
    assert db.execute("SELECT profile->>'city' FROM customer WHERE 'vip' = ANY(tags)"
                      ).rows == [("Lyon",)]


def test_sample_values_never_scan_a_big_table(db, shop) -> None:
    from agentflow.sql.schema import sample_values

    def seq_read() -> int:
        with shop.admin_connect("shop") as conn:
            conn.execute("SELECT pg_stat_force_next_flush()")
            return conn.execute("SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables "
                                "WHERE relname = 'events'").fetchone()[0]

    # A big table as the planner sees it (its estimate; no statistics, so no pg_stats).
    with shop.admin_connect("shop") as conn:
        conn.execute("UPDATE pg_class SET reltuples = 300000 WHERE relname = 'events'")
    fresh = Database.open(shop.url("reader", "shop", PASSWORD), search_path="sales")
    try:
        events = fresh.schema().table("events")
        assert events.row_estimate == 300000
        before = seq_read()
        values = sample_values(fresh, events, events.column("kind"), k=2)
        read = seq_read() - before
        assert set(values) <= {"click", "view"} and values
        assert read < 60000 / 4, read  # a full scan would read all 60,000
        # The value index of the pipelines samples the big table too.
        from agentflow.retrieval.values import collect_values

        before = seq_read()
        values, _ = collect_values(fresh)
        read = seq_read() - before
        assert set(values[("events", "kind")]) == {"click", "view"}
        assert read < 60000 / 2, read
        # Analysed tables: values come from pg_stats, with no read at all.
        orders = fresh.schema().table("orders")
        assert set(sample_values(fresh, orders, orders.column("status"), k=3)) <= {
            "pending", "shipped", "returned"}
    finally:
        fresh.close()


# --------------------------------------------------------------------- connections
def test_pool_is_sized_from_options(db) -> None:
    assert db.engine.pool.size() == 3
    assert db.engine.pool._max_overflow == 2


def test_restart_mid_run_fails_in_flight_clearly_then_succeeds(shop) -> None:
    """Eight workers query continuously; PostgreSQL restarts under them. In-flight queries
    fail with ConnectionLostError, nothing hangs, and queries after the restart succeed."""
    database = Database.open(shop.url("reader", "shop", PASSWORD), search_path="sales",
                             pool_size=4, max_overflow=4)
    outcomes: list[tuple[float, str]] = []
    messages: set[str] = set()
    kinds_by_message: Counter = Counter()
    lock = threading.Lock()
    stop = threading.Event()

    def worker(i: int) -> None:
        while not stop.is_set():
            sql = "SELECT pg_sleep(0.3), count(*) FROM orders" if i % 2 else \
                "SELECT count(*) FROM orders"
            result = database.try_execute(sql, timeout_s=5.0)
            kind = "ok" if hasattr(result, "rows") else result.kind
            with lock:
                outcomes.append((time.monotonic(), kind))
                if kind != "ok":
                    messages.add(str(result).split(" (")[0])
                    kinds_by_message[str(result).split(" (")[0]] += 1
            time.sleep(0.05)

    def answered(since: float) -> int:
        with lock:
            return sum(kind == "ok" for at, kind in outcomes if at >= since)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    # Observed windows, not fixed sleeps: enough answers before the restart and after it,
    # however slowly a loaded machine runs the workers.
    time.sleep(1.5)
    wait_until(lambda: answered(0.0) >= 8, what="8 answers before the restart")
    restart_at = time.monotonic()
    shop.restart(down_s=1.0)
    back_at = time.monotonic()
    time.sleep(2.0)
    wait_until(lambda: answered(back_at + 0.5) >= 8, what="8 answers after the restart")
    stop.set()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    database.close()
    before = Counter(k for at, k in outcomes if at < restart_at)
    during = Counter(k for at, k in outcomes if restart_at <= at < back_at)
    after = Counter(k for at, k in outcomes if at >= back_at + 0.5)
    print(f"\nrestart: before {dict(before)}, during {dict(during)}, after {dict(after)}; "
          f"errors {dict(kinds_by_message)}")
    assert set(before) == {"ok"}
    assert during["connection_lost"] >= 1
    assert set(during) <= {"ok", "connection_lost"}
    assert after["ok"] >= 8 and set(after) == {"ok"}
    # In flight: "lost the connection"; while the port was closed: "cannot connect".
    assert "lost the connection to database 'shop'" in messages
    assert messages <= {"lost the connection to database 'shop'",
                        "cannot connect to database 'shop'"}, messages


def test_credentials_never_appear_in_errors_or_logs(shop, monkeypatch, caplog,
                                                    tmp_path) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SHOP_DB_PASSWORD", PASSWORD)
    messages = []
    with Database.open(shop.url("reader", "shop"), password_env="SHOP_DB_PASSWORD",
                       search_path="sales") as by_env:
        assert by_env.execute("SELECT count(*) FROM orders").rows == [(4,)]
        messages += [str(by_env.try_execute(s)) for s in (
            f"SELECT '{PASSWORD}' FROM nowhere", "SELECT nope FROM orders", "SELECT 1/0")]
        messages.append(repr(by_env))
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"127.0.0.1:{shop.port}:shop:reader:{PASSWORD}\n")
    passfile.chmod(0o600)
    with Database.open(shop.url("reader", "shop"), passfile=str(passfile),
                       search_path="sales") as by_file:
        assert by_file.execute("SELECT count(*) FROM orders").rows == [(4,)]
    # A wrong password and an unreachable server: clear errors, no secret.
    with Database.open(shop.url("reader", "shop", "wrong-" + PASSWORD)) as bad:
        err = bad.try_execute("SELECT 1")
        assert isinstance(err, ConnectionLostError) and "password authentication" in str(err)
        messages.append(str(err))
    with Database.open(f"postgresql://reader:{PASSWORD}@127.0.0.1:1/shop") as down:
        err = down.try_execute("SELECT 1")
        assert isinstance(err, ConnectionLostError)
        messages.append(str(err))
    for text in messages + [r.getMessage() for r in caplog.records]:
        assert PASSWORD not in text.replace(f"'{PASSWORD}'", "")  # the query's own literal


def test_catalog_serves_named_postgres_databases_without_showing_the_url(shop, monkeypatch,
                                                                        tmp_path) -> None:
    from agentflow.catalog import DatabaseCatalog
    from agentflow.config import AgentFlowConfig

    monkeypatch.setenv("SHOP_DB_PASSWORD", PASSWORD)
    config_file = tmp_path / "agentflow.yaml"
    config_file.write_text(f"databases:\n  shop_pg:\n    url: {shop.url('reader', 'shop')}\n"
                           "    search_path: [sales, hr]\n    password_env: SHOP_DB_PASSWORD\n"
                           "    pool_size: 2\n")
    config = AgentFlowConfig.load(config_file)
    catalog = DatabaseCatalog(include_demo=False, databases=config.databases)
    try:
        assert catalog.ids == ["shop_pg"] and catalog.engine_of("shop_pg") == "postgresql"
        db = catalog.open("shop_pg")
        assert db.engine.pool.size() == 2
        assert db.execute("SELECT count(*) FROM orders").rows == [(4,)]
        assert str(shop.port) not in repr(catalog.entry("shop_pg"))
        # A URL works as a database id too (agentflow ask --db postgresql://...).
        entry = catalog.entry(shop.url("reader", "shop"))
        assert entry.db_id == "shop" and entry.url
    finally:
        catalog.close()
