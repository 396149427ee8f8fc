"""Issue 35: catalog and path tables and functions (server paths, settings, roles) are refused
for tenants and allowed for admins, on every way in: the Python API's ``ask``, MCP
``run_sql`` and ``ask``. Before, the admin flag was not passed on, so admins were refused too.
A real SQLite file (the demo database); the instance is scripted (not a model)."""

from __future__ import annotations

import asyncio

import pytest

from agentflow.api import AgentFlow
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import ScriptedBackend
from agentflow.mcp.server import AgentflowTools
from agentflow.sql.errors import RejectedStatementError
from agentflow.tenants import Tenant

pytestmark = pytest.mark.timeout(120)
CATALOG_SQL = "SELECT file FROM pragma_database_list"
ADMIN = Tenant(name="ops", admin=True)
TENANT = Tenant(name="acme")


@pytest.fixture(scope="module")
def af():
    backend = ScriptedBackend({"extract_keywords": "stores"}, default=CATALOG_SQL,
                              latency_s=0.01)
    with AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"cpu-0": backend}) as flow:
        yield flow


def test_the_database_view_for_admins_reads_the_catalog(af: AgentFlow) -> None:
    db = af.catalog.open("bookshop")
    with pytest.raises(RejectedStatementError, match="catalog"):
        db.execute(CATALOG_SQL)
    admin_view = db.with_catalog()
    assert admin_view is db.with_catalog()  # one view, its caches kept
    assert str(db.path) in {row[0] for row in admin_view.execute(CATALOG_SQL).rows}
    with pytest.raises(RejectedStatementError):  # the shared object is unchanged
        db.execute(CATALOG_SQL)


def test_mcp_run_sql_refuses_a_tenant_and_answers_an_admin(af: AgentFlow) -> None:
    tools = AgentflowTools(af)
    with pytest.raises(RejectedStatementError, match="catalog"):
        asyncio.run(tools.run_sql("bookshop", CATALOG_SQL, caller=TENANT))
    out = asyncio.run(tools.run_sql("bookshop", CATALOG_SQL, caller=ADMIN))
    assert out["rows"] and out["rows"][0][0].endswith(".sqlite")


def test_an_admins_question_may_run_catalog_sql_and_a_tenants_may_not(af: AgentFlow) -> None:
    admin = af.ask("Where is the database file?", "bookshop", tenant=ADMIN)
    assert admin.status == "done" and admin.rows and str(admin.rows[0][0]).endswith(".sqlite")
    tenant = af.ask("Where is the database file?", "bookshop", tenant=TENANT)
    assert not tenant.rows
    assert tenant.status != "done" or tenant.error
    local = af.ask("Where is the database file?", "bookshop")  # no tenant: not an admin
    assert not local.rows
