"""envd, E2B's in-sandbox daemon, under ``/e2b/envd``: served by Corral for every sandbox at once.

The SDK (with ``E2B_SANDBOX_URL`` set) sends every envd request to one URL and names the sandbox in the
``E2b-Sandbox-Id`` header; that header is how one Corral server serves many sandboxes. Requests authenticate with
``X-Access-Token`` (the ``envdAccessToken`` of the create/connect answer) or with ``X-API-KEY: <CORRAL_API_TOKEN>``.

Served:

* ``GET /health`` (204), ``GET /files`` (download, streamed) and ``POST /files`` (upload: ``application/octet-stream``,
  gzip or not, or ``multipart/form-data`` with one or many files, streamed either way). Both also accept the signed
  URLs of the SDK's ``download_url``/``upload_url`` without any header: the signature names the sandbox. The SDK
  puts those URLs at the server root (``/files``), so :func:`signed_files_router` serves them there.
* ``process.Process``: ``Start`` and ``Connect`` (server streams), ``List``, ``SendInput``, ``StreamInput``,
  ``SendSignal`` (SIGKILL, SIGTERM), ``CloseStdin``; see :mod:`corral.api.e2b._processes` for how pids, signals and
  stdin are built on the provider contract.
* ``filesystem.Filesystem``: ``Stat``, ``MakeDir``, ``Move``, ``ListDir`` (with ``depth``), ``Remove``.

Not served (the SDK gets ``unimplemented``): PTYs (``Start`` with ``pty``, ``Update``), directory watching
(``WatchDir``, ``CreateWatcher``...) and file metadata. The ``user`` the SDK names is ignored:
commands run as the image's user. The home directory, where relative paths, ``~`` and a command without ``cwd``
start, is ``/workspace``.

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
import stat as statlib
import time
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
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
from corral.api.e2b._multipart import boundary_of, read_parts
from corral.api.e2b._processes import Event, stream_events
from corral.api.e2b._state import E2BState
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
from corral.providers.base import WORKSPACE_ROOT, ExecMode, ExecRequest, FileInfo, WorkspaceCalls, check_path
from corral.streams import relay

__all__ = ["envd_router", "signed_files_router"]

HOME = WORKSPACE_ROOT
_GONE = (WorkspaceNotFoundError, WorkspaceDestroyedError, WorkspaceStateError)
_FILE_TYPES = {"file": "FILE_TYPE_FILE", "dir": "FILE_TYPE_DIRECTORY", "symlink": "FILE_TYPE_SYMLINK"}
_TYPE_BITS = {"file": statlib.S_IFREG, "dir": statlib.S_IFDIR, "symlink": statlib.S_IFLNK}
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
    elif not sandbox_id:
        raise _EnvdError(400, "the E2b-Sandbox-Id header is required (the SDK sends it when E2B_SANDBOX_URL is set)")
    else:
        token = request.headers.get("x-access-token")
        key = request.headers.get("x-api-key")
        if not ((token and state.token_matches(sandbox_id, token)) or (key and state.api_key_matches(key))):
            raise _EnvdError(401, "missing or wrong X-Access-Token for this sandbox")
    try:
        await state.service.ensure_ready(sandbox_id)
    except _GONE:
        if not await state.auto_resume(sandbox_id):  # E2B's autoResume: traffic wakes a sandbox paused with memory
            raise _gone(sandbox_id) from None
    return _Sandbox(state, sandbox_id, state.service.runtime)


async def _signer(state: E2BState, request: Request, signature: str) -> str:
    """The running sandbox whose access token made this file URL signature (``v1_`` + sha256, as the SDK signs)."""
    raw_expiration = request.query_params.get("signature_expiration")
    try:
        expiration = int(raw_expiration) if raw_expiration else None
    except ValueError:
        raise _EnvdError(400, "signature_expiration: must be a Unix timestamp") from None
    if expiration is not None and expiration < time.time():
        raise _EnvdError(401, "the signed URL has expired")
    operation = "read" if request.method == "GET" else "write"
    base = f"{request.query_params.get('path', '')}:{operation}:{request.query_params.get('username', '')}"
    suffix = f":{expiration}" if expiration is not None else ""
    for record in await state.service.store.workspaces.list(status="ready"):
        raw = f"{base}:{state.access_token(record.id)}{suffix}"
        digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
        if hmac.compare_digest(f"v1_{digest}".encode(), signature.encode()):
            return record.id
    raise _EnvdError(401, "the URL signature matches no running sandbox")


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


def _path(raw: object, *, name: str = "path") -> str:
    """An absolute sandbox path: relative paths and ``~`` start at the home directory (``/workspace``)."""
    if not isinstance(raw, str) or not raw:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"{name}: a path is required")
    if raw == "~" or raw.startswith("~/"):
        raw = HOME + raw[1:]
    try:
        return posixpath.normpath(check_path(raw, field_name=name))
    except InvalidRequestError as exc:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, exc.message) from None


def _timestamp(mtime: float) -> str:
    moment = datetime.fromtimestamp(mtime, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}Z"


def entry_json(info: FileInfo) -> dict[str, Any]:
    """``filesystem.EntryInfo`` of a path (owner and group are not known to the provider contract)."""
    entry: dict[str, Any] = {
        "name": info.name,
        "type": _FILE_TYPES.get(info.type, "FILE_TYPE_UNSPECIFIED"),
        "path": info.path,
        "size": str(info.size),
        "mode": info.mode,
        "permissions": statlib.filemode(_TYPE_BITS.get(info.type, 0) | info.mode),
        "owner": "",
        "group": "",
        "modifiedTime": _timestamp(info.mtime),
    }
    if info.type == "symlink":
        entry["symlinkTarget"] = info.symlink_target or ""
        entry["isSymlink"] = True
    return entry


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


def _parse_start(message: Mapping[str, Any]) -> _StartRequest:
    """``process.StartRequest``, checked."""
    if field(message, "pty"):
        raise ConnectError(ConnectCode.UNIMPLEMENTED, "PTYs are not supported by Corral; run commands without pty")
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
    )


async def _start(request: Request) -> Response:
    try:
        sandbox = await _sandbox(request)
        start = _parse_start(await _first_message(request))
        process, subscriber = sandbox.state.processes.start(
            sandbox.id,
            sandbox.provider,
            cmd=start.cmd,
            args=start.args,
            envs=start.envs,
            base_env=await sandbox.state.envs(sandbox.id),
            cwd=start.cwd,
            workdir=_path(start.cwd, name="process.cwd") if start.cwd else HOME,
            tag=start.tag,
            stdin=start.stdin,
            deadline_s=timeout_from_headers(request.headers),
        )
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
        raise ConnectError(ConnectCode.UNIMPLEMENTED, "PTY input is not supported by Corral")
    return b64decode(value.get("stdin", ""), field="input.stdin")


async def _send_signal(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    process = sandbox.state.processes.find(sandbox.id, field(message, "process"))
    signum = _SIGNALS.get(field(message, "signal"))
    if signum is None:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "signal: SIGNAL_SIGKILL or SIGNAL_SIGTERM")
    await sandbox.state.processes.signal(process, sandbox.provider, signum)
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
    info = await sandbox.provider.stat(sandbox.id, _path(field(message, "path")))
    return {"entry": entry_json(info)}


async def _make_dir(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    path = _path(field(message, "path"))
    try:
        existing = await sandbox.provider.stat(sandbox.id, path)
    except WorkspaceFileNotFoundError:
        existing = None
    if existing is not None:
        if existing.type == "dir":
            raise ConnectError(ConnectCode.ALREADY_EXISTS, f"directory {path} already exists")
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"path {path} already exists and is not a directory")
    result = await sandbox.provider.exec(
        sandbox.id, ExecRequest("mkdir", ("-p", "--", path), mode=ExecMode.ARGV, cwd="/", timeout_s=60)
    )
    if result.exit_code != 0:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, result.stderr.decode(errors="replace").strip())
    return {"entry": entry_json(await sandbox.provider.stat(sandbox.id, path))}


async def _move(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    source = _path(field(message, "source"), name="source")
    destination = _path(field(message, "destination"), name="destination")
    await sandbox.provider.move(sandbox.id, source, destination)
    return {"entry": entry_json(await sandbox.provider.stat(sandbox.id, destination))}


async def _list_dir(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    path = _path(field(message, "path"))
    depth = field(message, "depth") or 1
    if not isinstance(depth, int) or depth < 1:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "depth: must be at least 1")
    root = await sandbox.provider.stat(sandbox.id, path)
    if root.type != "dir":
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"path {path} is not a directory")
    entries: list[dict[str, Any]] = []

    async def walk(directory: str, left: int) -> None:
        for info in await sandbox.provider.list_dir(sandbox.id, directory):
            entries.append(entry_json(info))
            if info.type == "dir" and left > 1:
                await walk(info.path, left - 1)

    await walk(path, depth)
    return {"entries": entries}


async def _remove(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    path = _path(field(message, "path"))
    if path == "/":
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "refusing to remove /")
    with contextlib.suppress(WorkspaceFileNotFoundError):  # envd uses os.RemoveAll: a missing path is fine
        await sandbox.provider.delete(sandbox.id, path, recursive=True)
    return {}


async def _unimplemented(sandbox: _Sandbox, message: dict[str, Any], request: Request) -> dict[str, Any]:
    method = request.url.path.rsplit("/", 1)[-1]
    raise ConnectError(ConnectCode.UNIMPLEMENTED, f"{method} is not supported by Corral's envd")


_PROCESS_UNARY: dict[str, Unary] = {
    "List": _list_processes,
    "SendInput": _send_input,
    "SendSignal": _send_signal,
    "CloseStdin": _close_stdin,
    "Update": _unimplemented,
}
_FILESYSTEM_UNARY: dict[str, Unary] = {
    "Stat": _stat,
    "MakeDir": _make_dir,
    "Move": _move,
    "ListDir": _list_dir,
    "Remove": _remove,
    "CreateWatcher": _unimplemented,
    "GetWatcherEvents": _unimplemented,
    "RemoveWatcher": _unimplemented,
}


# --- files ----------------------------------------------------------------------------------------------------------


async def _gunzip(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Inflate a gzip body in pieces of at most 1 MiB: a small bomb never becomes one large allocation."""
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    piece = 1024 * 1024
    async for chunk in chunks:
        data = chunk
        while data:
            try:
                out = decompressor.decompress(data, piece)
            except zlib.error as exc:
                raise InvalidRequestError(f"the gzip body is corrupt: {exc}") from None
            if out:
                yield out
            data = decompressor.unconsumed_tail
    while tail := decompressor.flush(piece):
        yield tail
        if decompressor.eof:
            break


def _written(path: str) -> dict[str, str]:
    return {"name": posixpath.basename(path), "type": "file", "path": path}


def _file_path(raw: str | None) -> str:
    try:
        return _path(raw)
    except ConnectError as exc:
        raise _EnvdError(400, exc.message) from None


async def health(request: Request) -> Response:
    """204 while the sandbox runs; 502 "was not found" when it is paused, killed or unknown."""
    await _sandbox(request)
    return Response(status_code=204)


async def download(request: Request) -> StreamingResponse:
    """A file's bytes, streamed (``path`` relative to /workspace unless absolute; ``username`` is ignored)."""
    sandbox = await _sandbox(request, signed=True)
    path = _file_path(request.query_params.get("path"))
    chunks = await sandbox.provider.read_file(sandbox.id, path)
    return StreamingResponse(relay(chunks), media_type="application/octet-stream")


async def upload(request: Request) -> JSONResponse:
    """Write one file (octet-stream body) or several (multipart parts named by ``path`` or their file name)."""
    sandbox = await _sandbox(request, signed=True)
    if any(h.lower().startswith("x-metadata-") for h in request.headers):
        raise _EnvdError(400, "file metadata is not supported by Corral")
    content_type = request.headers.get("content-type", "application/octet-stream")
    query_path = request.query_params.get("path")
    written: list[dict[str, str]] = []
    if content_type.lower().startswith("multipart/form-data"):
        async for part in read_parts(request.stream(), boundary_of(content_type)):
            if part.name != "file":
                continue
            path = _file_path(query_path if query_path and not written else part.filename)
            await sandbox.provider.write_file(sandbox.id, path, part.body)
            written.append(_written(path))
        if not written:
            raise _EnvdError(400, "the multipart body has no part named 'file'")
        return JSONResponse(written)
    path = _file_path(query_path)
    body: AsyncIterator[bytes] = request.stream()
    if request.headers.get("content-encoding", "").lower() == "gzip":
        body = _gunzip(body)
    await sandbox.provider.write_file(sandbox.id, path, body)
    return JSONResponse([_written(path)])


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
        return _stream_error(ConnectError(ConnectCode.UNIMPLEMENTED, "WatchDir is not supported by Corral"))
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
