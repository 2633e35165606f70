"""Every error leaves the API as ``{"error": {"code", "message", "details"}}`` with a stable code; no tracebacks.

:func:`error_responses` documents those answers in the OpenAPI document, one shared description per status, so
each route lists the statuses it can really send (the contract test in tests/security holds the code to it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.api.schemas import ErrorResponse
from corral.errors import CorralError, ExecTimeoutError

__all__ = ["ERROR_DESCRIPTIONS", "error_response", "error_responses", "install_error_handlers"]

log = logging.getLogger(__name__)

ERROR_DESCRIPTIONS: Mapping[int, str] = {
    400: "Bad input; the message names the field and what is allowed (`invalid_request`, `provider_not_found`, "
    "`file_operation_failed`, `tool_error`).",
    401: "Missing or wrong bearer token (`unauthorized`).",
    403: "Not allowed here: a provider the operator has not enabled (`provider_not_allowed`), a tool outside the "
    "agent type's list (`tool_not_allowed`).",
    404: "No such workspace, file, agent type, session or tool (`workspace_not_found`, `file_not_found`, ...).",
    409: "The operation does not fit the current state (`workspace_state_conflict`, `session_state_conflict`, ...).",
    410: "The workspace has been destroyed (`workspace_destroyed`).",
    413: "The request body is larger than the server accepts (`payload_too_large`).",
    422: "More than can be given: limits no host here has, a full disk (`resource_limit`), or a failed checkout "
    "(`checkout_failed`).",
    429: "The workspace already runs and queues as many commands as it may (`too_many_requests`); retry later.",
    502: "The workspace's agent broke the protocol (`workspace_broken`); resume the workspace to restart it.",
    503: "The provider cannot serve now (`provider_unavailable`, `all_providers_failed`); the message says why.",
    504: "The workspace did not answer in time, or a command passed its deadline (`exec_timeout`).",
}
"""What each error status means, for the OpenAPI document."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries for these error statuses, each with the shared error schema."""
    return {status: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[status]} for status in statuses}


def error_response(
    status: int,
    code: str,
    message: str,
    details: dict[str, object] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The one JSON shape of every API error."""
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return JSONResponse(body, status_code=status, headers=headers)


def _location(loc: tuple[object, ...]) -> str:
    # The first item says where (body, query, path, header); the rest names the field, which may itself be "path".
    parts = [str(p) for p in (loc[1:] if loc and loc[0] in ("body", "query", "path", "header", "cookie") else loc)]
    return ".".join(parts) or (str(loc[0]) if loc else "body")


_HTTP_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})


def _method_table(app: FastAPI) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """Each documented path template as a regex, with its methods; built once from the OpenAPI document."""
    table: list[tuple[re.Pattern[str], frozenset[str]]] | None = getattr(app.state, "allowed_methods", None)
    if table is None:
        table = [
            (
                re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path))),
                frozenset(method.upper() for method in item if method in _HTTP_METHODS),
            )
            for path, item in app.openapi().get("paths", {}).items()
        ]
        app.state.allowed_methods = table
    return table


def _allowed_methods(request: Request, routed: str) -> str:
    """The ``Allow`` header of a 405 (RFC 9110): every method some route serves at this path.

    Starlette names only the methods of the first route whose path matched (``routed``); the others come from the
    OpenAPI document, whose paths are the routes'.
    """
    methods = {m.strip().upper() for m in routed.split(",") if m.strip()}
    for pattern, documented in _method_table(request.app):
        if pattern.fullmatch(request.url.path):
            methods |= documented
    return ", ".join(sorted(methods))


def install_error_handlers(app: FastAPI) -> None:
    """Map Corral errors, validation errors, HTTP errors and anything unexpected to the JSON shape."""

    @app.exception_handler(CorralError)
    async def corral_error(_: Request, exc: CorralError) -> JSONResponse:
        if isinstance(exc, ExecTimeoutError):
            return error_response(exc.http_status, exc.code, exc.message, exc.details)
        return JSONResponse(exc.to_json(), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{_location(tuple(e.get('loc', ())))}: {e.get('msg', 'invalid')}" for e in exc.errors()]
        return error_response(400, "invalid_request", "; ".join(problems), {"problems": problems})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # Starlette names only the first matching route's methods; list them all
            headers["Allow"] = _allowed_methods(request, headers.pop("Allow", headers.pop("allow", "")))
        return error_response(exc.status_code, code, str(exc.detail), None, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"internal error ({type(exc).__name__}); see the server log")
