"""A finished query's result in other shapes: CSV, and a chart (Vega-Lite, SVG or PNG).

Routes of their own (``router``), so the query routes in ``app.py`` stay as they are:

    GET /v1/queries/{id}/rows.csv                  the result rows as CSV (header = columns)
    GET /v1/queries/{id}/chart                     the Vega-Lite spec (JSON)
    GET /v1/queries/{id}/chart?format=svg|png      the chart, rendered on the server

``result_links`` tells a client which of these exist for an answer (the view's ``links``).
"""

from __future__ import annotations

import asyncio
import csv
import io
import re
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response

from agentflow.server.auth import require_key
from agentflow.server.errors import ApiError


def result_links(query_id: str, answer: Any) -> dict[str, str]:
    """Links to the CSV (any answer with columns) and the chart (when one fits)."""
    from agentflow.charts import choose

    if answer.status not in ("done", "unsure") or not answer.columns:  # unsure: rows attached
        return {}
    links = {"csv": f"/v1/queries/{query_id}/rows.csv"}
    if choose(list(answer.columns), [list(r) for r in answer.rows],
              question=answer.question) is not None:
        links["chart"] = f"/v1/queries/{query_id}/chart"
    return links


# OWASP's CSV-injection rule: a spreadsheet runs a cell that begins with one of these as a
# formula (``=HYPERLINK(...)``, ``=cmd|' /C calc'!A0``, ``@SUM(...)``, ``+``/``-`` expressions,
# and tab / carriage return, which some importers strip before looking at the next character).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# Text that is exactly one decimal number is a number to a spreadsheet, never a formula, so
# it is kept as it is (decimals and big integers reach the CSV as text, e.g. "-3.50").
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def safe_cell(value: Any) -> Any:
    """A value a spreadsheet shows instead of running: numbers as they are, text that starts
    like a formula prefixed with a single quote (which spreadsheets read as "this is text").

    Numbers stay numbers: an int or float such as -3, and text that is exactly one decimal
    number such as "-3.50", cannot hold a formula, and quoting them would turn a numeric
    column into text. Everything else beginning with ``=``, ``+``, ``-``, ``@``, tab or
    carriage return gets the quote, so the cell keeps every character of the value."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        text = value if isinstance(value, str) else str(value)
        if text.startswith(_FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(text):
            return "'" + text
        return text
    return value


def to_csv(columns: list[str], rows: list[list[Any]]) -> str:
    """The rows as CSV, every cell (the header too: a column alias is user text) made safe
    for spreadsheets by ``safe_cell``."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow([safe_cell(c) for c in columns])
    for row in rows:
        writer.writerow([safe_cell(v) for v in row])
    return buffer.getvalue()


router = APIRouter(tags=["queries"], dependencies=[Depends(require_key)])


def _finished_view(request: Request, query_id: str):
    service = request.app.state.service
    handle = service.handle(query_id, request.state.tenant)  # 404: not the caller's
    if not handle.done():
        raise ApiError(409, "not_finished", f"query {query_id} is still running; its result "
                       f"is not there yet")
    view = service.view(handle)
    if view.status not in ("done", "unsure") or not view.columns:
        raise ApiError(404, "no_result", f"query {query_id} has no result rows "
                       f"(status {view.status})")
    return view


@router.get("/v1/queries/{query_id}/rows.csv", response_class=Response,
            responses={200: {"content": {"text/csv": {}}}})
async def rows_csv(query_id: str, request: Request) -> Response:
    """The result as CSV (all rows the server kept; the first line names the columns)."""
    view = _finished_view(request, query_id)
    return Response(to_csv(view.columns, view.rows), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{query_id}.csv"'})


@router.get("/v1/queries/{query_id}/chart",
            responses={200: {"content": {"application/json": {}, "image/svg+xml": {},
                                         "image/png": {}}}})
async def chart(query_id: str, request: Request,
                format: Literal["vega-lite", "svg", "png"] = Query(
                    "vega-lite", description="the Vega-Lite spec, or the chart drawn as SVG "
                                             "or PNG")) -> Response:
    """A chart of the result, chosen by column types: a line over a date/year column, bars
    per text category; 404 when no chart fits (e.g. a single number)."""
    from agentflow import charts

    view = _finished_view(request, query_id)
    keys = charts.schema_keys(await asyncio.to_thread(
        request.app.state.service.af.catalog.open, view.db))
    spec = charts.vega_lite(view.columns, view.rows, title=view.question[:80], keys=keys,
                            question=view.question)
    if spec is None:
        raise ApiError(404, "no_chart", "no chart fits this result (it needs a text or date "
                       "column and a numeric column)")
    if format == "vega-lite":
        return JSONResponse(spec, media_type="application/json")
    image = await asyncio.to_thread(charts.render, spec, format)
    return Response(image, media_type="image/svg+xml" if format == "svg" else "image/png")
