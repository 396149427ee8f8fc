"""Tenants without a server: the key table, the config forms, the limits (on an injected
clock) and ownership in the Python API (queries, cancel, follow-ups, databases)."""

from __future__ import annotations

import pytest

from agentflow.api import AgentFlow, ConversationNotFoundError, DatabaseNotFoundError
from agentflow.config import AgentFlowConfig
from agentflow.llm.scripted import Hold, ScriptedBackend
from agentflow.server.settings import ServerSettings, load_serve_config
from agentflow.tenants import (
    LimitExceeded,
    Tenant,
    TenantEntry,
    TenantLimits,
    TenantTable,
    key_tenant_name,
    load_tenants_file,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------------------- keys
def test_plain_keys_are_each_their_own_tenant_and_admin_keys_are_admins() -> None:
    table = TenantTable.build(["key-one", "key-two"], ["key-root"])
    one, two, root = (table.lookup(k) for k in ("key-one", "key-two", "key-root"))
    assert one.name != two.name and not one.admin and root.admin
    assert one.name == key_tenant_name("key-one") and "key-one" not in one.name
    assert table.lookup("key-on") is None and table.lookup("key-one ") is None
    assert not TenantTable.build()  # no key: keys are off


def test_mapping_form_with_keys_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ACME_KEYS", "acme-1, acme-2")
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n"
                    "  - {name: acme, key_env: ACME_KEYS, databases: [bookshop],\n"
                    "     rate_per_min: 30, max_concurrent: 2, slo_class: interactive,\n"
                    "     db_roles: {shop: acme_role}}\n"
                    "  - {name: ops, keys: [ops-key], admin: true}\n")
    table = TenantTable.build(tenants=load_tenants_file(path))
    acme = table.lookup("acme-2")
    assert acme == table.lookup("acme-1") and acme.name == "acme"
    assert acme.may_use("bookshop") and not acme.may_use("other")
    assert acme.slo_class == "interactive" and acme.db_role("shop") == "acme_role"
    assert table.lookup("ops-key").admin and table.lookup("ops-key").sees("acme")
    assert not acme.sees("ops") and acme.sees("acme")

    # the same file through a serve config's server section, and through the environment
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"server: {{api_keys: [plain], tenants_file: '{path}'}}\n")
    _, settings = load_serve_config(cfg)
    table = settings.tenant_table()
    assert table.lookup("acme-1").name == "acme" and table.lookup("plain") is not None
    cfg.write_text("server: {tenants_file: tenants.yaml}\n")  # beside the config file
    assert load_serve_config(cfg)[1].tenant_table().lookup("acme-2").name == "acme"
    monkeypatch.setenv("AGENTFLOW_TENANTS", str(path))
    assert ServerSettings().tenant_table().lookup("ops-key").admin


def test_bad_tenant_configs_fail_with_the_reason(monkeypatch, tmp_path) -> None:
    with pytest.raises(ValueError, match="no keys"):
        TenantEntry(name="acme")
    with pytest.raises(ValueError, match="two tenants"):
        TenantTable.build(tenants=[TenantEntry(name="a", keys=["k"]),
                                   TenantEntry(name="b", keys=["k"])])
    with pytest.raises(ValueError, match="configured twice"):
        TenantTable.build(tenants=[TenantEntry(name="a", keys=["k1"]),
                                   TenantEntry(name="a", keys=["k2"])])
    monkeypatch.delenv("NOPE_KEYS", raising=False)
    with pytest.raises(ValueError, match="NOPE_KEYS"):
        TenantTable.build(tenants=[TenantEntry(name="a", key_env="NOPE_KEYS")])
    with pytest.raises(ValueError, match="rate_per_min"):
        ServerSettings(tenants=[{"name": "a", "keys": ["k"], "rate_per_min": -1}])
    with pytest.raises(ValueError, match="name"):
        Tenant(name="has space")
    with pytest.raises(FileNotFoundError):
        load_tenants_file(tmp_path / "missing.yaml")


# ---------------------------------------------------------------------------- limits
def test_rate_limit_is_a_token_bucket_with_the_wait_until_the_next_token() -> None:
    clock = FakeClock()
    limits = TenantLimits(clock)
    tenant = Tenant(name="t", rate_per_min=6, burst=2)  # one query per 10 s, burst of 2
    limits.acquire(tenant)
    limits.acquire(tenant)
    with pytest.raises(LimitExceeded) as err:
        limits.acquire(tenant)
    assert err.value.kind == "rate" and err.value.retry_after_s == pytest.approx(10.0)
    clock.t += 4
    with pytest.raises(LimitExceeded) as err:
        limits.acquire(tenant)
    assert err.value.retry_after_s == pytest.approx(6.0)
    clock.t += 6
    limits.acquire(tenant)
    other = Tenant(name="u", rate_per_min=6, burst=2)  # its own bucket
    limits.acquire(other)
    assert limits.rejected == {("t", "rate"): 2}


def test_concurrency_limit_counts_queries_in_flight_until_released() -> None:
    limits = TenantLimits(FakeClock())
    tenant = Tenant(name="t", max_concurrent=2)
    assert limits.acquire(tenant) and limits.acquire(tenant)
    with pytest.raises(LimitExceeded) as err:
        limits.acquire(tenant)
    assert err.value.kind == "concurrency" and err.value.retry_after_s >= 1
    limits.release(tenant)
    assert limits.inflight("t") == 1 and limits.acquire(tenant)
    assert limits.acquire(None) is False  # no tenant (keys off): no limits
    assert limits.acquire(Tenant(name="free")) is False  # no concurrency limit: no slot


# ---------------------------------------------------------------------------- Python API
@pytest.fixture
def af():
    backend = ScriptedBackend({"extract_keywords": "stores"},
                              default="SELECT count(*) FROM stores", latency_s=0.01)
    with AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"cpu-0": backend}) as engine:
        yield engine


def test_python_api_tenants_own_their_queries_and_conversations(af) -> None:
    first = af.ask("How many stores are there?", db="bookshop", tenant="acme")
    assert first.status == "done" and first.tenant == "acme"
    assert af.get(first.query_id, tenant="acme") is not None
    assert af.get(first.query_id, tenant="bolt") is None
    assert af.get(first.query_id) is not None  # no tenant: a local caller sees all
    assert af.get(first.query_id, tenant=Tenant(name="ops", admin=True)) is not None

    with pytest.raises(ConversationNotFoundError) as other:
        af.ask("and in 2023?", db="bookshop", conversation=first.conversation_id,
               tenant="bolt")
    with pytest.raises(ConversationNotFoundError) as unknown:
        af.ask("and in 2023?", db="bookshop", conversation="c-000000000000", tenant="bolt")
    assert str(other.value).replace(first.conversation_id, "ID") == \
        str(unknown.value).replace("c-000000000000", "ID")  # nothing tells them apart
    again = af.ask("and in 2023?", db="bookshop", conversation=first.conversation_id,
                   tenant="acme")
    assert again.status == "done" and again.conversation_id == first.conversation_id


def test_python_api_cancel_of_another_tenants_query_does_nothing(af) -> None:
    # Each query waits in a gate while it is cancelled, so it is running by construction
    # (a query already over would refuse any cancel and prove nothing).
    slow = ScriptedBackend({"extract_keywords": "stores"},
                           default="SELECT count(*) FROM stores", latency_s=0.05)
    with AgentFlow(AgentFlowConfig(fewshot=None, pipeline="single"),
                   backends={"cpu-0": slow}) as engine:
        slow.hold = Hold()
        handle = engine.submit("How many stores are there?", db="bookshop", tenant="acme")
        slow.hold.wait_held(1)
        assert engine.cancel(handle.query_id, tenant="bolt") is False
        slow.hold.release()
        assert handle.result(timeout=30).status == "done"
        slow.hold = Hold()
        handle = engine.submit("How many stores are there?", db="bookshop", tenant="acme")
        slow.hold.wait_held(1)
        assert engine.cancel(handle.query_id, tenant="acme") is True
        assert handle.result(timeout=30).status == "cancelled"


def test_python_api_database_outside_the_tenants_list_is_unknown(af) -> None:
    narrow = Tenant(name="narrow", databases=("somewhere_else",))
    with pytest.raises(DatabaseNotFoundError) as err:
        af.submit("How many stores are there?", db="bookshop", tenant=narrow)
    assert "unknown database 'bookshop'" in str(err.value)
    assert af.ask("How many stores?", db="bookshop", tenant=Tenant(
        name="wide", databases=("bookshop",), slo_class="batch")).slo_class == "batch"


def test_db_roles_must_name_a_served_postgres_database() -> None:
    from agentflow.catalog import DatabaseCatalog
    from agentflow.tenants import check_against_catalog

    catalog = DatabaseCatalog()
    try:
        for roles, match in (({"bookshop": "r"}, "needs PostgreSQL"),
                             ({"nowhere": "r"}, "does not serve")):
            table = TenantTable.build(tenants=[TenantEntry(name="a", keys=["k"],
                                                           db_roles=roles)])
            with pytest.raises(ValueError, match=match):
                check_against_catalog(table, catalog)
        check_against_catalog(TenantTable.build(["k"]), catalog)  # no roles: nothing to check
    finally:
        catalog.close()
