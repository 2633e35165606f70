"""The ``e2b`` provider: workspaces as E2B sandboxes, through the official SDK's async API (``e2b.AsyncSandbox``).

Where a workspace lives (the ``managed`` deployment mode): a sandbox created from ``E2B_TEMPLATE`` (``base``
unless told otherwise; a spec naming an image other than ``CORRAL_BASE_IMAGE`` names the template instead), with
metadata ``corral.workspace.id=<id>`` and ``corral.owner=<owner>`` so it can be found again by any server process,
the spec's environment as sandbox variables, and ``allow_internet_access`` from the network mode. ``/workspace`` is
created at start (as root). CPU, memory and disk are the template's: E2B sets them per template, not per sandbox.

* ``stop`` pauses the sandbox, ``resume`` connects to it (which resumes it), ``destroy`` kills it (idempotent).
  Sandboxes live ``E2B_SANDBOX_TIMEOUT_S`` (default one hour) and are then *paused* by E2B, not killed, so their
  files survive; calls on such a sandbox raise :class:`~corral.errors.WorkspaceStateError` until it is resumed.
* Commands go through envd's ``process.Process/Start`` RPC with the argv of :meth:`ExecRequest.argv`: ``shell`` mode
  runs ``/bin/sh -c`` and ``argv`` mode runs the program directly, no shell involved. The SDK's ``commands.run``
  is not used for this because it always wraps the command in ``bash -l -c`` and decodes output as UTF-8 text;
  the RPC gives the exact bytes and the pid. The client is built with the SDK's own envd plumbing
  (``e2b.envd.client_async.create_rpc_client`` and the generated ``process`` stubs), which is why the SDK version
  is pinned to 2.x. A deadline is enforced here: when it passes the command is killed (``SIGKILL`` by pid) and
  :class:`~corral.errors.ExecTimeoutError` carries the output so far.
* Files use ``sandbox.files`` (streamed both ways, octet-stream uploads). ``chmod``, ``glob`` (``python3``),
  ``realpath`` and the ``mode`` of ``write_file`` run small commands; a non-recursive ``delete`` of a non-empty
  directory is refused here, as envd's ``Remove`` is always recursive. envd takes plain paths and follows symlinks,
  so ``beneath`` is best effort: the path's ``realpath`` is checked first (:func:`check_beneath`) and the call then
  made on that real path; a process in the sandbox that swaps a directory for a symlink right after the check wins
  the race.
* Errors are translated at this boundary: an unknown API key, an unreachable API and API failures become
  :class:`~corral.errors.ProviderUnavailableError`; rate limits and quotas (HTTP 429) and a full disk become
  :class:`~corral.errors.ResourceLimitError`. Both let auto selection fall back to the next provider.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import posixpath
import time
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import httpx
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    FileNotFoundException,
    InvalidArgumentException,
    NotEnoughSpaceException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
)
from e2b.connection_config import KEEPALIVE_PING_HEADER, KEEPALIVE_PING_INTERVAL_SEC
from e2b.envd.client_async import create_rpc_client
from e2b.envd.process import process_connect, process_pb

from corral.errors import (
    CorralError,
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.providers.base import (
    WORKSPACE_ROOT,
    ByteStream,
    Capabilities,
    ExecExit,
    ExecMode,
    ExecOutput,
    ExecRequest,
    ExecResult,
    ExecStream,
    FileInfo,
    Health,
    WorkspaceSpec,
    WorkspaceState,
    check_beneath,
    check_path,
    check_user,
    collect_exec,
    escape_error,
    lies_beneath,
)

if TYPE_CHECKING:
    from e2b import EntryInfo

    from corral.settings import Settings

__all__ = ["E2BProvider", "from_settings"]

LABEL_ID = "corral.workspace.id"
LABEL_OWNER = "corral.owner"
DEFAULT_TEMPLATE = "base"
DEFAULT_SANDBOX_TIMEOUT_S = 3600
STREAM_GRACE_S = 30.0
"""How long past a command's deadline the RPC stream may live, in case the kill by pid is lost."""
_SIGNAL_NUMBERS = {"killed": 9, "terminated": 15, "interrupt": 2, "hangup": 1, "aborted": 6, "segmentation fault": 11}

_GLOB_SCRIPT = """
import fnmatch, glob, json, os, re, stat, sys
root, pattern, limit, beneath = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
if not os.path.isdir(root):
    print(json.dumps({"error": "not_found"})); sys.exit(0)
def entries(path):
    try:
        with os.scandir(path) as it:
            return sorted((e.name, e.is_dir(follow_symlinks=False)) for e in it)
    except OSError:
        return []
def walk(path, rel, parts):  # glob's rules, but symlinks are matched and never walked into (for beneath)
    head, rest = parts[0], parts[1:]
    if head == "**":
        if rest:
            yield from walk(path, rel, rest)
        for name, is_dir in entries(path):
            if name.startswith("."):
                continue
            if not rest:
                yield rel + name
            if is_dir:
                yield from walk(os.path.join(path, name), rel + name + "/", parts)
        return
    if re.search("[*?[]", head):
        hidden = head.startswith(".")
        found = [(n, d) for n, d in entries(path) if fnmatch.fnmatchcase(n, head) and (hidden or n[:1] != ".")]
    else:
        try:
            found = [(head, stat.S_ISDIR(os.lstat(os.path.join(path, head)).st_mode))]
        except OSError:
            return
    for name, is_dir in found:
        if not rest:
            yield rel + name
        elif is_dir:
            yield from walk(os.path.join(path, name), rel + name + "/", rest)
parts = [p for p in pattern.split("/") if p not in ("", ".")]
matches = walk(root, "", parts) if beneath else glob.iglob(pattern, root_dir=root, recursive=True)
paths = []
for rel in matches:
    paths.append(os.path.normpath(os.path.join(root, rel)))
    if len(paths) > limit:
        break
print(json.dumps({"paths": sorted(paths)[:limit]}))
"""
DEFAULT_USER = "root"
"""Who a call acts as when it names no user: root, as on every other provider (E2B's own default is ``user``)."""
_PREPARE_SCRIPT = "mkdir -p /workspace && { id -u user >/dev/null 2>&1 && chown user:user /workspace || true; }"


@dataclass(slots=True)
class _Handle:
    """What this process knows about one workspace's sandbox."""

    sandbox_id: str
    sandbox: AsyncSandbox | None = None
    """Connected handle for envd calls; None until needed, and while the sandbox is paused."""
    paused: bool = False


class E2BProvider:
    """Workspaces as E2B sandboxes. Configured by an API key and a domain or API URL (see :func:`from_settings`)."""

    name = "e2b"

    def __init__(
        self,
        *,
        api_key: str | None,
        domain: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        default_image: str | None = None,
        sandbox_timeout_s: int = DEFAULT_SANDBOX_TIMEOUT_S,
        owner: str = "corral",
        request_timeout_s: float = 60.0,
        output_limit: int = 16 * 1024 * 1024,
    ) -> None:
        self.api_key = api_key
        self.template = template
        self.default_image = default_image
        self.sandbox_timeout_s = sandbox_timeout_s
        self.owner = owner
        self.output_limit = output_limit
        self._opts: dict[str, Any] = {
            "api_key": api_key,
            "domain": domain,
            "api_url": api_url,
            "sandbox_url": sandbox_url,
            "request_timeout": request_timeout_s,
        }
        self._handles: dict[str, _Handle] = {}
        self._startup_ms: float | None = None

    # --- finding sandboxes ------------------------------------------------------------------------------------------

    def _require_key(self) -> None:
        if not self.api_key:
            raise ProviderUnavailableError(self.name, "E2B_API_KEY is not set")

    async def _sandboxes(self, metadata: Mapping[str, str]) -> list[tuple[str, dict[str, str], bool]]:
        """(sandbox id, metadata, paused) of every sandbox whose metadata holds ``metadata``."""
        self._require_key()
        found: list[tuple[str, dict[str, str], bool]] = []
        try:
            paginator = AsyncSandbox.list(query=SandboxQuery(metadata=dict(metadata)), limit=100, **self._opts)
            while paginator.has_next:
                for info in await paginator.next_items():
                    found.append((info.sandbox_id, dict(info.metadata), info.state == SandboxState.PAUSED))
        except Exception as exc:
            raise self._translate(exc) from exc
        return found

    async def _find(self, workspace_id: str) -> _Handle | None:
        """The workspace's sandbox, from the cache or by its metadata."""
        handle = self._handles.get(workspace_id)
        if handle is not None:
            return handle
        matches = await self._sandboxes({LABEL_ID: workspace_id, LABEL_OWNER: self.owner})
        if not matches:
            return None
        sandbox_id, _, paused = matches[0]
        return self._handles.setdefault(workspace_id, _Handle(sandbox_id, paused=paused))

    async def _existing(self, workspace_id: str) -> _Handle:
        handle = await self._find(workspace_id)
        if handle is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        return handle

    async def _running(self, workspace_id: str) -> AsyncSandbox:
        """A connected sandbox for envd calls; a paused one raises WorkspaceStateError (it is not resumed)."""
        handle = await self._existing(workspace_id)
        if handle.sandbox is not None and not handle.paused:
            return handle.sandbox
        state = await self._sandbox_state(workspace_id, handle)
        if state is WorkspaceState.STOPPED:
            raise WorkspaceStateError(
                f"workspace {workspace_id} is stopped (its E2B sandbox is paused); resume it first",
                details={"id": workspace_id},
            )
        try:
            # Connecting to a running sandbox only fetches its envd access token (and never shortens its timeout).
            handle.sandbox = await AsyncSandbox.connect(handle.sandbox_id, **self._opts)
        except Exception as exc:
            raise self._translate(exc, workspace_id) from exc
        return handle.sandbox

    async def _sandbox_state(self, workspace_id: str, handle: _Handle) -> WorkspaceState:
        try:
            info = await AsyncSandbox.get_info(handle.sandbox_id, **self._opts)
        except (SandboxNotFoundException, NotFoundException):
            self._handles.pop(workspace_id, None)
            return WorkspaceState.MISSING
        except Exception as exc:
            raise self._translate(exc, workspace_id) from exc
        handle.paused = info.state == SandboxState.PAUSED
        if handle.paused:
            handle.sandbox = None
        return WorkspaceState.STOPPED if handle.paused else WorkspaceState.RUNNING

    async def _gone(self, workspace_id: str, exc: BaseException) -> CorralError:
        """The error for an envd call that found its sandbox not running: not found, stopped, or unreachable."""
        handle = self._handles.get(workspace_id)
        state = WorkspaceState.MISSING if handle is None else await self._sandbox_state(workspace_id, handle)
        if state is WorkspaceState.MISSING:
            return WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if state is WorkspaceState.STOPPED:
            return WorkspaceStateError(
                f"workspace {workspace_id} is stopped (its E2B sandbox is paused); resume it first",
                details={"id": workspace_id},
            )
        return ProviderUnavailableError(self.name, f"the sandbox did not answer: {exc}")

    # --- lifecycle --------------------------------------------------------------------------------------------------

    def template_for(self, spec: WorkspaceSpec) -> str:
        """The E2B template of a spec: the configured one for Corral's base image, else the image name itself."""
        if not spec.image or spec.image == self.default_image:
            return self.template
        return spec.image

    async def create(self, spec: WorkspaceSpec) -> None:
        """Create the sandbox and prepare /workspace; return when it runs commands."""
        self._require_key()
        started = time.monotonic()
        try:
            sandbox = await AsyncSandbox.create(
                template=self.template_for(spec),
                timeout=self.sandbox_timeout_s,
                metadata={LABEL_ID: spec.id, LABEL_OWNER: self.owner},
                envs=dict(spec.env),
                allow_internet_access=spec.network == "default",
                lifecycle={"on_timeout": "pause"},
                **self._opts,
            )
        except Exception as exc:
            raise self._translate(exc) from exc
        self._handles[spec.id] = _Handle(sandbox.sandbox_id, sandbox)
        try:
            result = await self._exec(sandbox, spec.id, ["/bin/sh", "-c", _PREPARE_SCRIPT], cwd="/", user="root")
        except BaseException:
            with contextlib.suppress(Exception):
                await self.destroy(spec.id)
            raise
        if result.exit_code != 0:
            with contextlib.suppress(Exception):
                await self.destroy(spec.id)
            stderr = result.stderr.decode(errors="replace").strip()
            raise ProviderUnavailableError(self.name, f"could not create /workspace in the sandbox: {stderr}")
        self._startup_ms = (time.monotonic() - started) * 1000

    async def destroy(self, workspace_id: str) -> None:
        """Kill the sandbox; a missing one is fine."""
        handle = await self._find(workspace_id)
        self._handles.pop(workspace_id, None)
        if handle is None:
            return
        try:
            await AsyncSandbox.kill(handle.sandbox_id, **self._opts)
        except (SandboxNotFoundException, NotFoundException):
            return
        except Exception as exc:
            raise self._translate(exc, workspace_id) from exc

    async def stop(self, workspace_id: str) -> None:
        """Pause the sandbox (its whole file system is kept)."""
        handle = await self._existing(workspace_id)
        try:
            await AsyncSandbox.pause(handle.sandbox_id, **self._opts)
        except Exception as exc:
            raise self._translate(exc, workspace_id) from exc
        handle.paused, handle.sandbox = True, None

    async def resume(self, workspace_id: str) -> None:
        """Resume a paused sandbox by connecting to it; a running one is left as it is."""
        handle = await self._existing(workspace_id)
        try:
            sandbox = await AsyncSandbox.connect(handle.sandbox_id, timeout=self.sandbox_timeout_s, **self._opts)
        except Exception as exc:
            raise self._translate(exc, workspace_id) from exc
        handle.sandbox, handle.paused = sandbox, False

    async def state(self, workspace_id: str) -> WorkspaceState:
        """Running, stopped (paused) or missing, as the E2B API says."""
        handle = await self._find(workspace_id)
        if handle is None:
            return WorkspaceState.MISSING
        return await self._sandbox_state(workspace_id, handle)

    async def list_workspaces(self) -> list[str]:
        """Ids of the workspaces whose sandboxes this owner created (running or paused)."""
        return sorted(
            {meta[LABEL_ID] for _, meta, _ in await self._sandboxes({LABEL_OWNER: self.owner}) if meta.get(LABEL_ID)}
        )

    # --- exec -------------------------------------------------------------------------------------------------------

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run to completion, keeping at most ``output_limit`` bytes of each stream."""
        request.validate()
        return await self._exec(await self._running(workspace_id), workspace_id, request.argv(), request=request)

    async def _exec(
        self,
        sandbox: AsyncSandbox,
        workspace_id: str,
        argv: list[str],
        *,
        request: ExecRequest | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        request = request or ExecRequest(argv[0], tuple(argv[1:]), mode=ExecMode.ARGV, cwd=cwd or WORKSPACE_ROOT)
        return await collect_exec(
            self._stream(sandbox, workspace_id, argv, request, user=user),
            output_limit=self.output_limit,
            provider=self.name,
        )

    async def exec_stream(self, workspace_id: str, request: ExecRequest) -> ExecStream:
        """Yield output as envd forwards it, then the exit; closing early kills the command."""
        request.validate()
        sandbox = await self._running(workspace_id)
        # Closing this iterator closes the RPC stream at once, whose cleanup kills the command by pid.
        async with contextlib.aclosing(self._stream(sandbox, workspace_id, request.argv(), request)) as events:
            async for event in events:
                yield event

    async def _stream(
        self,
        sandbox: AsyncSandbox,
        workspace_id: str,
        argv: list[str],
        request: ExecRequest,
        *,
        user: str | None = None,
    ) -> ExecStream:
        rpc = create_rpc_client(process_connect.ProcessClient, sandbox.envd_api_url, sandbox.connection_config)
        timeout_s = request.timeout_s
        config = process_pb.ProcessConfig(cmd=argv[0], args=argv[1:], envs=dict(request.env), cwd=request.cwd)
        # connectrpc types its server streams as iterators, but they are async generators: closing one ends the RPC.
        events = cast(
            "AsyncGenerator[process_pb.StartResponse, None]",
            rpc.start(
                process_pb.StartRequest(process=config, stdin=False),
                headers={
                    **_user_header(user or request.user or DEFAULT_USER),
                    KEEPALIVE_PING_HEADER: str(KEEPALIVE_PING_INTERVAL_SEC),
                },
                timeout_ms=None if timeout_s is None else int((timeout_s + STREAM_GRACE_S) * 1000),
            ),
        )
        started = time.monotonic()
        deadline = None if timeout_s is None else started + timeout_s
        pid: int | None = None
        finished = False
        try:
            while not finished:
                response = await self._next_response(events, deadline, timeout_s)
                payload = response.event.event.value if response.event is not None and response.event.event else None
                if isinstance(payload, process_pb.ProcessEvent.StartEvent):
                    pid = payload.pid
                elif isinstance(payload, process_pb.ProcessEvent.DataEvent) and payload.output is not None:
                    if payload.output.field in ("stdout", "stderr"):
                        yield ExecOutput(payload.output.field, bytes(payload.output.value))
                elif isinstance(payload, process_pb.ProcessEvent.EndEvent):
                    finished = True
                    yield ExecExit(_exit_code(payload.exit_code, payload.status), (time.monotonic() - started) * 1000)
        except (ExecTimeoutError, ProviderUnavailableError):
            raise
        except ConnectError as exc:
            raise await self._rpc_error(exc, workspace_id) from exc
        except Exception as exc:
            raise self._translate(exc, workspace_id) from exc
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
            if pid is not None and not finished:
                with contextlib.suppress(Exception):
                    await sandbox.commands.kill(pid, request_timeout=10)

    async def _next_response(
        self, events: AsyncIterator[process_pb.StartResponse], deadline: float | None, timeout_s: float | None
    ) -> process_pb.StartResponse:
        """The next event of a command, or ExecTimeoutError once its deadline has passed."""
        timed_out = ExecTimeoutError(f"command did not finish within {timeout_s or 0:g} s; it was killed")
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        try:
            return await asyncio.wait_for(anext(events), remaining)
        except StopAsyncIteration:
            raise ProviderUnavailableError(self.name, "the command's stream ended without an exit status") from None
        except TimeoutError:
            raise timed_out from None
        except ConnectError as exc:
            # wait_for cancels the pending read at the deadline, which connectrpc reports as CANCELED.
            if exc.code is Code.CANCELED and deadline is not None and time.monotonic() >= deadline:
                raise timed_out from None
            raise

    async def _rpc_error(self, exc: ConnectError, workspace_id: str) -> CorralError:
        if exc.code is Code.DEADLINE_EXCEEDED:
            return ExecTimeoutError(f"the command passed its deadline: {exc.message}")
        if exc.code is Code.UNAVAILABLE and "was not found" in exc.message:
            return await self._gone(workspace_id, exc)
        if exc.code in (Code.INVALID_ARGUMENT, Code.NOT_FOUND):
            return InvalidRequestError(f"e2b refused the command: {exc.message}")
        return self._translate(exc, workspace_id)

    # --- files ------------------------------------------------------------------------------------------------------

    async def _file_call(self, workspace_id: str, call: Any) -> Any:
        """Run one ``sandbox.files`` call, translating its errors."""
        try:
            return await call
        except SandboxNotRunningException as exc:
            raise await self._gone(workspace_id, exc) from exc
        except Exception as exc:
            raise self._translate(exc, workspace_id, files=True) from exc

    async def read_file(self, workspace_id: str, path: str, *, beneath: str | None = None) -> ByteStream:
        """Open for streaming; a missing file raises WorkspaceFileNotFoundError before the first chunk."""
        path = check_path(path)
        if beneath is not None:
            path = await check_beneath(self, workspace_id, path, beneath)  # best effort: the module docstring
        sandbox = await self._running(workspace_id)
        reader = await self._file_call(workspace_id, sandbox.files.read(path, format="stream", user=DEFAULT_USER))
        return self._chunks(workspace_id, reader)

    async def _chunks(self, workspace_id: str, reader: Any) -> ByteStream:
        try:
            async for chunk in reader:
                yield bytes(chunk)
        except Exception as exc:
            raise self._translate(exc, workspace_id, files=True) from exc
        finally:
            await reader.aclose()

    async def write_file(
        self,
        workspace_id: str,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        mode: int | None = None,
        beneath: str | None = None,
        owner: str | None = None,
    ) -> int:
        """Upload (octet-stream, streamed for iterables), creating parents, as ``owner`` (envd's user; the
        sandbox's default without it); then set ``mode`` if given."""
        path = check_path(path)
        check_user(owner, field_name="owner")
        if beneath is not None:
            path = await check_beneath(self, workspace_id, path, beneath)  # best effort: the module docstring
        sandbox = await self._running(workspace_id)
        written = 0

        async def counted(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
            nonlocal written
            async for chunk in chunks:
                written += len(chunk)
                yield chunk

        payload: bytes | AsyncIterator[bytes]
        if isinstance(data, bytes | bytearray | memoryview):
            payload = bytes(data)
            written = len(data)
        else:
            payload = counted(data)
        write = sandbox.files.write(path, payload, user=owner or DEFAULT_USER, use_octet_stream=True)
        await self._file_call(workspace_id, write)
        if mode is not None:
            await self.chmod(workspace_id, path, mode)
        return written

    async def list_dir(self, workspace_id: str, path: str, *, beneath: str | None = None) -> list[FileInfo]:
        """Directory entries, sorted by name."""
        path = check_path(path)
        target = path
        if beneath is not None:  # best effort: see the module docstring
            target = await check_beneath(self, workspace_id, path, beneath)  # envd lists no symlink: list its target
        sandbox = await self._running(workspace_id)
        entries = await self._file_call(workspace_id, sandbox.files.list(target, depth=1, user=DEFAULT_USER))
        infos = (_file_info(e) for e in entries)
        if target != path:
            infos = (replace(i, path=posixpath.join(path, i.name)) for i in infos)
        return sorted(infos, key=lambda info: info.name)

    async def stat(self, workspace_id: str, path: str, *, beneath: str | None = None) -> FileInfo:
        """Information about one path."""
        requested = path = check_path(path)
        if beneath is not None:
            path = await check_beneath(self, workspace_id, path, beneath, follow=False)  # best effort
        sandbox = await self._running(workspace_id)
        info = _file_info(await self._file_call(workspace_id, sandbox.files.get_info(path, user=DEFAULT_USER)))
        return info if path == requested else replace(info, path=requested)

    async def delete(
        self, workspace_id: str, path: str, *, recursive: bool = False, beneath: str | None = None
    ) -> None:
        """Remove a file or directory; a non-empty directory only with ``recursive`` (envd's Remove always recurses)."""
        path = check_path(path)
        if beneath is not None:
            path = await check_beneath(self, workspace_id, path, beneath, follow=False)  # best effort
        info = await self.stat(workspace_id, path)
        if info.type == "dir" and not recursive and await self.list_dir(workspace_id, path):
            raise FileOperationError(f"{path}: directory not empty", details={"kind": "not_empty"})
        sandbox = await self._running(workspace_id)
        await self._file_call(workspace_id, sandbox.files.remove(path, user=DEFAULT_USER))

    async def move(self, workspace_id: str, src: str, dst: str, *, beneath: str | None = None) -> None:
        """Rename, creating the destination's parents."""
        src, dst = check_path(src, field_name="src"), check_path(dst, field_name="dst")
        if beneath is not None:  # best effort: see the module docstring
            src = await check_beneath(self, workspace_id, src, beneath, follow=False)
            dst = await check_beneath(self, workspace_id, dst, beneath, follow=False)
        sandbox = await self._running(workspace_id)
        parent = posixpath.dirname(dst)
        if parent and parent != "/":
            await self._file_call(workspace_id, sandbox.files.make_dir(parent, user=DEFAULT_USER))
        await self._file_call(workspace_id, sandbox.files.rename(src, dst, user=DEFAULT_USER))

    async def chmod(self, workspace_id: str, path: str, mode: int, *, beneath: str | None = None) -> None:
        """Set permission bits (runs ``chmod``)."""
        path = check_path(path)
        if beneath is not None:
            path = await check_beneath(self, workspace_id, path, beneath)  # best effort: the module docstring
        result = await self._command(workspace_id, ["chmod", f"{mode:o}", "--", path])
        if result.exit_code != 0:
            raise _command_error(path, result)

    async def glob(
        self,
        workspace_id: str,
        pattern: str,
        *,
        root: str = WORKSPACE_ROOT,
        limit: int = 10_000,
        beneath: str | None = None,
    ) -> list[str]:
        """Matching absolute paths, sorted (runs Python's ``glob`` in the sandbox).

        With ``beneath`` (best effort: ``root`` is checked first) symlinks are matched but never walked into.
        """
        if not pattern or "\x00" in pattern:
            raise InvalidRequestError("pattern: must be a non-empty glob pattern", details={"field": "pattern"})
        root = check_path(root, field_name="root")
        if beneath is not None:
            await check_beneath(self, workspace_id, root, beneath)
        argv = ["python3", "-c", _GLOB_SCRIPT, root, pattern, str(limit), "0" if beneath is None else "1"]
        result = await self._command(workspace_id, argv)
        if result.exit_code != 0:
            raise FileOperationError(f"glob failed: {result.stderr.decode(errors='replace').strip()}")
        answer = json.loads(result.stdout)
        if answer.get("error") == "not_found":
            raise WorkspaceFileNotFoundError(f"{root}: no such directory")
        return list(answer["paths"])

    async def realpath(self, workspace_id: str, path: str, *, beneath: str | None = None) -> str:
        """The path with symlinks resolved; missing components kept (``realpath -m``)."""
        path = check_path(path)
        result = await self._command(workspace_id, ["realpath", "-m", "--", path])
        if result.exit_code != 0:
            raise _command_error(path, result)
        real = result.stdout.decode().removesuffix("\n")
        if beneath is not None:
            root = posixpath.normpath(check_path(beneath, field_name="beneath"))
            if not (lies_beneath(posixpath.normpath(path), root) and lies_beneath(real, root)):
                raise escape_error(path, root, f" (it resolves to {real})")
        return real

    async def _command(self, workspace_id: str, argv: list[str]) -> ExecResult:
        request = ExecRequest(argv[0], tuple(argv[1:]), mode=ExecMode.ARGV, cwd="/", timeout_s=60)
        return await self.exec(workspace_id, request)

    # --- health -----------------------------------------------------------------------------------------------------

    async def health(self) -> Health:
        """The E2B API answers a one-item sandbox listing with this key."""
        started = time.monotonic()
        if not self.api_key:
            return Health(False, "E2B_API_KEY is not set")
        try:
            await AsyncSandbox.list(limit=1, **self._opts).next_items()
        except Exception as exc:
            error = self._translate(exc)
            reason = error.reason if isinstance(error, ProviderUnavailableError) else error.message
            return Health(False, reason, latency_ms=(time.monotonic() - started) * 1000)
        return Health(True, latency_ms=(time.monotonic() - started) * 1000)

    async def capabilities(self) -> Capabilities:
        """A remote sandbox with pause/resume; resources are E2B's, not this host's."""
        return Capabilities(
            isolation="remote",
            persistence="full",
            snapshots="none",
            warm_pool=False,
            streaming=True,
            disk_limit="enforced",
            requirements=("E2B_API_KEY", "HTTPS access to the E2B API"),
            startup_latency_ms=self._startup_ms if self._startup_ms is not None else 1000.0,
            resources={"template": self.template},
        )

    async def aclose(self) -> None:
        """Forget cached handles; sandboxes keep running (the SDK's connection pools are process-wide)."""
        self._handles.clear()

    # --- errors -----------------------------------------------------------------------------------------------------

    def _translate(  # noqa: PLR0911 - one answer per kind of SDK error reads best as a flat list
        self, exc: BaseException, workspace_id: str | None = None, *, files: bool = False
    ) -> CorralError:
        """The Corral error for an SDK, RPC or transport error."""
        if isinstance(exc, CorralError):
            return exc
        message = str(exc) or type(exc).__name__
        if isinstance(exc, AuthenticationException):
            return ProviderUnavailableError(self.name, f"the E2B API rejected the API key: {message}")
        if isinstance(exc, RateLimitException) or getattr(exc, "status_code", None) == 429:
            return ResourceLimitError(f"e2b: rate limit or quota reached: {message}")
        if isinstance(exc, NotEnoughSpaceException):
            return ResourceLimitError(f"e2b: the sandbox disk is full: {message}")
        if files and isinstance(exc, FileNotFoundException):
            return WorkspaceFileNotFoundError(message)
        if files and isinstance(exc, InvalidArgumentException):
            return FileOperationError(message)
        if isinstance(exc, SandboxNotFoundException) and workspace_id is not None:
            self._handles.pop(workspace_id, None)
            return WorkspaceNotFoundError(f"workspace {workspace_id} does not exist", details={"id": workspace_id})
        if isinstance(exc, ConnectError):
            return ProviderUnavailableError(self.name, f"envd error {exc.code.value}: {exc.message}")
        if isinstance(exc, httpx.HTTPError | OSError):
            return ProviderUnavailableError(self.name, f"cannot reach E2B: {type(exc).__name__}: {message}")
        if isinstance(exc, SandboxException):
            return ProviderUnavailableError(self.name, message)
        return ProviderUnavailableError(self.name, f"{type(exc).__name__}: {message}")


def _user_header(user: str | None) -> dict[str, str]:
    """envd's way of naming the user a command runs as; without it, the sandbox's default user."""
    if not user:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def _exit_code(code: int, status: str) -> int:
    """envd reports a signalled command as -1 with ``signal: killed``; Corral, like a shell, as 128 + signal."""
    if code == -1 and status.startswith("signal: "):
        number = _SIGNAL_NUMBERS.get(status.removeprefix("signal: "))
        if number is not None:
            return 128 + number
    return code


def _file_info(entry: EntryInfo) -> FileInfo:
    kind: Literal["file", "dir", "symlink", "other"] = "other"
    if entry.type is not None and entry.type.value in ("file", "dir", "symlink"):
        kind = entry.type.value
    if entry.symlink_target is not None:  # envd reports a symlink with its target's type and symlink_target set
        kind = "symlink"
    return FileInfo(
        path=entry.path,
        name=entry.name,
        type=kind,
        size=entry.size,
        mode=entry.mode & 0o7777,
        mtime=entry.modified_time.timestamp(),
        symlink_target=entry.symlink_target,
        owner=entry.owner or None,
        group=entry.group or None,
    )


def _command_error(path: str, result: ExecResult) -> FileOperationError:
    stderr = result.stderr.decode(errors="replace").strip()
    if "No such file" in stderr:
        return WorkspaceFileNotFoundError(f"{path}: {stderr}")
    return FileOperationError(f"{path}: {stderr}")


def from_settings(settings: Settings) -> E2BProvider:
    """The provider from ``E2B_API_KEY`` and ``E2B_DOMAIN`` or ``E2B_API_URL`` (+ ``E2B_SANDBOX_URL``)."""
    return E2BProvider(
        api_key=settings.e2b_api_key,
        domain=getattr(settings, "e2b_domain", None),
        api_url=getattr(settings, "e2b_api_url", None),
        sandbox_url=getattr(settings, "e2b_sandbox_url", None),
        template=getattr(settings, "e2b_template", DEFAULT_TEMPLATE),
        default_image=settings.base_image,
        sandbox_timeout_s=int(getattr(settings, "e2b_sandbox_timeout_s", DEFAULT_SANDBOX_TIMEOUT_S)),
        owner=settings.owner_id(),
        output_limit=settings.exec_output_limit,
    )
