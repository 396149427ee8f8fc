"""What the HTTP layer needs beyond ``AgentFlowConfig``: API keys, drain time, request limits.

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

API_KEYS_ENV = "AGENTFLOW_API_KEYS"


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Clients must send one of these (``Authorization: Bearer KEY`` or ``X-API-Key``); empty
    # means the API is open. ``AGENTFLOW_API_KEYS`` (comma-separated) adds more.
    api_keys: list[str] = Field(default_factory=list)
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
    recent_limit: int = Field(50, gt=0)  # queries listed by GET /v1/queries

    def keys(self) -> list[str]:
        """Configured keys plus those from ``AGENTFLOW_API_KEYS``."""
        env = [k.strip() for k in os.environ.get(API_KEYS_ENV, "").split(",") if k.strip()]
        return [*self.api_keys, *env]


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
    return AgentFlowConfig.model_validate(data), ServerSettings.model_validate(server)
