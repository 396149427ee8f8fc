"""One error shape for every failure: ``{"error": {"code", "message", ...}}``.

Why one shape: a client (or the web page) can show ``message`` to a person and branch on
``code`` without knowing which layer refused the request — FastAPI's validation, the auth
check, agentflow's own checks, the scheduler's admission bound or a missing route.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("agentflow.server")


class ApiError(StarletteHTTPException):
    """An error with a stable ``code`` for clients; extra fields go into the error body.

    It subclasses Starlette's HTTPException so it also passes through FastAPI's body
    reading untouched (e.g. the body-size limit raised while the body streams in)."""

    def __init__(self, status_code: int, code: str, message: str, *,
                 headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(status_code=status_code, detail=message, headers=headers)
        self.code = code
        self.message = message
        self.extra = extra


def error_response(status_code: int, code: str, message: str, *,
                   headers: Mapping[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message, **extra}},
                        status_code=status_code, headers=headers)


def retry_after_header(seconds: float | None) -> dict[str, str]:
    """``Retry-After`` in whole seconds (at least 1), as HTTP requires."""
    return {"Retry-After": str(max(1, math.ceil(seconds or 1)))}


_STATUS_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                 405: "method_not_allowed", 409: "conflict", 413: "payload_too_large",
                 415: "unsupported_media_type", 422: "invalid_request", 429: "overloaded",
                 503: "unavailable"}

_FIELDS = "question, db and optionally slo_seconds, pipeline, evidence, wait"


def _field_message(err: dict[str, Any]) -> tuple[str, str]:
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    field = ".".join(loc) or "body"
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if err.get("type") == "missing":
        msg = "this field is required"
    elif err.get("type") == "extra_forbidden":
        msg = f"unknown field (the request takes {_FIELDS})"
    return field, msg


def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """Turn pydantic's error list into one sentence a person can act on."""
    errors = list(exc.errors())
    content_type = request.headers.get("content-type", "")
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        reason = (detail.get("ctx") or {}).get("error", "")
        return error_response(400, "malformed_json",
                              f"the request body is not valid JSON"
                              f"{f' ({reason})' if reason else ''}; send an object with "
                              f"{_FIELDS}")
    body_level = [e for e in errors if tuple(e.get("loc", ())) == ("body",)]
    if body_level:
        if not content_type and body_level[0].get("type") != "missing":
            # FastAPI reads a body as JSON only when it says so (strict_content_type)
            return error_response(415, "unsupported_media_type",
                                  "the request has no Content-Type header; send the JSON "
                                  "body with Content-Type: application/json")
        if content_type and "json" not in content_type.lower():
            return error_response(415, "unsupported_media_type",
                                  f"send the body as JSON (Content-Type: application/json), "
                                  f"not {content_type.split(';')[0]}")
        if body_level[0].get("type") == "missing":
            return error_response(400, "malformed_json",
                                  f"the request body is empty; send a JSON object with "
                                  f"{_FIELDS}")
        return error_response(422, "invalid_request",
                              f"the request body must be a JSON object with {_FIELDS}")
    fields = [_field_message(e) for e in errors]
    message = "; ".join(f"{f}: {m}" for f, m in fields)
    return error_response(422, "invalid_request", message,
                          fields=[{"field": f, "message": m} for f, m in fields])


def install(app: FastAPI, on_error=None) -> None:
    """Register the handlers; ``on_error(status, code)`` counts errors for metrics."""

    def counted(response: JSONResponse) -> JSONResponse:
        if on_error is not None:
            import json

            body = json.loads(bytes(response.body))
            on_error(response.status_code, body["error"]["code"])
        return response

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return counted(error_response(exc.status_code, exc.code, exc.message,
                                      headers=exc.headers, **exc.extra))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return counted(validation_error(request, exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "error")
        message = str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path} (see /docs)"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path} (see /docs)"
        return counted(error_response(exc.status_code, code, message, headers=exc.headers))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return counted(error_response(500, "internal",
                                      f"internal server error ({type(exc).__name__}); "
                                      f"the server log has the details"))
