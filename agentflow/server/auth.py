"""API keys and who they stand for: ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``.

Off when no key is configured (a laptop demo needs none; everything is visible, as before);
when keys are set, every API route needs one, while /healthz, the probes, the static page and
the docs stay open (they hold no data; the page asks for a key when the API answers 401).

Each key maps to a tenant (``agentflow.tenants``). A route that touches a tenant's objects
takes the caller as a dependency and checks ownership with the helpers below, so every
route answers the same way — another tenant's object is a 404 exactly like an unknown id:

    from agentflow.server.auth import Caller, require_database, visible

    @router.post("/v1/databases/{db}/examples")
    async def add_example(db: str, body: ..., caller: Caller, request: Request):
        require_database(request, caller, db)        # 404 unknown_database otherwise
        store(db, body, owner=owner_of(caller))      # agentflow.tenants.owner_of
        ...
        if not visible(caller, example.owner): raise not_found(...)

``Caller`` is ``Tenant | None``: None only when keys are off (then every object is visible).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from agentflow.server.errors import ApiError
from agentflow.tenants import Tenant, TenantTable, key_of, owner_of, sees

_bearer = HTTPBearer(auto_error=False, description="an API key as a bearer token")
_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="an API key")


def authenticate(table: TenantTable, key: str | None) -> Tenant | None:
    """The tenant of ``key``; raises 401 when keys are on and it is missing or wrong.
    Returns None when keys are off. Shared by the HTTP API and MCP over HTTP."""
    if not table:
        return None
    if not key:
        raise ApiError(401, "unauthorized", "an API key is required: send 'Authorization: "
                       "Bearer KEY' or 'X-API-Key: KEY'",
                       headers={"WWW-Authenticate": "Bearer"})
    tenant = table.lookup(key)
    if tenant is None:
        raise ApiError(401, "unauthorized", "the API key is not valid",
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return tenant


def require_key(request: Request,
                bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
                header: Annotated[str | None, Depends(_header)]) -> Tenant | None:
    """The caller's tenant (None when keys are off), also kept on ``request.state.tenant``
    for code that only has the request."""
    tenant = authenticate(request.app.state.tenants,
                          header or (bearer.credentials if bearer else None))
    request.state.tenant = tenant
    return tenant


Caller = Annotated[Tenant | None, Depends(require_key)]


def caller_of(request: Request) -> Tenant | None:
    """The tenant ``require_key`` found for this request (it must have run)."""
    return request.state.tenant


def require_admin(caller: Caller) -> Tenant | None:
    """For routes about the whole service (``/metrics``): an admin key, when keys are on."""
    if caller is not None and not caller.admin:
        raise ApiError(403, "forbidden", "this endpoint needs an admin key")
    return caller


def visible(caller: Tenant | None, owner: str | None) -> bool:
    """Whether ``caller`` may see an object owned by ``owner``; if not, answer 404."""
    return sees(caller, owner)


def require_database(request: Request, caller: Tenant | None, db: str) -> str:
    """``db`` if the server serves it and ``caller`` may use it; else the same 404 for both
    (a database outside a key's list does not exist for that key)."""
    service = request.app.state.service
    return service.database_id(db, caller)


__all__ = ["Caller", "authenticate", "caller_of", "key_of", "owner_of", "require_admin",
           "require_database", "require_key", "visible"]
