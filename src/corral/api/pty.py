"""``GET /api/v1/agent/workspaces/{id}/pty``: a terminal in a workspace over a WebSocket (the CLI's ``shell``, the
web console's terminal).

The upgrade is authenticated by :class:`~corral.api.guard.RequestGuard` before it is accepted (the ``Authorization``
header, or the ``corral.token.<base64url>`` subprotocol for browsers; such a client also offers ``corral.pty``, which
is then selected). Query: ``rows`` and ``cols`` (24 x 80), ``cwd`` (/workspace) and ``command``, a shell command line
run by ``/bin/bash -l -c`` (default: an interactive login shell).

Messages:

* client -> server: binary frames are keystrokes; text frames are JSON control messages,
  ``{"type": "resize", "rows": R, "cols": C}`` or ``{"type": "input", "data": text}``.
* server -> client: binary frames are what the terminal shows; ``{"type": "exit", "exit_code": N}`` when the command
  ends, then close 1000. An error is ``{"type": "error", "code", "message"}`` then close 4404 (unknown workspace),
  4409 (workspace not ready or destroyed), 4400 (bad query or control message), 1009 (a message over
  :data:`MAX_INPUT_MESSAGE`) or 1011 (anything else).

Memory does not depend on what either side sends: output is forwarded one chunk at a time, each send awaited (a slow
client slows the terminal, as a real one would), and input is written to the terminal before the next message is
read. Closing the socket kills the command.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from corral.errors import (
    CorralError,
    InvalidRequestError,
    WorkspaceDestroyedError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import WORKSPACE_ROOT, ExecExit, PtyRequest, PtySession

__all__ = ["MAX_INPUT_MESSAGE", "PTY_SUBPROTOCOL", "router"]

log = logging.getLogger(__name__)

router = APIRouter(tags=["workspaces"])

PTY_SUBPROTOCOL = "corral.pty"
"""The subprotocol a browser offers next to its token; the server selects it."""
MAX_INPUT_MESSAGE = 64 * 1024
"""The most bytes one client message may carry (a paste larger than this is split by any sane client)."""
LOGIN_SHELL = ("/bin/bash", "-i", "-l")

CLOSE_NORMAL = 1000
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_BAD_REQUEST = 4400
CLOSE_NOT_FOUND = 4404
CLOSE_NOT_READY = 4409


class _Closing(Exception):
    """Stop the session: send this error frame, then close with ``close_code``."""

    def __init__(self, close_code: int, code: str, message: str) -> None:
        super().__init__(message)
        self.close_code = close_code
        self.code = code
        self.message = message


def _close_code(exc: CorralError) -> int:
    if isinstance(exc, WorkspaceNotFoundError):
        return CLOSE_NOT_FOUND
    if isinstance(exc, WorkspaceStateError | WorkspaceDestroyedError):
        return CLOSE_NOT_READY
    if isinstance(exc, InvalidRequestError):
        return CLOSE_BAD_REQUEST
    return CLOSE_INTERNAL


def _size(query: dict[str, str], name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise InvalidRequestError(
            f"{name}: must be a number from 1 to 65535, got {raw[:20]!r}", details={"field": name}
        )
    return int(raw)


def _request(query: dict[str, str]) -> PtyRequest:
    """The terminal the query asks for (see the module docstring)."""
    command = query.get("command")
    if command is not None and not command.strip():
        raise InvalidRequestError("command: must not be empty when given", details={"field": "command"})
    request = PtyRequest(
        argv=LOGIN_SHELL if command is None else ("/bin/bash", "-l", "-c", command),
        cwd=query.get("cwd") or WORKSPACE_ROOT,
        rows=_size(query, "rows", 24),
        cols=_size(query, "cols", 80),
    )
    request.validate()
    return request


@router.websocket("/api/v1/agent/workspaces/{workspace_id}/pty")
async def workspace_pty(websocket: WebSocket, workspace_id: str) -> None:
    """Open a terminal in the workspace and relay it over this WebSocket (see the module docstring)."""
    service: WorkspaceService = websocket.app.state.service
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=PTY_SUBPROTOCOL if PTY_SUBPROTOCOL in offered else None)
    try:
        request = _request(dict(websocket.query_params))
        await service.ensure_ready(workspace_id)
        session = await service.runtime.open_pty(workspace_id, request)
    except CorralError as exc:
        await _close(websocket, _Closing(_close_code(exc), exc.code, exc.message))
        return
    await _relay(websocket, session, workspace_id, service)


async def _relay(websocket: WebSocket, session: PtySession, workspace_id: str, service: WorkspaceService) -> None:
    """Forward both ways until the command ends (exit frame, close 1000) or the client goes (the command is killed)."""
    output = asyncio.create_task(_forward_output(websocket, session), name=f"pty-out-{workspace_id}")
    # Typing is use: a terminal someone types into is not idle, however long ago it was opened.
    typing = asyncio.create_task(
        _forward_input(websocket, session, lambda: service.note_use(workspace_id)), name=f"pty-in-{workspace_id}"
    )
    closing: _Closing | None = None
    exit_code: int | None = None
    try:
        done, _ = await asyncio.wait({output, typing}, return_when=asyncio.FIRST_COMPLETED)
        for task in (output, typing):  # the output first: an exit that raced a disconnect still counts
            if task in done and not task.cancelled():
                failure = task.exception()
                if isinstance(failure, _Closing):
                    closing = closing or failure
                elif isinstance(failure, CorralError):
                    closing = closing or _Closing(_close_code(failure), failure.code, failure.message)
                elif failure is not None and not isinstance(failure, WebSocketDisconnect):
                    log.error("terminal in workspace %s failed", workspace_id, exc_info=failure)
                    closing = closing or _Closing(CLOSE_INTERNAL, "internal_error", type(failure).__name__)
                elif task is output and failure is None:
                    exit_code = output.result()
    finally:
        for task in (output, typing):
            task.cancel()
        await asyncio.gather(output, typing, return_exceptions=True)
        if exit_code is None:
            with contextlib.suppress(Exception):  # the command may be gone already; the socket must still close
                await session.kill()
    if exit_code is not None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_text(json.dumps({"type": "exit", "exit_code": exit_code}))
            await websocket.close(CLOSE_NORMAL)
    elif closing is not None:
        await _close(websocket, closing)
    else:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.close(CLOSE_NORMAL)


async def _forward_output(websocket: WebSocket, session: PtySession) -> int:
    """Send what the terminal shows, one awaited send per chunk; returns the command's exit code."""
    async with contextlib.aclosing(session.events()) as events:  # closing it early kills the command
        async for event in events:
            if isinstance(event, ExecExit):
                return event.exit_code
            await websocket.send_bytes(event.data)
    raise _Closing(CLOSE_INTERNAL, "provider_unavailable", "the terminal ended without an exit status")


async def _forward_input(websocket: WebSocket, session: PtySession, used: Callable[[], None]) -> None:
    """Type binary frames into the terminal and apply control messages, until the client closes."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        used()
        data: bytes | None = message.get("bytes")
        text: str | None = message.get("text")
        size = len(data) if data is not None else len(text or "")
        if size > MAX_INPUT_MESSAGE:
            raise _Closing(CLOSE_TOO_BIG, "payload_too_large", f"a message may carry at most {MAX_INPUT_MESSAGE} bytes")
        if data is not None:
            await session.write(data)
        elif text is not None:
            await _control(session, text)


async def _control(session: PtySession, text: str) -> None:
    try:
        message: Any = json.loads(text)
    except ValueError:
        message = None
    kind = message.get("type") if isinstance(message, dict) else None
    if kind == "input" and isinstance(message.get("data"), str):
        await session.write(message["data"].encode())
    elif kind == "resize":
        rows, cols = message.get("rows"), message.get("cols")
        valid = all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535 for v in (rows, cols))
        if not valid:
            raise _Closing(
                CLOSE_BAD_REQUEST, "invalid_request", "resize: rows and cols must be numbers from 1 to 65535"
            )
        await session.resize(rows, cols)
    else:
        raise _Closing(
            CLOSE_BAD_REQUEST,
            "invalid_request",
            'a text message must be JSON: {"type": "resize", "rows": R, "cols": C} or {"type": "input", "data": "..."}',
        )


async def _close(websocket: WebSocket, closing: _Closing) -> None:
    if websocket.application_state is WebSocketState.DISCONNECTED:
        return
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        await websocket.send_text(json.dumps({"type": "error", "code": closing.code, "message": closing.message}))
        await websocket.close(closing.close_code)
