"""HTTP routes for teaching: ``/v1/databases/{db}/examples`` and ``/v1/databases/{db}/glossary``.

    POST   /v1/databases/{db}/examples          {"question", "sql"}  -> 201 the stored pair
    GET    /v1/databases/{db}/examples                               -> {"examples": [...]}
    DELETE /v1/databases/{db}/examples/{id}                          -> {"deleted": id}
    POST   /v1/databases/{db}/glossary          {"term", "meaning"}  -> 201 the stored term
    GET    /v1/databases/{db}/glossary                               -> {"glossary": [...]}
    DELETE /v1/databases/{db}/glossary/{term}                        -> {"deleted": term}

The same rules as queries: only catalog ids (never a file path a client could make this
machine open), the API key when keys are on, errors in the one error shape (a taught SQL that
does not pass the guard or does not run is 422 with the database's reason). With tenants
(``request.state.tenant``, set by the authentication layer when keys name tenants) each
tenant teaches its own entries and sees the shared ones too.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from agentflow.server.auth import require_key
from agentflow.server.errors import ApiError
from agentflow.teaching import (
    MAX_MEANING_CHARS,
    MAX_QUESTION_CHARS,
    MAX_SQL_CHARS,
    MAX_TERM_CHARS,
    TeachingError,
)

router = APIRouter(tags=["teaching"], dependencies=[Depends(require_key)])


class ExampleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    sql: str = Field(min_length=1, max_length=MAX_SQL_CHARS)


class ExampleOut(BaseModel):
    id: int
    db: str
    question: str
    sql: str
    tenant: str | None = None
    created: float


class ExampleList(BaseModel):
    examples: list[ExampleOut]


class TermIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    term: str = Field(min_length=1, max_length=MAX_TERM_CHARS)
    meaning: str = Field(min_length=1, max_length=MAX_MEANING_CHARS)


class TermOut(BaseModel):
    id: int
    db: str
    term: str
    meaning: str
    tenant: str | None = None
    created: float


class Glossary(BaseModel):
    glossary: list[TermOut]


def _af(request: Request) -> Any:
    return request.app.state.service.af


def _tenant(request: Request) -> Any:
    """The caller's ``Tenant`` (None when keys are off); teaching keys its entries by name."""
    return getattr(request.state, "tenant", None)


def _known(request: Request, db: str) -> str:
    """A catalog id the caller may use, else the same 404 as every route (never a path)."""
    from agentflow.server.auth import require_database

    return require_database(request, _tenant(request), db)


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a (blocking: SQLite, the taught SQL) teaching call off the loop; its input
    errors become 422."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except TeachingError as err:
        raise ApiError(422, "invalid_request", str(err)) from None


@router.post("/v1/databases/{db}/examples", response_model=ExampleOut, status_code=201)
async def teach(db: str, body: ExampleIn, request: Request) -> Any:
    """Teach a question/SQL pair. The SQL must be one read-only query that runs on the
    database; the same question taught again replaces its SQL. Counted against the
    tenant's limits like a query (429 when over them)."""
    af = _af(request)
    db = _known(request, db)
    caller = _tenant(request)
    service = request.app.state.service
    # Teaching runs SQL: the same rate and concurrency limits as asking (each teach call is
    # one query of the tenant's), and its SQL runs in the tenant's share of the threads.
    holds_slot = service.admit(caller)
    try:
        taught = await af.teach_async(body.question, body.sql, db=db, tenant=caller)
    except TeachingError as err:
        raise ApiError(422, "invalid_request", str(err)) from None
    finally:
        if holds_slot:
            service.limits.release(caller)
    return taught.to_dict()


@router.get("/v1/databases/{db}/examples", response_model=ExampleList)
async def examples(db: str, request: Request) -> Any:
    af = _af(request)
    found = await _call(af.examples, _known(request, db), tenant=_tenant(request))
    return {"examples": [e.to_dict() for e in found]}


@router.delete("/v1/databases/{db}/examples/{example_id}")
async def forget_example(db: str, example_id: int, request: Request) -> dict[str, int]:
    af = _af(request)
    if not await _call(af.forget_example, _known(request, db), example_id, tenant=_tenant(request)):
        raise ApiError(404, "example_not_found", f"no taught example {example_id} on {db} "
                       "that this key may delete")
    return {"deleted": example_id}


@router.post("/v1/databases/{db}/glossary", response_model=TermOut, status_code=201)
async def define(db: str, body: TermIn, request: Request) -> Any:
    """Teach what a term means in SQL terms; questions using it get it with the schema."""
    af = _af(request)
    entry = await _call(af.define, body.term, body.meaning, db=_known(request, db),
                        tenant=_tenant(request))
    return entry.to_dict()


@router.get("/v1/databases/{db}/glossary", response_model=Glossary)
async def glossary(db: str, request: Request) -> Any:
    af = _af(request)
    found = await _call(af.glossary, _known(request, db), tenant=_tenant(request))
    return {"glossary": [e.to_dict() for e in found]}


@router.delete("/v1/databases/{db}/glossary/{term}")
async def forget_term(db: str, term: str, request: Request) -> dict[str, str]:
    af = _af(request)
    if not await _call(af.forget_term, _known(request, db), term, tenant=_tenant(request)):
        raise ApiError(404, "term_not_found", f"no term {term!r} on {db} that this key may "
                       "delete")
    return {"deleted": term}
