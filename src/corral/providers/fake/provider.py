""":class:`FakeProvider`: every workspace is an in-memory file system (:mod:`corral.providers.fake.fs`), and ``exec``
runs the fake shell (:mod:`corral.providers.fake.shell`) on it.

Failure injection for tests: set :attr:`FakeProvider.fail_create`, :attr:`FakeProvider.fail_snapshot`,
:attr:`FakeProvider.fail_restore`, :attr:`FakeProvider.healthy` / :attr:`FakeProvider.health_error` and
:attr:`FakeProvider.create_delay_s`; :attr:`FakeProvider.calls` records every call as ``(method, workspace_id)``
(``delete_snapshot`` records the snapshot id).

Stop keeps the whole in-memory file system (``persistence: "full"``). The fake runs no background processes (its
shell has no ``&``), so there is no memory to keep: pause is a stop that says "filesystem", and a snapshot is a
copy of the file system ("filesystem"). ``FakeProvider(retention="memory")`` makes pause and snapshots *say*
"memory" (state ``PAUSED`` after a pause) for tests of the layers above; it keeps nothing more, so the conformance
suite runs the fake with the default.
"""

from __future__ import annotations

import asyncio
import posixpath
import time
from collections.abc import AsyncGenerator, AsyncIterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from corral.errors import (
    ExecTimeoutError,
    InvalidRequestError,
    ProviderUnavailableError,
    SnapshotNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
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
    SnapshotInfo,
    WorkspaceSpec,
    WorkspaceState,
    check_path,
    escape_error,
)
from corral.providers.fake.fs import CHUNK_SIZE, FileSystem, normalize
from corral.providers.fake.shell import Exit, Killed, Shell

__all__ = ["FakeProvider"]

_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
# The users of the fake's image, as in corral/workspace:base: name -> home and shell (uid/gid are not modelled).
_USERS = {"root": ("/root", "/bin/bash"), "user": ("/home/user", "/bin/bash")}
_KILLED_EXIT_CODE = 137  # 128 + SIGKILL, what a runtime reports for a process killed by stop or destroy


def _user_env(user: str | None, *, field_name: str = "user") -> dict[str, str]:
    """What the agent sets for a command run as ``user``; an unknown user raises as the agent does."""
    if user is None:
        return {}
    if user not in _USERS:
        raise InvalidRequestError(
            f"{field_name}: user {user!r} does not exist in this workspace (no such entry in /etc/passwd)",
            details={"field": field_name},
        )
    home, shell = _USERS[user]
    return {"HOME": home, "USER": user, "LOGNAME": user, "SHELL": shell}


def _as(info: FileInfo, path: str) -> FileInfo:
    """``info`` reported under ``path``, the path as given (symlinks on the way may have led elsewhere)."""
    return replace(info, path=path, name=posixpath.basename(path) or "/")


@dataclass(slots=True)
class _Workspace:
    spec: WorkspaceSpec
    fs: FileSystem = field(default_factory=FileSystem)
    running: bool = True
    paused: bool = False
    """Stopped by a pause that said "memory" (``retention="memory"``): state is ``PAUSED`` until resumed."""
    halt: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the workspace stops, pauses or is destroyed: running commands are killed."""


@dataclass(frozen=True, slots=True)
class _Snapshot:
    image: str
    fs: FileSystem
    """A copy nobody writes to: every restore copies it again."""
    kind: Literal["memory", "filesystem"]


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
        fail_snapshot: when set, ``snapshot`` raises ``ProviderUnavailableError(name, fail_snapshot)`` before
            storing anything.
        fail_restore: when set, ``restore`` raises ``ProviderUnavailableError(name, fail_restore)`` before creating
            anything.
        calls: every call as ``(method, workspace_id)``; ``workspace_id`` is ``""`` for provider-wide calls and
            the snapshot id for ``delete_snapshot``.
        closed: whether ``aclose`` was called.
    """

    def __init__(
        self, name: str = "fake", *, isolation: str = "none", retention: Literal["memory", "filesystem"] = "filesystem"
    ) -> None:
        self.name = name
        self.isolation = isolation
        """What ``capabilities()`` reports: tests that stand a fake in for plain docker say ``container``."""
        if retention not in ("memory", "filesystem"):
            raise InvalidRequestError(
                f"retention: {retention!r} is not allowed; use 'memory' or 'filesystem'", details={"field": "retention"}
            )
        self.retention: Literal["memory", "filesystem"] = retention
        """What pause and snapshots say they keep (``capabilities().pause`` and ``.snapshots``); see the module
        docstring: "memory" changes the answers, not what is kept."""
        self.fail_create: str | None = None
        self.fail_snapshot: str | None = None
        self.fail_restore: str | None = None
        self.healthy = True
        self.health_error = "fake provider marked unhealthy"
        self.create_delay_s = 0.0
        self.exec_timeout_s: float | None = None
        self.calls: list[tuple[str, str]] = []
        self.closed = False
        self._workspaces: dict[str, _Workspace] = {}
        self._snapshots: dict[str, _Snapshot] = {}

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
        """Kill running commands and refuse exec and file calls until ``resume``; all files are kept (a paused
        workspace becomes a stopped one)."""
        self.calls.append(("stop", workspace_id))
        workspace = self._get(workspace_id)
        workspace.running = workspace.paused = False
        workspace.halt.set()

    async def resume(self, workspace_id: str) -> None:
        """Make a stopped or paused workspace usable again; a running one is left alone."""
        self.calls.append(("resume", workspace_id))
        workspace = self._get(workspace_id)
        if not workspace.running:
            workspace.running, workspace.paused = True, False
            workspace.halt = asyncio.Event()

    # -- pause and snapshots (Snapshotter) ------------------------------------------------------------------------

    async def pause(self, workspace_id: str) -> Literal["memory", "filesystem"]:
        """Stop the workspace keeping all its files, and answer :attr:`retention`; commands in flight end, as they
        do on every provider.

        With "filesystem" a pause is a stop, so pausing a stopped workspace answers "filesystem" (as runc's does);
        with "memory" the workspace is ``PAUSED``, pausing it again answers "memory" and a stopped one is refused.
        """
        self.calls.append(("pause", workspace_id))
        workspace = self._get(workspace_id)
        if self.retention == "memory" and not workspace.running:
            if workspace.paused:
                return "memory"
            raise WorkspaceStateError(
                f"workspace {workspace_id} is stopped; only a running workspace can be paused",
                details={"id": workspace_id},
            )
        workspace.running = False
        workspace.paused = self.retention == "memory"
        workspace.halt.set()
        return self.retention

    async def snapshot(self, workspace_id: str, snapshot_id: str) -> SnapshotInfo:
        """Copy the running workspace's file system under ``snapshot_id`` (or raise the injected ``fail_snapshot``);
        the workspace carries on. The size is the bytes of its files.

        Raises:
            WorkspaceStateError: the workspace is not running, or the snapshot id is taken.
        """
        self.calls.append(("snapshot", workspace_id))
        workspace = self._get(workspace_id)
        if not workspace.running:
            raise WorkspaceStateError(
                f"workspace {workspace_id} is not running; resume it before taking a snapshot",
                details={"id": workspace_id},
            )
        if snapshot_id in self._snapshots:
            raise WorkspaceStateError(f"snapshot {snapshot_id} already exists", details={"id": snapshot_id})
        if self.fail_snapshot is not None:
            raise ProviderUnavailableError(self.name, self.fail_snapshot)
        copy = workspace.fs.copy()
        self._snapshots[snapshot_id] = _Snapshot(workspace.spec.image, copy, self.retention)
        return SnapshotInfo(kind=self.retention, size_bytes=copy.size())

    async def snapshot_estimate(self, workspace_id: str) -> int:
        """Bytes a snapshot of the workspace would hold now: exactly what ``snapshot`` would report."""
        self.calls.append(("snapshot_estimate", workspace_id))
        return self._get(workspace_id).fs.size()

    async def restore(self, spec: WorkspaceSpec, snapshot_id: str) -> None:
        """Create workspace ``spec.id``, running, on a copy of the snapshot's file system and with its image.

        Raises:
            SnapshotNotFoundError: no snapshot has that id (never taken, or deleted).
            WorkspaceStateError: a workspace with ``spec.id`` exists.
            ProviderUnavailableError: the injected ``fail_restore``.
        """
        self.calls.append(("restore", spec.id))
        if self.fail_restore is not None:
            raise ProviderUnavailableError(self.name, self.fail_restore)
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None:
            raise SnapshotNotFoundError(
                f"snapshot {snapshot_id} does not exist on provider {self.name}", details={"id": snapshot_id}
            )
        self._check_free(spec.id)
        self._workspaces[spec.id] = _Workspace(replace(spec, image=snapshot.image), fs=snapshot.fs.copy())

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Forget the snapshot; a missing one is fine. Workspaces restored from it keep their own copies."""
        self.calls.append(("delete_snapshot", snapshot_id))
        self._snapshots.pop(snapshot_id, None)

    async def list_snapshots(self) -> list[str]:
        """Ids of every snapshot held, sorted."""
        self.calls.append(("list_snapshots", ""))
        return sorted(self._snapshots)

    def known_dead(self, workspace_id: str) -> bool:
        """True when the workspace is gone or stopped (the fake sees its whole runtime; see DeathWatcher)."""
        workspace = self._workspaces.get(workspace_id)
        return workspace is None or not workspace.running

    async def state(self, workspace_id: str) -> WorkspaceState:
        """Running, paused (only with ``retention="memory"``), stopped or missing."""
        self.calls.append(("state", workspace_id))
        workspace = self._workspaces.get(workspace_id)
        if workspace is None:
            return WorkspaceState.MISSING
        if workspace.running:
            return WorkspaceState.RUNNING
        return WorkspaceState.PAUSED if workspace.paused else WorkspaceState.STOPPED

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
        env = {**_BASE_ENV, **workspace.spec.env, **_user_env(request.user), **request.env}
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
        owner: str | None = None,
    ) -> int:
        """Store the content (collected from the iterable if need be) once it is complete; ``owner`` must be one of
        the image's users (ownership itself is not modelled)."""
        self.calls.append(("write_file", workspace_id))
        _user_env(owner, field_name="owner")
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
            details={"workspaces": len(self._workspaces), "snapshots": len(self._snapshots)},
        )

    async def capabilities(self) -> Capabilities:
        """No isolation; stop keeps every file; pause and snapshots keep :attr:`retention`; all instantaneous."""
        self.calls.append(("capabilities", ""))
        return Capabilities(
            isolation=self.isolation,  # type: ignore[arg-type]  # a test's choice
            persistence="full",
            snapshots=self.retention,
            pause=self.retention,
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
