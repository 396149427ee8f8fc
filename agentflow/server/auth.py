"""Optional API keys: ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``.

Off when no key is configured (a laptop demo needs none); when keys are set, every API route
and /metrics needs one, while /healthz, the static page and the docs stay open (they hold no
data; the page asks for a key when the API answers 401).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from agentflow.server.errors import ApiError

_bearer = HTTPBearer(auto_error=False, description="an API key as a bearer token")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="an API key")


def _matches(candidate: str, keys: list[str]) -> bool:
    # Compare against every key in constant time, so timing does not reveal a prefix match.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(candidate.encode(), key.encode())
    return ok


def require_key(request: Request,
                bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
                header: Annotated[str | None, Depends(_header)]) -> None:
    keys: list[str] = request.app.state.api_keys
    if not keys:
        return
    candidate = header or (bearer.credentials if bearer else None)
    if not candidate:
        raise ApiError(401, "unauthorized", "an API key is required: send 'Authorization: "
                       "Bearer KEY' or 'X-API-Key: KEY'",
                       headers={"WWW-Authenticate": "Bearer"})
    if not _matches(candidate, keys):
        raise ApiError(401, "unauthorized", "the API key is not valid",
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
