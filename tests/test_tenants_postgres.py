"""Row-level access through PostgreSQL's own machinery (issue 20 §1): a tenant mapped to a
database role sees what that role's row-level-security policy lets it see, on a real server
(the session's ``pg_server``), through the Python API and over HTTP. The pipeline's SQL is
fixed (a scripted backend, not a model) so the rows are the database's decision alone."""

from __future__ import annotations

import pytest

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend
from agentflow.sql import Database
from agentflow.sql.postgres import role_of
from agentflow.tenants import Tenant

PASSWORD = "rls-Pa55-word"
ORDERS_SQL = "SELECT tenant, item FROM ledger.orders ORDER BY id"

SETUP = """
CREATE SCHEMA ledger;
CREATE TABLE ledger.orders (id int PRIMARY KEY, tenant text NOT NULL, item text NOT NULL);
INSERT INTO ledger.orders VALUES (1, 'tenant_a', 'anvil'), (2, 'tenant_b', 'bucket'),
  (3, 'tenant_a', 'axe'), (4, 'tenant_b', 'brush'), (5, 'tenant_c', 'chisel');
ALTER TABLE ledger.orders ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_rows ON ledger.orders FOR SELECT USING (tenant = current_user);
"""


@pytest.fixture(scope="module")
def rls(pg_server):
    pg_server.create_database("rls")
    with pg_server.admin_connect("rls") as conn:
        if not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'ledger'").fetchone():
            conn.execute(SETUP)
    pg_server.create_reader("rls_reader", PASSWORD, "rls")
    with pg_server.admin_connect("rls") as conn:
        for role in ("tenant_a", "tenant_b"):
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                                (role,)).fetchone():
                conn.execute(f"CREATE ROLE {role} NOLOGIN")
            conn.execute(f"GRANT USAGE ON SCHEMA ledger TO {role}")
            conn.execute(f"GRANT SELECT ON ledger.orders TO {role}")
            conn.execute(f"GRANT {role} TO rls_reader")
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'stranger'").fetchone():
            conn.execute("CREATE ROLE stranger NOLOGIN")  # exists, never granted to the reader
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'tenant_c'").fetchone():
            conn.execute("CREATE ROLE tenant_c LOGIN")  # a tenant with a login of its own
        conn.execute(f"ALTER ROLE tenant_c PASSWORD '{PASSWORD}'")
        conn.execute("GRANT USAGE ON SCHEMA ledger TO tenant_c")
        conn.execute("GRANT SELECT ON ledger.orders TO tenant_c")
    return pg_server


@pytest.fixture(scope="module")
def url(rls) -> str:
    return rls.url("rls_reader", "rls", PASSWORD)


def _rows(db: Database) -> list[tuple]:
    return db.execute(ORDERS_SQL).rows


def _login_role(db: Database) -> str:
    """The role the pool's connection is at between transactions, read past the guard (which
    refuses session functions such as current_user in questions)."""
    with db.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT current_user").scalar_one()


def test_role_view_sees_only_its_rows_and_the_pool_is_reset_after(url) -> None:
    with Database.open(url, db_id="rls", pool_size=1, max_overflow=0) as base:
        a, b = base.with_role("tenant_a"), base.with_role("tenant_b")
        assert role_of(a) == "tenant_a" and role_of(base) is None
        # One pooled connection serves all three in turn: each transaction starts as its
        # own role, and the login role (no policy of its own) sees no row at all.
        for _ in range(2):
            assert _rows(a) == [("tenant_a", "anvil"), ("tenant_a", "axe")]
            assert _rows(b) == [("tenant_b", "bucket"), ("tenant_b", "brush")]
            assert _login_role(base) == "rls_reader"
            assert _rows(base) == []
        # A failed statement on a role view must not leave the role on the connection.
        assert a.try_execute("SELECT nosuchcolumn FROM ledger.orders").__class__.__name__ \
            .endswith("Error")
        assert _login_role(base) == "rls_reader"


def test_a_role_not_granted_fails_the_query_instead_of_running_as_the_login(url) -> None:
    with Database.open(url, db_id="rls", pool_size=1, max_overflow=0) as base:
        for role in ("stranger", "no_such_role"):
            err = base.with_role(role).try_execute(ORDERS_SQL)
            assert not hasattr(err, "rows"), role
        assert _login_role(base) == "rls_reader"


SWITCH_ROLE = ("SELECT \"set_config\"('role', 'tenant_b', true) AS r, (SELECT "
               "string_agg(item, ',' ORDER BY id) FROM ledger.orders) AS items")


def test_a_statement_cannot_switch_a_shared_pool_role_to_another_tenants(url) -> None:
    with Database.open(url, db_id="rls", pool_size=1, max_overflow=0) as base:
        result = base.with_role("tenant_a").try_execute(SWITCH_ROLE)
        assert not hasattr(result, "rows"), result.rows  # was [('tenant_b', 'bucket,brush')]
        assert "set_config" in str(result) and "allow-list" in str(result)


def test_a_tenants_own_login_sees_its_rows_and_cannot_switch_to_another(rls, url) -> None:
    from agentflow.catalog import DatabaseCatalog
    from agentflow.tenants import DatabaseLogin

    own = DatabaseLogin(url=rls.url("tenant_c", "rls", PASSWORD))
    catalog = DatabaseCatalog(include_demo=False, databases={"rls": {"url": url}})
    try:
        db = catalog.open("rls", own)
        assert db is catalog.open("rls", own) and db is not catalog.open("rls")
        assert _rows(db) == [("tenant_c", "chisel")]
        assert "rls-Pa55" not in repr(own)
        refused = db.try_execute(SWITCH_ROLE)  # whatever the guard lets through
        assert not hasattr(refused, "rows")
        # the guard refuses set_config by name; PostgreSQL would refuse the role switch too
        assert any(w in str(refused) for w in ("allow-list", "permission denied", "not allowed"))
        assert _rows(catalog.open("rls")) == []  # the shared login: no policy, no rows
    finally:
        catalog.close()


def test_role_views_need_postgres(library_db) -> None:
    with Database.open(library_db) as db, pytest.raises(ValueError, match="PostgreSQL"):
        db.with_role("tenant_a")


def test_tenant_questions_return_only_their_rows_through_the_python_api(url) -> None:
    config = AgentFlowConfig(fewshot=None, pipeline="single",
                             databases={"rls": {"url": url, "pool_size": 2}})
    a = Tenant(name="acme", db_roles={"rls": "tenant_a"})
    b = Tenant(name="bolt", db_roles={"rls": "tenant_b"})
    with AgentFlow(config, backends={"cpu-0": ScriptedBackend(lambda r: ORDERS_SQL)}) as af:
        answer_a = af.ask("Which orders are mine?", db="rls", tenant=a)
        answer_b = af.ask("Which orders are mine?", db="rls", tenant=b)
        answer_none = af.ask("Which orders are there?", db="rls")
    assert answer_a.status == "done", answer_a.error
    assert answer_a.rows == [["tenant_a", "anvil"], ["tenant_a", "axe"]]
    assert answer_a.tenant == "acme"
    assert answer_b.rows == [["tenant_b", "bucket"], ["tenant_b", "brush"]]
    # login role: no policy, no rows (an empty result is unsure under the default threshold)
    assert answer_none.status == "unsure" and answer_none.rows == []


def test_tenant_questions_over_http_return_only_their_rows(rls, url, monkeypatch) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from agentflow.server.testing import LiveServer, scripted_instance

    config = {"instances": [scripted_instance("gpu-0", default=ORDERS_SQL)],
              "pipeline": "single", "databases": {"rls": {"url": url, "pool_size": 2}}}
    settings = {"tenants": [
        {"name": "acme", "keys": ["rls-key-a"], "db_roles": {"rls": "tenant_a"}},
        {"name": "bolt", "keys": ["rls-key-b"], "db_roles": {"rls": "tenant_b"}},
        {"name": "cato", "keys": ["rls-key-c"],  # a login of its own
         "db_roles": {"rls": {"url": rls.url("tenant_c", "rls"), "password_env": "CATO_PW"}}}]}
    monkeypatch.setenv("CATO_PW", PASSWORD)
    with LiveServer(config, settings) as live:
        seen = {}
        for key in ("rls-key-a", "rls-key-b", "rls-key-c"):
            r = httpx.post(f"{live.url}/v1/queries", headers={"X-API-Key": key}, timeout=60,
                           json={"question": "Which orders are mine?", "db": "rls"})
            assert r.status_code == 200 and r.json()["status"] == "done", r.text
            csv = httpx.get(f"{live.url}{r.json()['links']['csv']}",
                            headers={"X-API-Key": key}, timeout=60).text
            seen[key] = (r.json()["rows"], csv.splitlines())
    assert seen["rls-key-a"] == ([["tenant_a", "anvil"], ["tenant_a", "axe"]],
                                 ["tenant,item", "tenant_a,anvil", "tenant_a,axe"])
    assert seen["rls-key-b"][0] == [["tenant_b", "bucket"], ["tenant_b", "brush"]]
    assert seen["rls-key-c"][0] == [["tenant_c", "chisel"]]
