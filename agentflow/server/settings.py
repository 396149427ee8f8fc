"""What the HTTP layer needs beyond ``AgentFlowConfig``: API keys and tenants, drain time,
request limits.

A serve config file is an ordinary agentflow config (instances, pipeline, data, scheduler)
with an optional ``server:`` section. The section is split off here, before the rest is
validated as ``AgentFlowConfig``, so the engine's config model stays free of HTTP concerns
and a typo in either part still fails at start-up with the field name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from agentflow.config import AgentFlowConfig
from agentflow.tenants import (
    ADMIN_KEYS_ENV,
    API_KEYS_ENV,
    TENANTS_ENV,
    TenantEntry,
    TenantTable,
    env_keys,
    load_tenants_file,
)


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Clients must send one of these (``Authorization: Bearer KEY`` or ``X-API-Key``); empty
    # means the API is open. ``AGENTFLOW_API_KEYS`` (comma-separated) adds more.
    api_keys: list[str] = Field(default_factory=list)
    # Each key above is its own tenant; these are tenants with ``admin`` (see every query,
    # read /metrics). ``AGENTFLOW_ADMIN_KEYS`` adds more.
    admin_keys: list[str] = Field(default_factory=list)
    # Tenants with names, limits, databases and roles (``agentflow.tenants``), here or in a
    # YAML/JSON file (``tenants_file``, or the ``AGENTFLOW_TENANTS`` environment variable).
    tenants: list[TenantEntry] = Field(default_factory=list)
    tenants_file: str | None = None
    # On shutdown, how long queries in flight may keep running before they are cancelled.
    drain_s: float = Field(10.0, ge=0)
    # ``wait=true`` requests give up waiting after this long and answer 202 + the id instead,
    # so no HTTP request hangs on an unbounded pipeline.
    wait_timeout_s: float = Field(300.0, gt=0)
    # ``wait=false`` requests wait this long for the admission verdict, so an overloaded
    # server answers 429 at once instead of 202 followed by a rejection.
    admission_wait_s: float = Field(2.0, ge=0)
    max_body_bytes: int = Field(64 * 1024, gt=0)
    # Slow clients: a request's headers must arrive within ``header_timeout_s`` of the
    # connection opening (or of the previous response), its body within ``body_timeout_s``
    # of the headers; beyond ``max_connections`` open connections new ones get 503.
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    max_connections: int = Field(1000, gt=0)
    # ... and beyond this many from one client (peer address), its new ones get 503: one
    # client cannot take every connection (and /healthz with them)
    max_client_connections: int = Field(100, gt=0)
    # Requests with more headers, or more bytes of them, get 431
    max_headers: int = Field(100, gt=0)
    max_header_bytes: int = Field(32 * 1024, gt=0)
    # Admins are limited too (their queries take instance time and database threads like
    # anyone's): the limits of an admin key, and of a configured admin tenant that sets
    # none of its own; None: unlimited.
    admin_rate_per_min: float | None = Field(None, gt=0)
    admin_max_concurrent: int | None = Field(32, ge=1)
    recent_limit: int = Field(50, gt=0)  # queries listed by GET /v1/queries
    # Where queries, conversations and tenant usage live (agentflow.state): a SQLite file
    # path (sqlite:///path; one host) or postgresql://... (many hosts). Replicas sharing it
    # see each other's queries and share limits; answers survive restarts. None: in this
    # process only (`agentflow serve` defaults to a file in the cache).
    state: str | None = None
    keep_per_tenant: int = Field(1000, gt=0)  # finished queries kept per tenant
    max_row_bytes: int = Field(1_000_000, ge=0)  # rows of an answer kept in the store
    lease_s: float = Field(5.0, gt=0)  # a replica silent this long is dead: queries move
    replica_id: str | None = None  # default: host-pid-random

    def keys(self) -> list[str]:
        """Configured keys plus those from ``AGENTFLOW_API_KEYS``."""
        return [*self.api_keys, *env_keys(API_KEYS_ENV)]

    def tenant_table(self) -> TenantTable:
        """Every key the server accepts, each mapped to its tenant (empty: keys are off)."""
        return tenant_table(self.keys(), [*self.admin_keys, *env_keys(ADMIN_KEYS_ENV)],
                            self.tenants, self.tenants_file,
                            admin_limits={"rate_per_min": self.admin_rate_per_min,
                                          "max_concurrent": self.admin_max_concurrent})


STATE_ENV = "AGENTFLOW_STATE"


def resolve_state(option: str | None, setting: str | None, port: int = 8000, *,
                  default_file: bool = True) -> str | None:
    """The state store ``agentflow serve`` uses: ``--state``, else ``server.state``, else
    ``AGENTFLOW_STATE``, else ``<cache>/server-state-<port>.sqlite`` (answers and
    conversations survive a restart by default; the replicas of one port share it, servers
    on other ports do not); ``off`` keeps them in the process only. Without
    ``default_file`` nothing named is None: a file in this machine's cache is no store that
    other hosts' replicas could share (``--serve-config``)."""
    from agentflow.datasets.types import cache_dir

    chosen = option or setting or os.environ.get(STATE_ENV) or (
        str(cache_dir() / f"server-state-{port}.sqlite") if default_file else None)
    return None if not chosen or chosen.strip().lower() == "off" else chosen


def tenant_table(keys: list[str], admin_keys: list[str], tenants: list[TenantEntry],
                 tenants_file: str | None = None,
                 admin_limits: dict[str, Any] | None = None) -> TenantTable:
    """Plain keys, admin keys, configured tenants and those of the tenants file (the
    setting, else ``AGENTFLOW_TENANTS``) in one table; shared by the MCP server.
    ``admin_limits`` (``rate_per_min``, ``max_concurrent``): for admins without their own."""
    path = tenants_file or os.environ.get(TENANTS_ENV) or None
    entries = [*tenants, *(load_tenants_file(path) if path else [])]
    return TenantTable.build(keys, admin_keys, entries, admin_limits=admin_limits)


def load_serve_config(path: str | Path | None) -> tuple[AgentFlowConfig, ServerSettings]:
    """Read a serve config file (``None``: the embedded default and default settings)."""
    if path is None:
        return AgentFlowConfig(), ServerSettings()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    data: Any = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    server = data.pop("server", None) or {}
    settings = ServerSettings.model_validate(server)
    if settings.tenants_file and not Path(settings.tenants_file).expanduser().is_absolute():
        # beside the config file, as a reader of the file would expect
        settings.tenants_file = str(path.parent / settings.tenants_file)
    return AgentFlowConfig.model_validate(data), settings
