"""The MCP tools for teaching: ``teach`` (a question/SQL pair or a glossary term) and
``list_taught``. Kept apart from ``mcp/server.py`` so the query tools read on their own; the
rules are those of the Python API (the SQL must pass the guard and run first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:  # resolved by the SDK from the tools' annotations, so it must be a module global
    from mcp.server.mcpserver import Context
except ImportError:
    Context = Any  # type: ignore[misc,assignment]


def register(server: Any, af: Any, checked: Callable, known_db: Callable[..., str],
             caller: Callable[[Any], Any] = lambda ctx: None, limits: Any = None) -> None:
    """Add the teaching tools to ``server``; ``checked`` turns input errors into tool errors,
    ``known_db(db, tenant)`` accepts the caller's catalog ids only, ``caller(ctx)`` is the
    key's tenant (None without keys): each tenant teaches its own entries. ``limits`` (the
    tools' ``TenantLimits``): a pair's SQL runs, so teaching one counts as a query."""
    import asyncio

    async def teach(db: str, question: str | None, sql: str | None, term: str | None,
                    meaning: str | None, who: Any) -> dict[str, Any]:
        db = known_db(db, who)
        if term or meaning:
            if question or sql:
                raise ValueError("teach either a question with its sql, or a term with its "
                                 "meaning, not both")
            entry = await asyncio.to_thread(af.define, term or "", meaning or "", db=db,
                                            tenant=who)
            return {"term": entry.to_dict()}
        holds_slot = limits.acquire(who) if limits is not None else False
        try:
            taught = await af.teach_async(question or "", sql or "", db=db, tenant=who)
        finally:
            if holds_slot:
                limits.release(who)
        return {"example": taught.to_dict()}

    def listing(db: str, who: Any) -> dict[str, Any]:
        db = known_db(db, who)
        return {"examples": [e.to_dict() for e in af.examples(db, tenant=who)],
                "glossary": [g.to_dict() for g in af.glossary(db, tenant=who)]}

    def forget(db: str, example_id: int | None, term: str | None, who: Any) -> dict[str, Any]:
        db = known_db(db, who)
        if (example_id is None) == (term is None):
            raise ValueError("give exactly one of example_id or term")
        done = (af.forget_example(db, example_id, tenant=who) if example_id is not None
                else af.forget_term(db, term, tenant=who))
        if not done:
            what = f"example {example_id}" if example_id is not None else f"term {term!r}"
            raise ValueError(f"nothing to delete: no {what} on {db}")
        return {"deleted": example_id if example_id is not None else term}

    @server.tool(name="teach",
                 description="Teach agentflow about a database: a question with the SQL that "
                             "answers it (the SQL must be one read-only query that runs), or a "
                             "term with what it means in SQL terms. Later questions get the "
                             "most similar taught pairs as examples, and the meaning of the "
                             "terms they use next to the schema.")
    async def teach_tool(db: str, question: str | None = None, sql: str | None = None,
                         term: str | None = None, meaning: str | None = None,
                         ctx: Context | None = None) -> dict[str, Any]:
        return await checked(teach)(db, question, sql, term, meaning, caller(ctx))

    @server.tool(description="List the question/SQL pairs and glossary terms taught for a "
                             "database.")
    async def list_taught(db: str, ctx: Context | None = None) -> dict[str, Any]:
        return await checked(listing)(db, caller(ctx))

    @server.tool(description="Delete a taught pair (by example_id) or a glossary term.")
    async def forget_taught(db: str, example_id: int | None = None, term: str | None = None,
                            ctx: Context | None = None) -> dict[str, Any]:
        return await checked(forget)(db, example_id, term, caller(ctx))
