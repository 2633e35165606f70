"""E2B's error shapes for everything under ``/e2b`` (and the signed ``/files``), whatever fails and wherever.

E2B's control plane and envd's HTTP routes answer ``{"code": <http status>, "message": ...}``; envd's Connect RPCs
answer ``{"code": "<connect code>", "message": ...}``. The SDK parses those bodies to raise its own exceptions
(``NotFoundException``, ``InvalidArgumentException``...), and crashes on any other shape (``KeyError: 'code'``).

The routers' own route classes answer the errors of their handlers. What happens *around* a handler (no route
matched, a method not served, a body past its cap, FastAPI's validation of parameters, an unexpected exception) is
answered by the app's exception handlers, which speak Corral's ``{"error": {...}}``. :func:`install_error_handlers`
wraps them so that a request under an E2B path gets E2B's shape and E2B's status instead:

* an unknown path or method on the control plane: 404 ``validation error: no matching operation was found`` (or
  ``... method not allowed``), as E2B's OpenAPI validator answers both;
* an unknown envd path: 404 ``404 page not found``, as envd's router does (405 for a method it does not serve);
* a validation error (FastAPI's 422): 400 ``validation error: ...``;
* anything unexpected: 500, without a traceback.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response

from corral.api.e2b._connect import ConnectCode
from corral.errors import (
    CorralError,
    InvalidRequestError,
    ProviderNotFoundError,
    ResourceLimitError,
    WorkspaceDestroyedError,
    WorkspaceNotFoundError,
)

__all__ = [
    "E2BApiError",
    "e2b_error",
    "install_error_handlers",
    "is_e2b_path",
    "json_body",
    "status_of",
]

log = logging.getLogger(__name__)

_Handler = Callable[[Request, Exception], Awaitable[Response]]
_RPC_PATH: Final = re.compile(r"^/e2b/envd/[A-Za-z_][\w]*\.[A-Za-z_][\w.]*/")
_ENVD_PREFIX: Final = "/e2b/envd/"
# What a Connect client makes of a plain HTTP status (the Connect protocol's table), for errors raised before an
# RPC handler runs.
_CONNECT_CODES: Final[Mapping[int, ConnectCode]] = {
    400: ConnectCode.INVALID_ARGUMENT,
    401: ConnectCode.UNAUTHENTICATED,
    403: ConnectCode.PERMISSION_DENIED,
    404: ConnectCode.UNIMPLEMENTED,
    405: ConnectCode.UNIMPLEMENTED,
    413: ConnectCode.RESOURCE_EXHAUSTED,
    429: ConnectCode.UNAVAILABLE,
    502: ConnectCode.UNAVAILABLE,
    503: ConnectCode.UNAVAILABLE,
    504: ConnectCode.UNAVAILABLE,
}


class E2BApiError(Exception):
    """An answer in E2B's error shape: ``status`` is the HTTP status (and the body's ``code``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def json_body(request: Request) -> dict[str, Any]:
    """A control-plane request's JSON object body (empty: ``{}``), or a 400 in E2B's words."""
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = await request.json()
    except ValueError as exc:
        raise E2BApiError(400, f"Error when parsing request: {exc}") from None
    if not isinstance(body, dict):
        raise E2BApiError(400, "Error when parsing request: the body must be a JSON object")
    return body


def e2b_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """``{"code": status, "message": message}`` with that status: E2B's error body."""
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def status_of(exc: CorralError) -> int:
    """The HTTP status E2B uses for what a Corral error means."""
    if isinstance(exc, WorkspaceNotFoundError | WorkspaceDestroyedError):
        return 404
    if isinstance(exc, InvalidRequestError | ProviderNotFoundError):
        return 400
    if isinstance(exc, ResourceLimitError):
        return 422
    # 500 rather than E2B's 503: the SDK retries 503s with backoff, which only delays a real provider failure.
    return 500 if exc.http_status >= 500 else exc.http_status


def is_e2b_path(path: str) -> bool:
    """Whether a request path belongs to the E2B-compatible API (its errors then take E2B's shapes)."""
    return path in ("/e2b", "/files") or path.startswith("/e2b/")


def _answer(path: str, status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    if _RPC_PATH.match(path):
        code = _CONNECT_CODES.get(status, ConnectCode.INTERNAL if status >= 500 else ConnectCode.UNKNOWN)
        # The HTTP status stays what it was (a route missing is a 404, as connect-go's mux answers it); a Connect
        # client reads the code from the body.
        return JSONResponse({"code": code.value, "message": message}, status_code=status, headers=headers)
    return e2b_error(status, message, headers)


def _envd(path: str) -> bool:
    return path == "/files" or path.startswith(_ENVD_PREFIX) or path == _ENVD_PREFIX.rstrip("/")


def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    path = request.url.path
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() != "allow"}
    if exc.status_code not in (404, 405):
        return _answer(path, exc.status_code, str(exc.detail), headers)
    if _envd(path):  # envd's router: a plain 404 or 405
        message = "404 page not found" if exc.status_code == 404 else "method not allowed"
        return _answer(path, exc.status_code, message, headers)
    # E2B's control plane matches routes in its OpenAPI validator, which answers an unknown path and a method the
    # path does not serve alike: 404.
    reason = "no matching operation was found" if exc.status_code == 404 else "method not allowed"
    return _answer(path, 404, f"validation error: {reason}", headers)


def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()))
        problems.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return _answer(request.url.path, 400, "validation error: " + "; ".join(problems or ["invalid request"]))


def install_error_handlers(app: FastAPI) -> None:
    """Answer errors under E2B paths in E2B's shapes; delegate every other path to the handlers already installed
    (Corral's, from :func:`corral.api.errors.install_error_handlers`), or to FastAPI's defaults."""
    handlers = app.exception_handlers

    def wrap(kind: type[Exception], e2b: Callable[[Request, Any], Response], fallback: _Handler) -> None:
        original = handlers.get(kind, fallback)

        async def handler(request: Request, exc: Exception) -> Response:
            if is_e2b_path(request.url.path):
                return e2b(request, exc)
            answer = original(request, exc)
            return await answer if inspect.isawaitable(answer) else answer

        handlers[kind] = handler

    async def default_corral(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, CorralError)
        return JSONResponse(exc.to_json(), status_code=exc.http_status)

    async def default_unexpected(request: Request, exc: Exception) -> Response:
        return PlainTextResponse("Internal Server Error", status_code=500)

    def corral(request: Request, exc: CorralError) -> Response:
        return _answer(request.url.path, status_of(exc), exc.message)

    def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return _answer(request.url.path, 500, f"internal error ({type(exc).__name__}); see the server log")

    wrap(StarletteHTTPException, _http_error, http_exception_handler)  # type: ignore[arg-type]
    wrap(RequestValidationError, _validation_error, request_validation_exception_handler)  # type: ignore[arg-type]
    wrap(CorralError, corral, default_corral)
    wrap(Exception, unexpected, default_unexpected)
