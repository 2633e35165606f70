"""Every error leaves the API as ``{"error": {"code", "message", "details"}}`` with a stable code; no tracebacks."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.errors import CorralError, ExecTimeoutError

__all__ = ["error_response", "install_error_handlers"]

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str, details: dict[str, object] | None = None) -> JSONResponse:
    """The one JSON shape of every API error."""
    return JSONResponse({"error": {"code": code, "message": message, "details": details or {}}}, status_code=status)


def _location(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


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
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), None)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", f"internal error ({type(exc).__name__}); see the server log")
