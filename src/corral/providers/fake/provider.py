""":class:`FakeProvider`: every workspace is an in-memory file system (:mod:`corral.providers.fake.fs`), and ``exec``
runs the fake shell (:mod:`corral.providers.fake.shell`) on it.

Failure injection for tests: set :attr:`FakeProvider.fail_create`, :attr:`FakeProvider.healthy` /
:attr:`FakeProvider.health_error` and :attr:`FakeProvider.create_delay_s`; :attr:`FakeProvider.calls` records every
call as ``(method, workspace_id)``.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import AsyncGenerator, AsyncIterable, Sequence
from dataclasses import dataclass, field, replace

from corral.errors import ExecTimeoutError, ProviderUnavailableError, WorkspaceNotFoundError, WorkspaceStateError
from corral.providers.base import (
    WORKSPACE_ROOT,
    ByteStream,
    Capabilities,
    ExecEvent,
    ExecExit,
    ExecOutput,
    ExecRequest,
    ExecResult,
    ExecStream,
    FileInfo,
    Health,
    WorkspaceSpec,
    WorkspaceState,
    check_path,
    escape_error,
)
from corral.providers.fake.fs import CHUNK_SIZE, FileSystem, normalize
from corral.providers.fake.shell import Exit, Killed, Shell

__all__ = ["FakeProvider"]

_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
_KILLED_EXIT_CODE = 137  # 128 + SIGKILL, what a runtime reports for a process killed by stop or destroy


def _as(info: FileInfo, path: str) -> FileInfo:
    """``info`` reported under ``path``, the path as given (symlinks on the way may have led elsewhere)."""
    return replace(info, path=path, name=posixpath.basename(path) or "/")


@dataclass(slots=True)
class _Workspace:
    spec: WorkspaceSpec
    fs: FileSystem = field(default_factory=FileSystem)
    running: bool = True
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the workspace stops or is destroyed: running commands are killed."""


def _is_shell_c(argv: Sequence[str]) -> bool:
    return len(argv) >= 3 and posixpath.basename(argv[0]) == "sh" and argv[1] == "-c"


async def _chunks(data: bytes) -> ByteStream:
    view = memoryview(data)
    for start in range(0, len(data), CHUNK_SIZE):
        yield bytes(view[start : start + CHUNK_SIZE])


class FakeProvider:
    """A :class:`~corral.providers.base.WorkspaceProvider` that keeps every workspace in memory.

    Attributes:
        fail_create: when set, ``create`` raises ``ProviderUnavailableError(name, fail_create)``.
        healthy: what ``health()`` reports.
        health_error: the error ``health()`` reports while ``healthy`` is false.
        create_delay_s: how long ``create`` takes (a real ``asyncio.sleep``, so it can be cancelled).
        exec_timeout_s: the deadline ``exec`` applies when the request has none (``None``: no deadline).
        calls: every call as ``(method, workspace_id)``; ``workspace_id`` is ``""`` for provider-wide calls.
        closed: whether ``aclose`` was called.
    """

    def __init__(self, name: str = "fake", *, isolation: str = "none") -> None:
        self.name = name
        self.isolation = isolation
        """What ``capabilities()`` reports: tests that stand a fake in for plain docker say ``container``."""
        self.fail_create: str | None = None
        self.healthy = True
        self.health_error = "fake provider marked unhealthy"
        self.create_delay_s = 0.0
        self.exec_timeout_s: float | None = None
        self.calls: list[tuple[str, str]] = []
        self.closed = False
        self._workspaces: dict[str, _Workspace] = {}

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def create(self, spec: WorkspaceSpec) -> None:
        """Create the workspace (after ``create_delay_s``) or raise the injected ``fail_create`` error."""
        self.calls.append(("create", spec.id))
        if self.fail_create is not None:
            raise ProviderUnavailableError(self.name, self.fail_create)
        self._check_free(spec.id)
        if self.create_delay_s > 0:
            await asyncio.sleep(self.create_delay_s)
        self._check_free(spec.id)
        self._workspaces[spec.id] = _Workspace(spec)

    async def destroy(self, workspace_id: str) -> None:
        """Forget the workspace and kill its running commands; a missing one is fine."""
        self.calls.append(("destroy", workspace_id))
        workspace = self._workspaces.pop(workspace_id, None)
        if workspace is not None:
            workspace.halt.set()

    async def stop(self, workspace_id: str) -> None:
        """Kill running commands and refuse exec and file calls until ``resume``; all files are kept."""
        self.calls.append(("stop", workspace_id))
        workspace = self._get(workspace_id)
        workspace.running = False
        workspace.halt.set()

    async def resume(self, workspace_id: str) -> None:
        """Make a stopped workspace usable again; a running one is left alone."""
        self.calls.append(("resume", workspace_id))
        workspace = self._get(workspace_id)
        if not workspace.running:
            workspace.running = True
            workspace.halt = asyncio.Event()

    def known_dead(self, workspace_id: str) -> bool:
        """True when the workspace is gone or stopped (the fake sees its whole runtime; see DeathWatcher)."""
        workspace = self._workspaces.get(workspace_id)
        return workspace is None or not workspace.running

    async def state(self, workspace_id: str) -> WorkspaceState:
        """Running, stopped or missing."""
        self.calls.append(("state", workspace_id))
        workspace = self._workspaces.get(workspace_id)
        if workspace is None:
            return WorkspaceState.MISSING
        return WorkspaceState.RUNNING if workspace.running else WorkspaceState.STOPPED

    async def list_workspaces(self) -> list[str]:
        """Ids of all workspaces, running or stopped, sorted."""
        self.calls.append(("list_workspaces", ""))
        return sorted(self._workspaces)

    # -- exec -----------------------------------------------------------------------------------------------------

    async def exec(self, workspace_id: str, request: ExecRequest) -> ExecResult:
        """Run the command to completion with the fake interpreter."""
        self.calls.append(("exec", workspace_id))
        timeout_s = request.timeout_s if request.timeout_s is not None else self.exec_timeout_s
        stdout, stderr = bytearray(), bytearray()
        events = self._events(workspace_id, request, timeout_s)
        try:
            async for event in events:
                if isinstance(event, ExecExit):
                    return ExecResult(event.exit_code, bytes(stdout), bytes(stderr), event.duration_ms)
                (stdout if event.stream == "stdout" else stderr).extend(event.data)
        finally:
            await events.aclose()
        raise AssertionError("the fake interpreter ended without an exit event")  # pragma: no cover

    async def exec_stream(self, workspace_id: str, request: ExecRequest) -> ExecStream:
        """Yield the output of every statement as it finishes, then the exit; closing early kills the command."""
        self.calls.append(("exec_stream", workspace_id))
        events = self._events(workspace_id, request, request.timeout_s)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def _events(
        self, workspace_id: str, request: ExecRequest, timeout_s: float | None
    ) -> AsyncGenerator[ExecEvent, None]:
        """Interpret the request, applying the deadline to every step (never around a ``yield``)."""
        request.validate()
        workspace = self._running(workspace_id)
        start = time.monotonic()
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        stdout, stderr = bytearray(), bytearray()
        run = self._interpret(workspace, request)
        try:
            while True:
                step = asyncio.timeout_at(deadline)
                try:
                    async with step:
                        event = await anext(run)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    if not step.expired():
                        raise
                    raise ExecTimeoutError(
                        f"command timed out after {timeout_s:g}s",
                        stdout=bytes(stdout),
                        stderr=bytes(stderr),
                        duration_ms=(time.monotonic() - start) * 1000,
                    ) from None
                if isinstance(event, ExecOutput):
                    (stdout if event.stream == "stdout" else stderr).extend(event.data)
                yield event
        finally:
            await run.aclose()

    async def _interpret(self, workspace: _Workspace, request: ExecRequest) -> AsyncGenerator[ExecEvent, None]:
        start = time.monotonic()
        pending: list[ExecOutput] = []
        env = {**_BASE_ENV, **workspace.spec.env, **request.env}
        cwd = workspace.fs.resolve(normalize(request.cwd))
        shell = Shell(workspace.fs, env=env, cwd=cwd, halt=workspace.halt, pending=pending)
        argv = request.argv()
        try:
            if cwd not in workspace.fs.dirs:
                shell.write(2, f"chdir to cwd ({request.cwd}) failed: No such file or directory\n".encode())
                shell.status = 126
            elif _is_shell_c(argv):
                async for _ in shell.steps(argv[2]):
                    for output in pending:
                        yield output
                    pending.clear()
            else:
                shell.status = await shell.run_program(argv, not_found="{}: executable file not found in $PATH")
        except Exit as exc:  # `exit` run directly in argv mode
            shell.status = exc.code
        except Killed:
            shell.status = _KILLED_EXIT_CODE
        for output in pending:
            yield output
        yield ExecExit(exit_code=shell.status, duration_ms=(time.monotonic() - start) * 1000)

    # -- files ----------------------------------------------------------------------------------------------------

    async def read_file(self, workspace_id: str, path: str, *, beneath: str | None = None) -> ByteStream:
        """Check the path now, then return an iterator over 64 KiB chunks of a snapshot of the content."""
        self.calls.append(("read_file", workspace_id))
        fs = self._running(workspace_id).fs
        data = fs.read(fs.resolve(normalize(check_path(path)), beneath=beneath))
        return _chunks(data)

    async def write_file(
        self,
        workspace_id: str,
        path: str,
        data: bytes | AsyncIterable[bytes],
        *,
        mode: int | None = None,
        beneath: str | None = None,
    ) -> int:
        """Store the content (collected from the iterable if need be) once it is complete."""
        self.calls.append(("write_file", workspace_id))
        target = self._running(workspace_id).fs.resolve(normalize(check_path(path)), beneath=beneath)
        if isinstance(data, bytes | bytearray | memoryview):
            content = bytes(data)
        else:
            buffer = bytearray()
            async for chunk in data:
                buffer.extend(chunk)
            content = bytes(buffer)
        fs = self._running(workspace_id).fs  # it may have stopped meanwhile
        fs.write(fs.resolve(target, beneath=beneath), content, mode=mode)  # a symlink may have appeared meanwhile
        return len(content)

    async def list_dir(self, workspace_id: str, path: str, *, beneath: str | None = None) -> list[FileInfo]:
        """Entries of the directory, sorted by name, reported under the path as given."""
        self.calls.append(("list_dir", workspace_id))
        fs = self._running(workspace_id).fs
        requested = normalize(check_path(path))
        entries = fs.listdir(fs.resolve(requested, beneath=beneath))
        return [_as(e, posixpath.join(requested, e.name)) for e in entries]

    async def delete(
        self, workspace_id: str, path: str, *, recursive: bool = False, beneath: str | None = None
    ) -> None:
        """Remove a file, symlink or directory; a non-empty directory needs ``recursive``."""
        self.calls.append(("delete", workspace_id))
        fs = self._running(workspace_id).fs
        fs.delete(fs.resolve(normalize(check_path(path)), follow=False, beneath=beneath), recursive=recursive)

    async def move(self, workspace_id: str, src: str, dst: str, *, beneath: str | None = None) -> None:
        """Rename with ``rename(2)`` semantics, creating the parents of ``dst``."""
        self.calls.append(("move", workspace_id))
        fs = self._running(workspace_id).fs
        source = fs.resolve(normalize(check_path(src, field_name="src")), follow=False, beneath=beneath)
        fs.move(source, fs.resolve(normalize(check_path(dst, field_name="dst")), follow=False, beneath=beneath))

    async def chmod(self, workspace_id: str, path: str, mode: int, *, beneath: str | None = None) -> None:
        """Set the permission bits."""
        self.calls.append(("chmod", workspace_id))
        fs = self._running(workspace_id).fs
        fs.chmod(fs.resolve(normalize(check_path(path)), beneath=beneath), mode)

    async def stat(self, workspace_id: str, path: str, *, beneath: str | None = None) -> FileInfo:
        """Information about a file, directory or symlink (a final symlink is not followed)."""
        self.calls.append(("stat", workspace_id))
        fs = self._running(workspace_id).fs
        requested = normalize(check_path(path))
        return _as(fs.info(fs.resolve(requested, follow=False, beneath=beneath)), requested)

    async def glob(
        self,
        workspace_id: str,
        pattern: str,
        *,
        root: str = WORKSPACE_ROOT,
        limit: int = 10_000,
        beneath: str | None = None,
    ) -> list[str]:
        """Files, directories and symlinks under ``root`` matching ``pattern``, sorted, at most ``limit``.

        Symlinks are matched but never walked into.
        """
        self.calls.append(("glob", workspace_id))
        check_path(pattern, field_name="pattern")
        if beneath is not None and (pattern.startswith("/") or ".." in pattern.split("/")):
            raise escape_error(pattern, normalize(beneath), " (a glob pattern must be relative and must not hold '..')")
        fs = self._running(workspace_id).fs
        requested = normalize(check_path(root, field_name="root"))
        real = fs.resolve(requested, beneath=beneath)
        found = fs.glob(pattern, real, limit)
        return [requested + p[len(real) :] if real != "/" else requested.rstrip("/") + p for p in found]

    async def realpath(self, workspace_id: str, path: str, *, beneath: str | None = None) -> str:
        """The normalised absolute path with its symlinks resolved (missing components are kept)."""
        self.calls.append(("realpath", workspace_id))
        return self._running(workspace_id).fs.resolve(normalize(check_path(path)), beneath=beneath)

    # -- provider -------------------------------------------------------------------------------------------------

    async def health(self) -> Health:
        """Report ``healthy`` and ``health_error``."""
        self.calls.append(("health", ""))
        return Health(
            healthy=self.healthy,
            error=None if self.healthy else self.health_error,
            details={"workspaces": len(self._workspaces)},
        )

    async def capabilities(self) -> Capabilities:
        """No isolation, everything else in memory and instantaneous."""
        self.calls.append(("capabilities", ""))
        return Capabilities(
            isolation=self.isolation,  # type: ignore[arg-type]  # a test's choice
            persistence=True,
            snapshots=False,
            warm_pool=True,
            streaming=True,
            disk_limit="none",
            requirements=(),
            startup_latency_ms=1.0,
            resources={
                "cpu_count": 4,
                "memory_bytes": 16 * 1024**3,
                "disk_free_bytes": 100 * 1024**3,
                "workspaces": len(self._workspaces),
            },
        )

    async def aclose(self) -> None:
        """Mark the provider closed; workspaces are kept, as the contract says."""
        self.calls.append(("aclose", ""))
        self.closed = True

    # -- helpers --------------------------------------------------------------------------------------------------

    def _check_free(self, workspace_id: str) -> None:
        if workspace_id in self._workspaces:
            raise WorkspaceStateError(f"workspace {workspace_id} already exists", details={"id": workspace_id})

    def _get(self, workspace_id: str) -> _Workspace:
        workspace = self._workspaces.get(workspace_id)
        if workspace is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id} not found", details={"id": workspace_id})
        return workspace

    def _running(self, workspace_id: str) -> _Workspace:
        workspace = self._get(workspace_id)
        if not workspace.running:
            raise WorkspaceStateError(f"workspace {workspace_id} is stopped", details={"id": workspace_id})
        return workspace
