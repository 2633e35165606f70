"""The first thing every request meets: authentication from its headers alone, and a cap on its body.

FastAPI reads and parses a JSON body before it runs a route's dependencies, so a token check written as a dependency
comes after the body is in memory: an anonymous client could make the server hold a gigabyte before being told it
has no token. :class:`RequestGuard` is plain ASGI middleware in front of everything:

* Corral's own API (``/api/...``) answers 401 from the ``Authorization`` header alone, without reading a byte of the
  body, and closes the connection (so an unread body is not drained either). The E2B routes authenticate the
  SDK's way (API key, envd access token, signed URLs) in their own route classes, which also run before any body is
  read.
* A body is capped by what the route takes: :attr:`GuardLimits.json` (1 MiB by default) for JSON routes,
  :attr:`GuardLimits.tools` for agent tool calls (whose ``write`` content may be larger), and no cap for the
  file-upload routes, which stream to the workspace as they arrive. A declared ``Content-Length`` over the cap is
  refused before reading; a chunked body is counted as it arrives and cut off with 413 once past the cap.
* A WebSocket upgrade to ``/api/...`` (the PTY) is authenticated the same way, or by a ``corral.token.<base64url>``
  subprotocol for browsers, and refused before it is accepted: HTTP 401, or close code 4401 where the server cannot
  answer HTTP on a WebSocket scope.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["TOKEN_SUBPROTOCOL", "BodyTooLargeError", "GuardLimits", "RequestGuard"]

TOKEN_SUBPROTOCOL = "corral.token."  # noqa: S105  # a prefix, not a secret
"""A WebSocket subprotocol that carries the API token, base64url-encoded without padding, for browsers."""

_UPLOADS = (
    ("PUT", re.compile(r"^/api/v1/agent/workspaces/[^/]+/files$")),
    ("PUT", re.compile(r"^/api/v1/agent/workspaces/[^/]+/files/archive$")),  # corral workspaces cp uploads
    ("POST", re.compile(r"^/e2b/envd/files$")),
    ("POST", re.compile(r"^/files$")),
    ("PUT", re.compile(r"^/e2b/templates/[^/]+/files/[^/]+$")),  # template build archives (capped by the route)
)
_TOOLS = re.compile(r"^/api/v1/agent/sessions/[^/]+/tools/[^/]+$")


class BodyTooLargeError(HTTPException):
    """A request body past the route's cap (413); raised while the body is read."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than this route accepts ({limit} bytes)")


@dataclass(frozen=True, slots=True)
class GuardLimits:
    """Body caps in bytes."""

    json: int = 1024 * 1024
    """JSON routes (CORRAL_MAX_REQUEST_BODY)."""
    tools: int = 11 * 1024 * 1024
    """Agent tool calls: the write tool takes up to 10 MiB of content, JSON-encoded."""

    def for_route(self, method: str, path: str) -> int | None:
        """The cap of one route; None for the streaming upload routes."""
        if any(method == m and pattern.match(path) for m, pattern in _UPLOADS):
            return None
        if _TOOLS.match(path):
            return max(self.tools, self.json)
        return self.json


class RequestGuard:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: ASGIApp, *, token: Callable[[], str], limits: GuardLimits) -> None:
        self.app = app
        self._token = token
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if path.startswith("/api/") and not self._authorized(headers.get("authorization", "")):
            await _reject(
                send,
                401,
                "unauthorized",
                "missing or wrong bearer token; send 'Authorization: Bearer <CORRAL_API_TOKEN>'",
                www_authenticate=True,
            )
            return
        limit = self.limits.for_route(scope["method"], path)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            # The E2B-compatible API answers in E2B's error shape (corral.api.e2b._errors), this one included.
            e2b = path in ("/e2b", "/files") or path.startswith("/e2b/")
            await _reject(send, 413, "payload_too_large", f"the request body is larger than {limit} bytes", e2b=e2b)
            return
        await self.app(scope, _capped(receive, limit), send)

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token().encode())

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket upgrade to Corral's API is authenticated before it is accepted: by its ``Authorization``
        header, or (browsers cannot set headers on a WebSocket) by a ``corral.token.<base64url>`` subprotocol."""
        if not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        offered: list[str] = list(scope.get("subprotocols") or [])
        if self._authorized(headers.get("authorization", "")) or any(self._token_protocol(p) for p in offered):
            await self.app(scope, receive, send)
            return
        await _refuse_websocket(scope, receive, send)

    def _token_protocol(self, protocol: str) -> bool:
        if not protocol.startswith(TOKEN_SUBPROTOCOL):
            return False
        encoded = protocol[len(TOKEN_SUBPROTOCOL) :]
        try:
            token = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
        except (ValueError, binascii.Error):
            return False
        return hmac.compare_digest(token, self._token().encode())


def _capped(receive: Receive, limit: int) -> Receive:
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise BodyTooLargeError(limit)
        return message

    return wrapped


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """Refuse an upgrade before accepting it: HTTP 401 in Corral's error shape where the server can answer one
    (the ASGI ``websocket.http.response`` extension), else close code 4401 (the client sees HTTP 403)."""
    message = await receive()  # websocket.connect: the handshake has not been answered yet
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 4401, "reason": "unauthorized"})
        return
    text = (
        "missing or wrong token; send 'Authorization: Bearer <CORRAL_API_TOKEN>' or the subprotocol "
        f"'{TOKEN_SUBPROTOCOL}<base64url of the token>'"
    )
    body = json.dumps({"error": {"code": "unauthorized", "message": text, "details": {}}}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b"Bearer"),
    ]
    await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


async def _reject(
    send: Send, status: int, code: str, message: str, *, www_authenticate: bool = False, e2b: bool = False
) -> None:
    shape = {"error": {"code": code, "message": message, "details": {}}}
    body = json.dumps({"code": status, "message": message} if e2b else shape).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        # The body was not read; closing is cheaper than draining whatever the client still sends.
        (b"connection", b"close"),
    ]
    if www_authenticate:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
