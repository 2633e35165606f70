"""Preview URLs: HTTP to a server listening inside a workspace, proxied by Corral and streamed both ways.

Two ways in, to the same proxy:

* **Host routing**, what the E2B SDK's ``get_host(port)`` names: a request whose ``Host`` is
  ``{port}-{workspace id}.{CORRAL_SANDBOX_DOMAIN}`` goes to that port inside the workspace, whatever its path. It
  carries no Corral token (a browser opens it); the access rules are E2B's: a sandbox created with
  ``network.allowPublicTraffic: false`` needs its traffic access token (returned at create) in the
  ``e2b-traffic-access-token`` header, any other is public. Errors have the shape of E2B's proxy,
  ``{"code", "message", "sandboxId"[, "port"]}``: 404 for an unknown sandbox, 403 for a missing or wrong token,
  502 when nothing listens on the port.
* **The path route** ``/api/v1/agent/workspaces/{id}/ports/{port}/{path}`` of Corral's own API, for clients that
  cannot set a Host header: Corral's bearer token, Corral's error shape. The ``Authorization`` header stops here.

:class:`PortRoutes` is ASGI middleware mounted outside everything else (see :func:`mount_ports`), so host routing
wins over every route and no body cap applies: bodies flow through in chunks as they arrive, in both directions,
so the server's memory does not depend on their size.

Where the server is reached: a networked workspace at its address on the host (a provider's
:class:`~corral.providers.base.PortDialer`, e.g. the container's bridge address). An isolated workspace has no
address: its provider's :class:`~corral.providers.base.PortTunnel` opens a connection to the workspace's loopback
through its guest agent, and the same proxy speaks HTTP over it (an httpcore network backend that hands out that one
stream) or relays a WebSocket over it (through a local socket pair, since the WebSocket client needs a socket). The
tunnel is flow-controlled both ways, so the server's memory stays bounded there too.
WebSocket upgrades are relayed message by message (a message is held whole, up to 16 MiB, as WebSocket servers
do); a refusal closes before the handshake completes, which the client sees as HTTP 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final, Literal

import httpcore
import httpx
from fastapi import APIRouter, FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.typing import Subprotocol

from corral.api.e2b._state import E2BState, SandboxExtras
from corral.errors import CorralError, WorkspaceDestroyedError, WorkspaceNotFoundError
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import PortDialer, PortStream, PortTunnel

__all__ = ["TRAFFIC_TOKEN_HEADER", "PortRoutes", "PortTarget", "mount_ports", "parse_preview_host"]

log = logging.getLogger(__name__)

TRAFFIC_TOKEN_HEADER: Final = "e2b-traffic-access-token"  # noqa: S105 (a header name, not a secret)
"""The header E2B's proxy reads a private sandbox's traffic access token from."""

_PATH_ROUTE: Final = re.compile(r"^/api/v1/agent/workspaces/([^/]+)/ports/([^/]+)(/.*)?$")
_HOST_LABEL: Final = re.compile(r"^(\d{1,5})-([a-z0-9]+)$")
# Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection, not to the message; Host is set by the proxy.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Dialling a port that nothing listens on fails at once; a slow connect means the workspace is wedged. Reading has
# no limit: a server may stream (server-sent events, long polls) for as long as it likes.
_TIMEOUT: Final = httpx.Timeout(None, connect=10.0)
_WS_MAX_MESSAGE: Final = 16 * 1024 * 1024
"""The largest WebSocket message relayed (uvicorn's own default cap on what a client sends)."""
_SPLICE_CHUNK: Final = 64 * 1024
"""Bytes read at once from the local end of a tunnelled WebSocket's socket pair."""


@dataclass(frozen=True, slots=True)
class PortTarget:
    """Where one proxied request goes: the workspace, the port inside it, and the path (with query) to ask for."""

    route: Literal["host", "path"]
    workspace_id: str
    port: int
    path: str


class _Refusal(Exception):
    """An answer instead of the proxied one: an HTTP status and a message (shaped by the route)."""

    def __init__(self, status: int, message: str, *, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def parse_preview_host(host: str, domain: str) -> tuple[int, str] | Literal[False] | None:
    """``(port, workspace id)`` of a preview host ``{port}-{id}.{domain}`` (any ``:port`` suffix ignored); None
    when the host is not under ``domain``; False when it is, but its first label is no ``{port}-{id}``."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.lower().rstrip(".")
    domain = domain.lower().strip(".")
    if not name.endswith("." + domain):
        return None
    match = _HOST_LABEL.match(name[: -len(domain) - 1])
    if match is None or not 1 <= int(match.group(1)) <= 65535:
        return False
    return int(match.group(1)), match.group(2)


def _target(
    scope: Scope, headers: Mapping[str, str], domain: str | None
) -> tuple[Literal["host", "path"], PortTarget | _Refusal] | None:
    raw_path = scope.get("raw_path") or scope["path"].encode()
    path = raw_path.decode("latin-1")
    query = scope.get("query_string", b"").decode("latin-1")
    suffix = "?" + query if query else ""
    if domain:
        parsed = parse_preview_host(headers.get("host", ""), domain)
        if parsed is False:
            message = f"invalid preview host: expected {{port}}-{{sandbox id}}.{domain}"
            return "host", _Refusal(400, message, code="invalid_host")
        if parsed is not None:
            if not path.startswith("/"):
                # An origin-form target only: "@host:port/x" or an absolute URL would otherwise be read as the
                # authority of the upstream URL and send the request somewhere other than the workspace.
                return "host", _Refusal(400, "the request target must be a path starting with '/'", code="invalid_path")
            return "host", PortTarget("host", parsed[1], parsed[0], path + suffix)
    match = _PATH_ROUTE.match(path)
    if match is None:
        return None
    port_text = match.group(2)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        return "path", _Refusal(
            400, f"port must be a number from 1 to 65535, not {port_text!r}", code="invalid_request"
        )
    return "path", PortTarget("path", match.group(1), int(port_text), (match.group(3) or "/") + suffix)


class PortRoutes:
    """ASGI middleware: host routing and the path route to ports inside workspaces (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, domain: str | None, token: Callable[[], str]) -> None:
        self.app = app
        self.domain = domain
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        found = _target(scope, headers, self.domain)
        if found is None:
            await self.app(scope, receive, send)
            return
        route, target = found
        if route == "path" and not self._authorized(headers.get("authorization", "")):
            await _refuse(
                send,
                scope,
                None,
                _Refusal(
                    401,
                    "missing or wrong bearer token; send 'Authorization: Bearer <CORRAL_API_TOKEN>'",
                    code="unauthorized",
                ),
                route,
            )
            return
        if isinstance(target, _Refusal):
            await _refuse(send, scope, None, target, route)
            return
        proxy: _Proxy | None = getattr(scope["app"].state, "ports", None)
        if proxy is None:  # the app has not started (no lifespan run)
            await _refuse(send, scope, target, _Refusal(503, "the server is starting", code="unavailable"), route)
            return
        if scope["type"] == "websocket":
            await proxy.forward_websocket(scope, receive, send, target, headers)
        else:
            await proxy.forward(scope, receive, send, target, headers)

    def _authorized(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._token().encode())


class _Proxy:
    """The shared HTTP client and the lookups behind one proxied request."""

    def __init__(self, app: FastAPI) -> None:
        self.service: WorkspaceService = app.state.service
        self._app = app
        # No pooled keep-alive to workspaces: a connection would outlive the container address it was opened to.
        self.client = httpx.AsyncClient(
            timeout=_TIMEOUT, limits=httpx.Limits(max_keepalive_connections=0), trust_env=False
        )

    @property
    def e2b(self) -> E2BState | None:
        """The E2B layer's state (tokens, deadlines), when the E2B API is mounted and started."""
        state: E2BState | None = getattr(self._app.state, "e2b", None)
        return state

    async def aclose(self) -> None:
        await self.client.aclose()

    async def forward(
        self, scope: Scope, receive: Receive, send: Send, target: PortTarget, headers: Mapping[str, str]
    ) -> None:
        upstream = await self._upstream_or_refuse(scope, send, target, headers)
        if upstream is None:
            return
        if isinstance(upstream, tuple):
            await self._forward(scope, receive, send, target, headers, client=self.client, address=upstream)
            return
        # A tunnel: a client of its own whose one connection is the tunnel (closed with it).
        transport = _TunnelTransport(upstream)
        async with httpx.AsyncClient(transport=transport, timeout=_TIMEOUT, trust_env=False) as client:
            try:
                await self._forward(
                    scope, receive, send, target, headers, client=client, address=("127.0.0.1", target.port)
                )
            finally:
                await upstream.aclose()

    async def _upstream_or_refuse(
        self, scope: Scope, send: Send, target: PortTarget, headers: Mapping[str, str]
    ) -> tuple[str, int] | PortStream | None:
        """Where to send the request (see :meth:`_upstream`); None once a refusal has been answered instead."""
        try:
            return await self._upstream(target, headers)
        except _Refusal as refusal:
            await _refuse(send, scope, target, refusal, target.route)
        except ConnectionRefusedError:
            await _refuse(send, scope, target, _port_closed(), target.route)
        except CorralError as exc:
            await _refuse(send, scope, target, _Refusal(exc.http_status, exc.message, code=exc.code), target.route)
        except OSError as exc:
            failed = _Refusal(502, f"the server on port {target.port} failed: {exc}", code="port_unreachable")
            await _refuse(send, scope, target, failed, target.route)
        return None

    async def _forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: PortTarget,
        headers: Mapping[str, str],
        *,
        client: httpx.AsyncClient,
        address: tuple[str, int],
    ) -> None:
        upstream_headers = _request_headers(scope, headers, target)
        has_body = "content-length" in headers or "transfer-encoding" in headers
        request = client.build_request(
            scope["method"],
            f"http://{address[0]}:{address[1]}{target.path}",
            headers=upstream_headers,
            content=_body(receive) if has_body else None,
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectError:
            await _refuse(send, scope, target, _port_closed(), target.route)
            return
        except httpx.HTTPError as exc:
            failed = _Refusal(502, f"the server on port {target.port} failed: {exc}", code="port_unreachable")
            await _refuse(send, scope, target, failed, target.route)
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k, v) for k, v in response.headers.raw if k.decode("latin-1").lower() not in _HOP_BY_HOP
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except httpx.HTTPError as exc:
            # The status line is out; all that is left is to cut the body short, which the client sees.
            log.info("port %d of workspace %s: response cut short: %s", target.port, target.workspace_id, exc)
        finally:
            await response.aclose()

    async def forward_websocket(
        self, scope: Scope, receive: Receive, send: Send, target: PortTarget, headers: Mapping[str, str]
    ) -> None:
        """Open the same WebSocket to the server inside, then relay messages both ways until either side closes.

        A refusal, or a server inside that does not take the handshake, closes before accepting: the client's
        handshake gets 403 (ASGI servers answer no other status there)."""
        upstream = await self._upstream_or_refuse(scope, send, target, headers)
        if upstream is None:
            return
        if isinstance(upstream, tuple):
            await self._forward_websocket(scope, receive, send, target, headers, address=upstream, sock=None)
            return
        # A tunnel: the WebSocket client gets one end of a socket pair, the other end is spliced to the tunnel.
        near, far = socket.socketpair()
        try:
            splice = await _Splice.start(far, upstream)
        except BaseException:
            near.close()
            far.close()
            await upstream.aclose()
            raise
        try:
            await self._forward_websocket(
                scope, receive, send, target, headers, address=("127.0.0.1", target.port), sock=near
            )
        finally:
            near.close()
            await splice.aclose()

    async def _forward_websocket(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        target: PortTarget,
        headers: Mapping[str, str],
        *,
        address: tuple[str, int],
        sock: socket.socket | None,
    ) -> None:
        dropped = {"host", "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"}
        dropped |= {"sec-websocket-protocol", "user-agent"}  # set by the client library from its own arguments
        upstream_headers = [(k, v) for k, v in _request_headers(scope, headers, target) if k.lower() not in dropped]
        try:
            upstream = await ws_connect(
                f"ws://{address[0]}:{address[1]}{target.path}",
                sock=sock,
                additional_headers=upstream_headers,
                subprotocols=[Subprotocol(p) for p in scope.get("subprotocols", [])] or None,
                user_agent_header=headers.get("user-agent"),
                proxy=None,
                compression=None,
                max_size=_WS_MAX_MESSAGE,
                ping_interval=None,  # the client's own pings pass through; the proxy adds none
            )
        except (OSError, TimeoutError, InvalidHandshake) as exc:
            log.info("port %d of workspace %s: WebSocket refused: %s", target.port, target.workspace_id, exc)
            await send({"type": "websocket.close", "code": 1011, "reason": "the server inside refused the WebSocket"})
            return
        async with upstream:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            await _relay(receive, send, upstream)

    async def _upstream(self, target: PortTarget, headers: Mapping[str, str]) -> tuple[str, int] | PortStream:
        """The networked workspace's address to dial, or an open tunnel into an isolated one (ConnectionRefusedError
        when nothing listens on the port)."""
        service = self.service
        if target.route == "host":
            await self._admit(target, headers)
        else:
            await service.ensure_ready(target.workspace_id)
        record = await service.get(target.workspace_id)
        provider = service.providers.get(record.provider or "")
        if record.network == "isolated":
            if provider is None or not isinstance(provider, PortTunnel):
                raise _Refusal(
                    501,
                    f"provider {record.provider!r} of workspace {target.workspace_id} cannot reach ports inside a "
                    "workspace without network; create it with network 'default' (E2B: allow_internet_access left "
                    "true) to reach its ports",
                    code="port_tunnel_unavailable",
                )
            return await provider.open_port(target.workspace_id, target.port)
        if provider is None or not isinstance(provider, PortDialer):
            raise _Refusal(
                501,
                f"provider {record.provider!r} of workspace {target.workspace_id} cannot reach ports inside it",
                code="port_tunnel_unavailable",
            )
        return await provider.port_address(target.workspace_id, target.port)

    async def _admit(self, target: PortTarget, headers: Mapping[str, str]) -> None:
        """E2B's checks, in E2B's order: the sandbox exists, the token (before anything may resume it), it runs."""
        not_found = _Refusal(404, "The sandbox was not found", code="not_found")
        try:
            record = await self.service.get(target.workspace_id)
        except (WorkspaceNotFoundError, WorkspaceDestroyedError):
            raise not_found from None
        if record.status == "destroyed" or record.pool_key is not None:
            raise not_found
        if not SandboxExtras.of(record).allow_public_traffic:
            given = headers.get(TRAFFIC_TOKEN_HEADER)
            prefix = "Sandbox is secured with traffic access token."
            if not given:
                raise _Refusal(403, f"{prefix} Token header '{TRAFFIC_TOKEN_HEADER}' is missing", code="forbidden")
            e2b = self.e2b
            expected = e2b.traffic_token(record.id) if e2b is not None else ""
            if not hmac.compare_digest(given.encode(), expected.encode()):
                raise _Refusal(
                    403, f"{prefix} Provided token in header '{TRAFFIC_TOKEN_HEADER}' is invalid", code="forbidden"
                )
        e2b = self.e2b
        if e2b is not None:
            if not await e2b.admit(record.id):
                raise not_found
        else:
            try:
                await self.service.ensure_ready(record.id)
            except CorralError:
                raise not_found from None


class _TunnelTransport(httpx.AsyncHTTPTransport):
    """httpx's own HTTP/1.1 transport whose one connection is a tunnel into a workspace instead of a TCP socket."""

    def __init__(self, stream: PortStream) -> None:
        super().__init__(trust_env=False)
        # httpx builds its pool without a way to pass a network backend; this is the pool it would build, over ours.
        self._pool = httpcore.AsyncConnectionPool(network_backend=_TunnelBackend(stream), max_keepalive_connections=0)


class _TunnelBackend(httpcore.AsyncNetworkBackend):
    """Hands out its one tunnel as the connection to whatever address is asked for (the request names the port)."""

    def __init__(self, stream: PortStream) -> None:
        self._stream: PortStream | None = stream

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        del host, port, timeout, local_address, socket_options
        stream, self._stream = self._stream, None
        if stream is None:  # keep-alive is off: a second connection would need a second tunnel
            raise httpcore.ConnectError("the tunnel carries one connection")
        return _TunnelNetworkStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("a tunnel has no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _TunnelNetworkStream(httpcore.AsyncNetworkStream):
    """A :class:`~corral.providers.base.PortStream` as httpcore's network stream; its failures as httpcore's."""

    def __init__(self, stream: PortStream) -> None:
        self._stream = stream
        self._left = b""  # the rest of a piece larger than httpcore asked for

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if not self._left:
            try:
                self._left = await self._stream.read()
            except (OSError, CorralError) as exc:
                raise httpcore.ReadError(str(exc)) from exc
        data, self._left = self._left[:max_bytes], self._left[max_bytes:]
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        try:
            await self._stream.write(buffer)
        except (OSError, CorralError) as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._stream.aclose()

    def get_extra_info(self, info: str) -> Any:
        return None


class _Splice:
    """Bytes both ways between a local socket and a tunnel, a bounded piece at a time, until both are done."""

    def __init__(self, stream: PortStream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._stream = stream
        self._reader = reader
        self._writer = writer
        self._tasks = [
            asyncio.create_task(self._guarded(self._outward())),
            asyncio.create_task(self._guarded(self._inward())),
        ]

    @classmethod
    async def start(cls, sock: socket.socket, stream: PortStream) -> _Splice:
        reader, writer = await asyncio.open_connection(sock=sock, limit=_SPLICE_CHUNK)
        return cls(stream, reader, writer)

    async def _guarded(self, direction: Awaitable[None]) -> None:
        """One direction; when it fails (the tunnel broke, the workspace stopped), the local socket is cut so that the
        WebSocket client sees the connection drop instead of waiting on it."""
        try:
            await direction
        except (OSError, CorralError) as exc:
            log.info("tunnelled WebSocket cut: %s", exc)
            self._writer.transport.abort()

    async def _outward(self) -> None:
        """Local socket -> tunnel; the tunnel's credit paces the reads."""
        while data := await self._reader.read(_SPLICE_CHUNK):
            await self._stream.write(data)
        await self._stream.write_eof()

    async def _inward(self) -> None:
        """Tunnel -> local socket; draining paces the tunnel's reads (and so the agent's window)."""
        while data := await self._stream.read():
            self._writer.write(data)
            await self._writer.drain()
        if self._writer.can_write_eof():
            self._writer.write_eof()

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, CorralError):
                await task
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
        await self._stream.aclose()


async def _relay(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    """Messages both ways until one side closes; the other is then closed with the same code."""

    async def from_client() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.receive":
                data = message.get("bytes")
                await upstream.send(data if data is not None else message.get("text") or "")
            elif message["type"] == "websocket.disconnect":
                await upstream.close(code=_sendable(message.get("code", 1000)))
                return

    async def from_upstream() -> None:
        try:
            async for data in upstream:
                if isinstance(data, bytes):
                    await send({"type": "websocket.send", "bytes": data})
                else:
                    await send({"type": "websocket.send", "text": data})
        except ConnectionClosed:
            pass
        await send({"type": "websocket.close", "code": _sendable(upstream.close_code or 1000)})

    tasks = [asyncio.create_task(from_client()), asyncio.create_task(from_upstream())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, OSError, RuntimeError):
                await task


def _sendable(code: int) -> int:
    """A close code that may go on the wire: 1005 (none given), 1006 (dropped) and 1015 are only reported."""
    return 1000 if code in (1005, 1006, 1015) else code


def _port_closed() -> _Refusal:
    return _Refusal(502, "The sandbox is running but port is not open", code="port_closed")


def _request_headers(scope: Scope, headers: Mapping[str, str], target: PortTarget) -> list[tuple[str, str]]:
    dropped = _HOP_BY_HOP | {TRAFFIC_TOKEN_HEADER}
    if target.route == "path":
        dropped |= {"authorization"}  # Corral's token is for Corral, never for the workspace
    out = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in scope["headers"]
        if k.decode("latin-1").lower() not in dropped
    ]
    client = scope.get("client")
    if client:
        forwarded = headers.get("x-forwarded-for")
        out = [(k, v) for k, v in out if k.lower() != "x-forwarded-for"]
        out.append(("x-forwarded-for", f"{forwarded}, {client[0]}" if forwarded else str(client[0])))
    out.append(("x-forwarded-proto", str(scope.get("scheme", "http"))))
    return out


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    """The request body as it arrives, chunk by chunk (never all of it at once)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise httpx.ReadError("the client went away while sending the request body")
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def _refuse(
    send: Send, scope: Scope, target: PortTarget | None, refusal: _Refusal, route: Literal["host", "path"]
) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})
        return
    body: dict[str, Any]
    if route == "host":
        # E2B's proxy: its fields, plus the status as ``code`` like the rest of E2B's API.
        body = {"code": refusal.status, "message": refusal.message}
        if target is not None:
            body["sandboxId"] = target.workspace_id
            if refusal.code == "port_closed":
                body["port"] = str(target.port)
    else:
        details = {"id": target.workspace_id, "port": target.port} if target is not None else {}
        body = {"error": {"code": refusal.code, "message": refusal.message, "details": details}}
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def mount_ports(app: FastAPI, *, domain: str | None) -> None:
    """Serve ports on ``app``: call it in ``create_app`` after the other middleware is added, so host routing runs
    first (the last middleware added is the outermost), and after the app's lifespan has made its service."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        proxy = _Proxy(app)
        app.state.ports = proxy
        try:
            yield
        finally:
            await proxy.aclose()

    app.add_middleware(PortRoutes, domain=domain, token=lambda: str(app.state.api_token))
    app.include_router(APIRouter(lifespan=lifespan))
