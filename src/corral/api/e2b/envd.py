"""envd, E2B's in-sandbox daemon, under ``/e2b/envd``: served by Corral for every sandbox at once.

The SDK (with ``E2B_SANDBOX_URL`` set) sends every envd request to one URL and names the sandbox in the
``E2b-Sandbox-Id`` header; that header is how one Corral server serves many sandboxes. Requests authenticate with
``X-Access-Token`` (the ``envdAccessToken`` of the create/connect answer) or with ``X-API-KEY: <CORRAL_API_TOKEN>``.

Served, as envd 0.6.4 serves it (:data:`corral.api.e2b.control.ENVD_VERSION`, the version sandboxes report):

* ``GET /health`` (204), ``GET /files`` (download, streamed; gzip when ``Accept-Encoding`` prefers it, as envd
  chooses) and ``POST /files`` (upload: ``application/octet-stream`` or ``multipart/form-data`` with one or many
  files, either of them gzip-encoded, streamed either way; ``X-Metadata-<key>`` headers set the files' metadata).
  Both also accept the signed URLs of the SDK's ``download_url``/``upload_url`` without any header: the signature
  names the sandbox. The SDK puts those URLs at the server root (``/files``), so :func:`signed_files_router` serves
  them there.
* ``process.Process``: ``Start`` (with or without ``pty``) and ``Connect`` (server streams), ``List``,
  ``SendInput``, ``StreamInput``, ``SendSignal`` (SIGKILL, SIGTERM), ``CloseStdin``, ``Update`` (a PTY's size);
  see :mod:`corral.api.e2b._processes` for how pids, signals, stdin and PTYs are built on the provider contract.
* ``filesystem.Filesystem``: ``Stat``, ``MakeDir``, ``Move``, ``ListDir`` (with ``depth``), ``Remove``. Entries
  carry what envd's do: owner and group names, Go's permission string, the permission bits, the modification time
  and the metadata; a symlink is reported with its target's type and permission bits and the resolved target path
  (``symlinkTarget``). gVisor has no xattrs, so metadata lives in a mirror tree inside the sandbox: see
  :mod:`corral.api.e2b._metadata` for where, and how it follows moves and removals. Directory watches:
  ``WatchDir`` (stream) and ``CreateWatcher``/``GetWatcherEvents``/``RemoveWatcher`` (polled), with ``recursive`` and
  ``include_entry``, on the guest agent's inotify; see :mod:`corral.api.e2b._watches` (``allow_network_mounts`` is
  accepted and changes nothing: a workspace has no network mounts).

Commands, terminals and file calls act as the ``user`` the SDK names (E2B's default,
``user``, when it names none): commands run as that user with its HOME, USER and LOGNAME, uploaded files belong to it,
and relative paths, ``~`` and a command without ``cwd`` start at its home (``/home/user``; ``/root`` for root).

A sandbox that is paused, killed or unknown answers HTTP 502 "The sandbox ... was not found", as E2B's edge proxy
does, which the SDK reports as ``SandboxNotRunningException``. The exception is a sandbox created with
``autoResume`` and paused with its memory: a request resumes it first, as on E2B.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import posixpath
import signal as signals
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute

from corral.api.e2b._connect import (
    STREAM_CONTENT_TYPE,
    UNARY_CONTENT_TYPE,
    ConnectCode,
    ConnectError,
    b64decode,
    end_of_stream,
    envelope,
    field,
    parse_message,
    read_envelopes,
    timeout_from_headers,
    unary_error,
)
from corral.api.e2b._encoding import GZIP, content_type, gunzip, gzip_stream, request_encoding, response_encoding
from corral.api.e2b._entries import EntryReader, both
from corral.api.e2b._metadata import metadata_from_headers
from corral.api.e2b._multipart import boundary_of, read_parts
from corral.api.e2b._processes import Event, stream_events
from corral.api.e2b._state import E2BState
from corral.api.e2b._watches import EVENT_TYPES, Watcher
from corral.api.e2b.control import get_state
from corral.errors import (
    CorralError,
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    WorkspaceDestroyedError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.providers.base import DirEvent, ExecMode, ExecRequest, WorkspaceCalls, check_path, check_user
from corral.streams import relay

__all__ = ["envd_router", "signed_files_router"]

DEFAULT_USER = "user"
HOME = "/home/user"
_GONE = (WorkspaceNotFoundError, WorkspaceDestroyedError, WorkspaceStateError)
_SIGNALS: dict[object, int] = {
    "SIGNAL_SIGKILL": signals.SIGKILL,
    "SIGNAL_SIGTERM": signals.SIGTERM,
    int(signals.SIGKILL): signals.SIGKILL,
    int(signals.SIGTERM): signals.SIGTERM,
}
_DEFAULT_KEEPALIVE_S = 50.0


class _EnvdError(Exception):
    """A plain HTTP answer in envd's error shape (``{"code": status, "message": ...}``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> JSONResponse:
        # The request's body may be unread (a refused upload): close rather than drain whatever the client sends.
        headers = {"connection": "close"} if self.status in (400, 401, 403) else None
        return JSONResponse({"code": self.status, "message": self.message}, status_code=self.status, headers=headers)


def _gone(sandbox_id: str) -> _EnvdError:
    # The words "was not found" make the SDK raise SandboxNotRunningException, as for E2B's edge proxy.
    return _EnvdError(502, f"The sandbox {sandbox_id} was not found")


@dataclass(frozen=True, slots=True)
class _Sandbox:
    state: E2BState
    id: str
    provider: WorkspaceCalls

    @property
    def entries(self) -> EntryReader:
        """envd's view of this sandbox's files: entries as envd reports them, and their metadata."""
        return EntryReader(self.provider, self.id)


async def _sandbox(request: Request, *, signed: bool = False) -> _Sandbox:
    """Authenticate the request and resolve the sandbox it names to a running workspace's provider.

    With ``signed``, a request without headers may instead carry a file URL signature (the SDK's ``download_url`` /
    ``upload_url``), which identifies the sandbox whose access token signed it.
    """
    state = get_state(request)
    sandbox_id = request.headers.get("e2b-sandbox-id")
    signature = request.query_params.get("signature")
    if not sandbox_id and signed and signature:
        sandbox_id = await _signer(state, request, signature)
    elif not sandbox_id and signed:
        raise _EnvdError(401, "missing signature query parameter")
    elif not sandbox_id:
        raise _EnvdError(400, "the E2b-Sandbox-Id header is required (the SDK sends it when E2B_SANDBOX_URL is set)")
    else:
        token = request.headers.get("x-access-token")
        key = request.headers.get("x-api-key")
        if not ((token and state.token_matches(sandbox_id, token)) or (key and state.api_key_matches(key))):
            raise _EnvdError(
                401, "unauthorized access, please provide a valid access token or method signing if supported"
            )
    # Killed, past its deadline (even while the kill runs), paused or unknown: gone. autoResume wakes a paused one.
    if not await state.admit(sandbox_id):
        raise _gone(sandbox_id)
    return _Sandbox(state, sandbox_id, state.service.runtime)


async def _signer(state: E2BState, request: Request, signature: str) -> str:
    """The running sandbox whose access token made this file URL signature (``v1_`` + sha256, as the SDK signs)."""
    raw_expiration = request.query_params.get("signature_expiration")
    try:
        expiration = int(raw_expiration) if raw_expiration else None
    except ValueError:
        raise _EnvdError(400, "signature_expiration: must be a Unix timestamp") from None
    operation = "read" if request.method == "GET" else "write"
    base = f"{request.query_params.get('path', '')}:{operation}:{request.query_params.get('username', '')}"
    suffix = f":{expiration}" if expiration is not None else ""
    for record in await state.service.store.workspaces.list(status="ready"):
        raw = f"{base}:{state.access_token(record.id)}{suffix}"
        digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
        if hmac.compare_digest(f"v1_{digest}".encode(), signature.encode()):
            # envd's words and order: the signature first, then its expiration
            if expiration is not None and expiration < time.time():
                raise _EnvdError(401, "signature is already expired")
            return record.id
    raise _EnvdError(401, "invalid signature")


def _http_error(exc: CorralError, sandbox_id: str) -> _EnvdError:
    if isinstance(exc, _GONE):
        return _gone(sandbox_id)
    if isinstance(exc, WorkspaceFileNotFoundError):
        return _EnvdError(404, exc.message)
    if isinstance(exc, FileOperationError | InvalidRequestError):
        return _EnvdError(400, exc.message)
    if isinstance(exc, ResourceLimitError):
        return _EnvdError(507, exc.message)
    return _EnvdError(503 if isinstance(exc, ProviderUnavailableError) else 500, exc.message)


_RPC_CODES: tuple[tuple[type[CorralError], ConnectCode], ...] = (
    (WorkspaceFileNotFoundError, ConnectCode.NOT_FOUND),
    (FileOperationError, ConnectCode.INVALID_ARGUMENT),
    (InvalidRequestError, ConnectCode.INVALID_ARGUMENT),
    (ResourceLimitError, ConnectCode.RESOURCE_EXHAUSTED),
    (ExecTimeoutError, ConnectCode.DEADLINE_EXCEEDED),
    (ProviderUnavailableError, ConnectCode.UNAVAILABLE),
)
_FILE_ERROR_CODES = {"exists": ConnectCode.ALREADY_EXISTS, "permission": ConnectCode.PERMISSION_DENIED}


def _rpc_error(exc: CorralError) -> ConnectError:
    code = next((code for kind, code in _RPC_CODES if isinstance(exc, kind)), ConnectCode.INTERNAL)
    if isinstance(exc, FileOperationError) and not isinstance(exc, WorkspaceFileNotFoundError):
        code = _FILE_ERROR_CODES.get(str(exc.details.get("kind")), code)
    return ConnectError(code, exc.message)


class _EnvdRoute(APIRoute):
    """Turns failures of the plain HTTP routes into envd's error shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except _EnvdError as exc:
                return exc.response()
            except CorralError as exc:
                return _http_error(exc, request.headers.get("e2b-sandbox-id", "")).response()

        return route


# --- paths and entries --------------------------------------------------------------------------------------------


def _user(request: Request) -> str:
    """The user an envd call acts as: the RPCs name it in ``Authorization: Basic base64(user:)``, the file routes
    in ``username``; E2B's default is ``user``. A signed file URL acts only as the ``username`` it was signed for:
    a header added to it is not covered by the signature.

    Raises:
        InvalidRequestError: the name cannot be a user (it becomes a home path and a command argument).
    """
    name = request.query_params.get("username")
    auth = request.headers.get("authorization", "")
    if not name and auth[:6].lower() == "basic " and "signature" not in request.query_params:
        with contextlib.suppress(ValueError):
            name = base64.b64decode(auth[6:], validate=True).decode().partition(":")[0]
    name = name or DEFAULT_USER
    check_user(name, field_name="username")
    return name


def _home(user: str) -> str:
    """The user's home, where relative paths, ``~`` and a command without cwd start (E2B's layout)."""
    return "/root" if user == "root" else f"/home/{user}"


def _path(raw: object, *, name: str = "path", home: str = HOME) -> str:
    """An absolute sandbox path: relative paths and ``~`` start at ``home`` (the caller's user's)."""
    if not isinstance(raw, str) or not raw:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"{name}: a path is required")
    if raw == "~" or raw.startswith("~/"):
        raw = home + raw[1:]
    elif not raw.startswith("/"):
        raw = f"{home}/{raw}"
    try:
        return posixpath.normpath(check_path(raw, field_name=name))
    except InvalidRequestError as exc:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, exc.message) from None


# --- RPC plumbing -------------------------------------------------------------------------------------------------

Unary = Callable[[_Sandbox, dict[str, Any], Request], Awaitable[dict[str, Any]]]


async def _unary(request: Request, handler: Unary) -> Response:
    try:
        sandbox = await _sandbox(request)
        message = parse_message(await request.body())
        reply = await handler(sandbox, message, request)
    except _EnvdError as exc:
        return exc.response()  # plain HTTP: the SDK maps 401 and "was not found" 502s itself
    except ConnectError as exc:
        return unary_error(exc)
    except CorralError as exc:
        if isinstance(exc, _GONE):
            return _gone(request.headers.get("e2b-sandbox-id", "")).response()
        return unary_error(_rpc_error(exc))
    return JSONResponse(reply, media_type=UNARY_CONTENT_TYPE)


def _streaming(items: AsyncGenerator[Event | ConnectError, None]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for item in items:
                if isinstance(item, ConnectError):
                    yield end_of_stream(item)
                    return
                if "end" in item:  # the command's end and the stream's in one write: the client reads them at once
                    yield envelope({"event": item}) + end_of_stream()
                    return
                yield envelope({"event": item})
            yield end_of_stream()
        finally:
            await items.aclose()

    return StreamingResponse(body(), media_type=STREAM_CONTENT_TYPE)


def _stream_error(error: ConnectError) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        yield end_of_stream(error)

    return StreamingResponse(body(), media_type=STREAM_CONTENT_TYPE)


async def _first_message(request: Request) -> dict[str, Any]:
    async for message in read_envelopes(request.stream()):
        return message
    return {}


def _keepalive(request: Request) -> float:
    try:
        return max(1.0, float(request.headers.get("keepalive-ping-interval", _DEFAULT_KEEPALIVE_S)))
    except ValueError:
        return _DEFAULT_KEEPALIVE_S


# --- process.Process ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StartRequest:
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str | None
    tag: str | None
    stdin: bool
    pty: tuple[int, int] | None
    """Rows and columns of the PTY to start the command on."""


def _pty_size(pty: object) -> tuple[int, int]:
    """``process.PTY``'s size as (rows, cols), checked."""
    size = field(pty, "size") if isinstance(pty, Mapping) else None
    if not isinstance(size, Mapping):
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "pty.size: required")
    rows, cols = size.get("rows", 0), size.get("cols", 0)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535 for v in (rows, cols)):
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"pty.size: rows and cols between 1 and 65535, got {size}")
    return rows, cols


def _parse_start(message: Mapping[str, Any]) -> _StartRequest:
    """``process.StartRequest``, checked."""
    pty = field(message, "pty")
    config = field(message, "process") or {}
    cmd = field(config, "cmd")
    if not isinstance(cmd, str) or not cmd:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "process.cmd: required")
    cwd, tag = field(config, "cwd"), field(message, "tag")
    return _StartRequest(
        cmd=cmd,
        args=[str(a) for a in field(config, "args") or []],
        envs={str(k): str(v) for k, v in (field(config, "envs") or {}).items()},
        cwd=cwd if isinstance(cwd, str) and cwd else None,
        tag=tag if isinstance(tag, str) else None,
        stdin=bool(field(message, "stdin")),
        pty=None if pty is None else _pty_size(pty),
    )


async def _start(request: Request) -> Response:
    try:
        sandbox = await _sandbox(request)
        start = _parse_start(await _first_message(request))
        user = _user(request)
        home = _home(user)
        common: dict[str, Any] = {
            "cmd": start.cmd,
            "args": start.args,
            "envs": start.envs,
            "base_env": await sandbox.state.envs(sandbox.id),
            "cwd": start.cwd,
            "workdir": _path(start.cwd, name="process.cwd", home=home) if start.cwd else home,
            "user": user,
            "tag": start.tag,
            "deadline_s": timeout_from_headers(request.headers),
        }
        processes = sandbox.state.processes
        if start.pty is not None:
            rows, cols = start.pty
            process, subscriber = await processes.start_pty(
                sandbox.id, sandbox.provider, rows=rows, cols=cols, **common
            )
        else:
            process, subscriber = processes.start(sandbox.id, sandbox.provider, stdin=start.stdin, **common)
    except _EnvdError as exc:
        return exc.response()
    except ConnectError as exc:
        return _stream_error(exc)
    except CorralError as exc:
        if isinstance(exc, _GONE):
            return _gone(request.headers.get("e2b-sandbox-id", "")).response()
        return _stream_error(_rpc_error(exc))
    # The provider enforces the deadline (and kills the command); the stream itself needs no second timer.
    return _streaming(stream_events(process, subscriber, keepalive_s=_keepalive(request), deadline_s=None))


async def _connect(request: Request) -> Response:
    try:
        sandbox = await _sandbox(request)
        message = await _first_message(request)
        deadline = timeout_from_headers(request.headers)
        process = sandbox.state.processes.find(sandbox.id, field(message, "process"))
        subscriber = process.subscribe()
    except _EnvdError as exc:
        return exc.response()
    except ConnectError as exc:
        return _stream_error(exc)
    return _streaming(stream_events(process, subscriber, keepalive_s=_keepalive(request), deadline_s=deadline))


async def _list_processes(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    return {"processes": [p.to_json() for p in sandbox.state.processes.running(sandbox.id)]}


async def _send_input(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    process = sandbox.state.processes.find(sandbox.id, field(message, "process"))
    data = _stdin_bytes(field(message, "input"))
    await sandbox.state.processes.send_input(process, sandbox.provider, data)
    return {}


def _stdin_bytes(value: object) -> bytes:
    if not isinstance(value, Mapping):
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "input: required")
    if "pty" in value:
        return b64decode(value.get("pty", ""), field="input.pty")
    return b64decode(value.get("stdin", ""), field="input.stdin")


async def _send_signal(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    process = sandbox.state.processes.find(sandbox.id, field(message, "process"))
    signum = _SIGNALS.get(field(message, "signal"))
    if signum is None:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "signal: SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    await sandbox.state.processes.signal(process, sandbox.provider, signum)
    return {}


async def _update(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    process = sandbox.state.processes.find(sandbox.id, field(message, "process"))
    pty = field(message, "pty")
    if pty is not None:
        await sandbox.state.processes.resize(process, *_pty_size(pty))
    return {}


async def _close_stdin(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    process = sandbox.state.processes.find(sandbox.id, field(message, "process"))
    await sandbox.state.processes.close_stdin(process, sandbox.provider)
    return {}


async def _feed_stdin(sandbox: _Sandbox, messages: AsyncIterator[dict[str, Any]]) -> None:
    process = None
    async for message in messages:
        if "start" in message:
            process = sandbox.state.processes.find(sandbox.id, field(message["start"] or {}, "process"))
        elif "data" in message:
            if process is None:
                raise ConnectError(ConnectCode.INVALID_ARGUMENT, "the first message must be a start event")
            data = _stdin_bytes(field(message["data"] or {}, "input"))
            await sandbox.state.processes.send_input(process, sandbox.provider, data)


async def _stream_input(request: Request) -> Response:
    try:
        sandbox = await _sandbox(request)
        await _feed_stdin(sandbox, read_envelopes(request.stream()))
    except _EnvdError as exc:
        return exc.response()
    except ConnectError as exc:
        return _stream_error(exc)
    except CorralError as exc:
        return _stream_error(_rpc_error(exc))

    async def body() -> AsyncIterator[bytes]:
        yield envelope({})
        yield end_of_stream()

    return StreamingResponse(body(), media_type=STREAM_CONTENT_TYPE)


# --- filesystem.Filesystem ----------------------------------------------------------------------------------------


async def _stat(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    entry = await sandbox.entries.stat(_path(field(message, "path"), home=_home(_user(request))))
    return {"entry": entry.to_json()}


_MAKE_DIR = r"""p=$1; u=$2; set --; d=$p
while [ ! -d "$d" ]; do set -- "$d" "$@"; d=$(dirname -- "$d"); done
mkdir -p -- "$p" && { [ $# -eq 0 ] || chown -h -- "$u:" "$@"; }"""
"""``mkdir -p`` of $1 whose new directories (collected before, as arguments) are then given to the user $2."""


async def _make_dir(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    path = _path(field(message, "path"), home=_home(_user(request)))
    try:
        existing = await sandbox.provider.stat(sandbox.id, path)
    except WorkspaceFileNotFoundError:
        existing = None
    if existing is not None:
        if existing.type == "dir":
            raise ConnectError(ConnectCode.ALREADY_EXISTS, f"directory already exists: {path}")
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"path already exists but it is not a directory: {path}")
    # As envd: made by root, and every directory it creates given to the caller's user.
    owner = _user(request)
    result = await sandbox.provider.exec(
        sandbox.id,
        ExecRequest("/bin/sh", ("-c", _MAKE_DIR, "sh", path, owner), mode=ExecMode.ARGV, cwd="/", timeout_s=60),
    )
    if result.exit_code != 0:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, result.stderr.decode(errors="replace").strip())
    # envd answers MakeDir with these three fields only.
    return {"entry": {"name": posixpath.basename(path) or "/", "type": "FILE_TYPE_DIRECTORY", "path": path}}


async def _move(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    source = _path(field(message, "source"), name="source", home=_home(_user(request)))
    destination = _path(field(message, "destination"), name="destination", home=_home(_user(request)))
    await sandbox.provider.move(sandbox.id, source, destination)
    info = await sandbox.provider.stat(sandbox.id, destination)
    await sandbox.entries.metadata.moved(source, destination, directory=info.type == "dir")
    return {"entry": (await sandbox.entries.complete(info)).to_json()}


async def _list_dir(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    path = _path(field(message, "path"), home=_home(_user(request)))
    depth = field(message, "depth") or 1  # envd: 0 (the default) means 1
    if not isinstance(depth, int) or depth < 1:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "depth: must be at least 1")
    return {"entries": [entry.to_json() for entry in await sandbox.entries.listing(path, depth)]}


async def _remove(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    path = _path(field(message, "path"), home=_home(_user(request)))
    if path == "/":
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "refusing to remove /")
    with contextlib.suppress(WorkspaceFileNotFoundError):  # envd uses os.RemoveAll: a missing path is fine
        await sandbox.provider.delete(sandbox.id, path, recursive=True)
    await sandbox.entries.metadata.removed(path)
    return {}


# --- directory watches (see corral.api.e2b._watches) ------------------------------------------------------------


def _watch_request(message: Mapping[str, Any], request: Request) -> tuple[str, bool, bool]:
    path = _path(field(message, "path"), home=_home(_user(request)))
    return path, bool(field(message, "recursive")), bool(field(message, "includeEntry", "include_entry"))


async def _event_json(sandbox: _Sandbox, watcher: Watcher, event: DirEvent) -> dict[str, Any]:
    """One event as envd's ``FilesystemEvent``; with ``include_entry``, the entry when it still exists."""
    out: dict[str, Any] = {"name": event.name, "type": EVENT_TYPES[event.type]}
    if watcher.include_entry:
        path = posixpath.normpath(posixpath.join(watcher.root, event.name))
        with contextlib.suppress(WorkspaceFileNotFoundError, FileOperationError):
            out["entry"] = (await sandbox.entries.stat(path)).to_json()
    return out


async def _create_watcher(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    path, recursive, include_entry = _watch_request(message, request)
    watcher = await sandbox.state.watches.open(sandbox.id, sandbox.provider, path, recursive=recursive)
    watcher.include_entry = include_entry
    return {"watcherId": watcher.id}


async def _get_watcher_events(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    watcher = sandbox.state.watches.find(sandbox.id, field(message, "watcherId", "watcher_id"))
    events = watcher.take()
    if not events and watcher.error is not None:
        raise watcher.error
    return {"events": [await _event_json(sandbox, watcher, event) for event in events]}


async def _remove_watcher(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    watcher = sandbox.state.watches.find(sandbox.id, field(message, "watcherId", "watcher_id"))
    await sandbox.state.watches.remove(watcher)
    return {}


async def _watch_dir(request: Request) -> Response:
    """``WatchDir``: a start event, then events as they happen (keepalives while quiet), until the call's deadline,
    the client leaving, or the sandbox's end (an error)."""
    try:
        sandbox = await _sandbox(request)
        deadline = timeout_from_headers(request.headers)
        path, recursive, include_entry = _watch_request(await _first_message(request), request)
        watcher = await sandbox.state.watches.open(sandbox.id, sandbox.provider, path, recursive=recursive)
    except _EnvdError as exc:
        return exc.response()
    except ConnectError as exc:
        return _stream_error(exc)
    except CorralError as exc:
        if isinstance(exc, _GONE):
            return _gone(request.headers.get("e2b-sandbox-id", "")).response()
        return _stream_error(_rpc_error(exc))
    watcher.include_entry = include_entry
    keepalive = _keepalive(request)
    end_at = None if deadline is None else time.monotonic() + deadline

    async def body() -> AsyncIterator[bytes]:
        try:
            yield envelope({"start": {}})
            while True:
                left = keepalive if end_at is None else min(keepalive, end_at - time.monotonic())
                if left <= 0:
                    yield end_of_stream(ConnectError(ConnectCode.DEADLINE_EXCEEDED, "the watch reached its timeout"))
                    return
                await watcher.wait(left)
                events = watcher.take()
                for event in events:
                    yield envelope({"filesystem": await _event_json(sandbox, watcher, event)})
                if watcher.ended:
                    yield end_of_stream(watcher.error)
                    return
                if not events and (end_at is None or time.monotonic() < end_at):
                    yield envelope({"keepalive": {}})
        finally:
            await sandbox.state.watches.remove(watcher)

    return StreamingResponse(body(), media_type=STREAM_CONTENT_TYPE)


_PROCESS_UNARY: dict[str, Unary] = {
    "List": _list_processes,
    "SendInput": _send_input,
    "SendSignal": _send_signal,
    "CloseStdin": _close_stdin,
    "Update": _update,
}
_FILESYSTEM_UNARY: dict[str, Unary] = {
    "Stat": _stat,
    "MakeDir": _make_dir,
    "Move": _move,
    "ListDir": _list_dir,
    "Remove": _remove,
    "CreateWatcher": _create_watcher,
    "GetWatcherEvents": _get_watcher_events,
    "RemoveWatcher": _remove_watcher,
}


# --- files ----------------------------------------------------------------------------------------------------------


def _file_path(raw: str | None, user: str) -> str:
    try:
        return _path(raw, home=_home(user))
    except ConnectError as exc:
        raise _EnvdError(400, exc.message) from None


async def health(request: Request) -> Response:
    """204 while the sandbox runs; 502 "was not found" when it is paused, killed or unknown."""
    await _sandbox(request)
    return Response(status_code=204)


async def download(request: Request) -> StreamingResponse:
    """A file's bytes, streamed, gzipped when ``Accept-Encoding`` asks (``path`` relative to the home of ``username``
    unless absolute)."""
    sandbox = await _sandbox(request, signed=True)
    path = _file_path(request.query_params.get("path"), _user(request))
    try:
        chunks = await sandbox.provider.read_file(sandbox.id, path)
    except WorkspaceFileNotFoundError:
        raise _EnvdError(404, f"path '{path}' does not exist") from None
    except FileOperationError as exc:
        if exc.details.get("kind") == "is_a_directory":
            raise _EnvdError(400, f"path '{path}' is a directory") from None
        raise
    try:
        encoding = response_encoding(request.headers.get("accept-encoding"))
    except InvalidRequestError:
        await chunks.aclose()
        raise
    headers = {"Vary": "Accept-Encoding"}  # as envd: caches keep one variant per Accept-Encoding
    body: AsyncIterator[bytes] = relay(chunks)
    if encoding == GZIP:
        headers["Content-Encoding"] = GZIP
        body = gzip_stream(body)
    return StreamingResponse(body, media_type=content_type(path), headers=headers)


def _written(path: str, metadata: Mapping[str, str]) -> dict[str, Any]:
    """envd's answer for one uploaded file; ``metadata`` only when the file has some."""
    entry: dict[str, Any] = {"name": posixpath.basename(path), "type": "file", "path": path}
    if metadata:
        entry["metadata"] = dict(metadata)
    return entry


async def _store(
    sandbox: _Sandbox, path: str, body: AsyncIterator[bytes], metadata: Mapping[str, str], owner: str
) -> None:
    """Write one uploaded file as ``owner`` and replace its metadata (an upload without any clears it, as envd
    rewrites it)."""
    await sandbox.provider.write_file(sandbox.id, path, body, owner=owner)
    # The metadata belongs to the file written, which is a symlink's target when ``path`` is a symlink. Clearing (the
    # common case) starts at ``path`` alongside the lookup, so a file that is no symlink costs one round trip.
    store = sandbox.entries.metadata
    if metadata:
        await store.write(await sandbox.provider.realpath(sandbox.id, path), metadata)
        return
    real, _ = await both(sandbox.provider.realpath(sandbox.id, path), store.write(path, {}))
    if real != path:
        await store.write(real, {})


async def upload(request: Request) -> JSONResponse:
    """Write one file (octet-stream body) or several (multipart parts named by ``path`` or their file name), gzipped
    or not; ``X-Metadata-<key>`` headers set every written file's metadata."""
    sandbox = await _sandbox(request, signed=True)
    metadata = metadata_from_headers(request.headers.raw)
    body: AsyncIterator[bytes] = request.stream()
    if request_encoding(request.headers.get("content-encoding")) == GZIP:
        body = gunzip(body)
    content_type = request.headers.get("content-type", "")
    media_type = content_type.partition(";")[0].strip().lower()
    query_path = request.query_params.get("path")
    user = _user(request)
    written: list[dict[str, Any]] = []
    if media_type.startswith("multipart/"):
        async for part in read_parts(body, boundary_of(content_type)):
            if part.name != "file":
                continue
            path = _file_path(query_path if query_path and not written else part.filename, user)
            if any(entry["path"] == path for entry in written):
                raise _EnvdError(
                    400,
                    f"you cannot upload multiple files to the same path '{path}' in one upload request, "
                    "only the first specified file was uploaded",
                )
            await _store(sandbox, path, part.body, metadata, user)
            written.append(_written(path, metadata))
        if not written:
            raise _EnvdError(400, "the multipart body has no part named 'file'")
        return JSONResponse(written)
    if media_type != "application/octet-stream":
        raise _EnvdError(
            400, f"unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
        )
    if not query_path:
        raise _EnvdError(400, "path query parameter is required for raw body upload")
    path = _file_path(query_path, user)
    await _store(sandbox, path, body, metadata, user)
    return JSONResponse([_written(path, metadata)])


async def process_rpc(method: str, request: Request) -> Response:
    """envd's process service (Connect protocol, JSON)."""
    streaming = {"Start": _start, "Connect": _connect, "StreamInput": _stream_input}.get(method)
    if streaming is not None:
        return await streaming(request)
    handler = _PROCESS_UNARY.get(method)
    if handler is None:
        return unary_error(ConnectError(ConnectCode.UNIMPLEMENTED, f"process.Process/{method} does not exist"))
    return await _unary(request, handler)


async def filesystem_rpc(method: str, request: Request) -> Response:
    """envd's filesystem service (Connect protocol, JSON)."""
    if method == "WatchDir":
        return await _watch_dir(request)
    handler = _FILESYSTEM_UNARY.get(method)
    if handler is None:
        message = f"filesystem.Filesystem/{method} does not exist"
        return unary_error(ConnectError(ConnectCode.UNIMPLEMENTED, message))
    return await _unary(request, handler)


def envd_router() -> APIRouter:
    """The envd routes (mounted under ``/e2b/envd`` by :func:`corral.api.e2b.e2b_routers`)."""
    router = APIRouter(route_class=_EnvdRoute, tags=["e2b-envd"])
    router.add_api_route("/health", health, methods=["GET"], status_code=204, name="e2b_envd_health")
    router.add_api_route("/files", download, methods=["GET"], name="e2b_envd_download")
    router.add_api_route("/files", upload, methods=["POST"], name="e2b_envd_upload")
    router.add_api_route("/process.Process/{method}", process_rpc, methods=["POST"], name="e2b_envd_process")
    router.add_api_route("/filesystem.Filesystem/{method}", filesystem_rpc, methods=["POST"], name="e2b_envd_fs")
    return router


def signed_files_router() -> APIRouter:
    """``GET|POST /files`` at the server root, for the signed URLs of ``download_url``/``upload_url``.

    The SDK builds those URLs with ``urljoin(E2B_SANDBOX_URL, "/files")``, which drops the ``/e2b/envd`` path, so they
    land at the root. Only the envd file routes are there, with the same authentication (signature or headers).
    """
    router = APIRouter(route_class=_EnvdRoute, tags=["e2b-envd"], include_in_schema=False)
    router.add_api_route("/files", download, methods=["GET"], name="e2b_signed_download")
    router.add_api_route("/files", upload, methods=["POST"], name="e2b_signed_upload")
    return router
