"""The asynchronous client: :class:`AsyncCorral` and the resources it hands out."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

import httpx

from corral.client import _api
from corral.client._errors import CorralConnectionError, transport_error
from corral.client._models import (
    AgentType,
    AuditEntry,
    BashResult,
    ExecChunk,
    ExecResult,
    FileInfo,
    GitResult,
    GlobResult,
    GrepResult,
    PoolReport,
    ProviderStatus,
    ReadResult,
    SessionInfo,
    Snapshot,
    WorkspaceInfo,
)
from corral.errors import WorkspaceFileNotFoundError

__all__ = [
    "AsyncAgentTypes",
    "AsyncCorral",
    "AsyncFiles",
    "AsyncSession",
    "AsyncSessions",
    "AsyncSnapshots",
    "AsyncTools",
    "AsyncWorkspace",
    "AsyncWorkspaces",
]

T = TypeVar("T")

DEFAULT_WAIT_S = 300.0
"""How long ``wait`` lets a session provision (clone and setup commands included)."""


class AsyncCorral:
    """An asynchronous client for a Corral server.

    ``base_url`` and ``token`` default to ``CORRAL_URL`` (else ``http://127.0.0.1:8000``) and ``CORRAL_API_TOKEN``
    (else the token file a local ``corral serve`` wrote). Errors the server reports are raised as Corral's typed
    errors (``WorkspaceNotFoundError``, ``ToolNotAllowedError``...), an unreachable server as
    ``CorralConnectionError``.

    Example::

        async with AsyncCorral() as corral:
            async with await corral.workspaces.create(provider="gvisor") as ws:
                print((await ws.exec("echo hi")).stdout)
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = _api.DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Create a client; it opens connections lazily and must be closed (or used as a context manager).

        Args:
            base_url: The server, e.g. ``http://127.0.0.1:8000``; defaults to ``CORRAL_URL``.
            token: The API token; defaults to ``CORRAL_API_TOKEN``.
            timeout_s: Seconds to wait for an answer (exec and tool calls add their own command timeout).
            transport: An httpx transport to use instead of the network (tests use ``httpx.MockTransport``).
        """
        self._base_url = _api.resolve_base_url(base_url)
        resolved = _api.resolve_token(token)
        headers = {"Authorization": f"Bearer {resolved}"} if resolved else {}
        self._http = httpx.AsyncClient(base_url=self._base_url, headers=headers, timeout=timeout_s, transport=transport)
        self._workspaces = AsyncWorkspaces(self)
        self._agent_types = AsyncAgentTypes(self)
        self._sessions = AsyncSessions(self)
        self._snapshots = AsyncSnapshots(self)

    @property
    def base_url(self) -> str:
        """The server this client talks to."""
        return self._base_url

    @property
    def workspaces(self) -> AsyncWorkspaces:
        """Create, find and list workspaces."""
        return self._workspaces

    @property
    def snapshots(self) -> AsyncSnapshots:
        """List, get and delete workspace snapshots (take them with :meth:`AsyncWorkspace.snapshot`)."""
        return self._snapshots

    @property
    def agent_types(self) -> AsyncAgentTypes:
        """Declare agent types and their workspace configuration."""
        return self._agent_types

    @property
    def sessions(self) -> AsyncSessions:
        """Start and find agent sessions."""
        return self._sessions

    async def providers(self) -> builtins.list[ProviderStatus]:
        """Every configured provider with its health, active workspaces and capabilities.

        Returns:
            One status per provider, in the server's order.
        """
        return await self._call(_api.providers())

    async def pool(self) -> PoolReport:
        """The warm pools: what each keeps, how full it is, its hits and misses.

        Returns:
            Every pool, and the misses of requests no pool matched.
        """
        return await self._call(_api.pool())

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCorral:
        """Enter: the client itself."""
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Exit: close the connections."""
        await self.aclose()

    async def _call(self, op: _api.Op[T]) -> T:
        try:
            response = await self._http.request(op.method, op.path, **op.request_kwargs())
        except httpx.TransportError as exc:
            raise transport_error(exc, self._base_url) from exc
        return op.parse(_api.check(response))


class AsyncWorkspaces:
    """``client.workspaces``: create, get and list workspaces."""

    def __init__(self, client: AsyncCorral) -> None:
        """Bind to a client (done by :class:`AsyncCorral`)."""
        self._client = client

    async def create(
        self,
        *,
        provider: str | None = None,
        container_type: str | None = None,
        resource_limits: Mapping[str, str | int | float] | None = None,
        base_image: str | None = None,
        network: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        from_snapshot: str | None = None,
    ) -> AsyncWorkspace:
        """Create a workspace; it is ready when this returns.

        Example::

            snapshot = await ws.snapshot("after-setup")
            copy = await corral.workspaces.create(from_snapshot=snapshot.id)

        Args:
            provider: ``"auto"`` (the default: Corral chooses and falls back), ``"gvisor"``, ``"docker"``,
                ``"firecracker"``, ``"e2b"``... An explicit provider never falls back.
            container_type: ``"agent_workspace"`` (default) or ``"mcp_server"``.
            resource_limits: ``{"cpu": "2", "memory": "4G", "disk": "10G"}``; missing keys use the server's defaults.
            base_image: The image to start from instead of the server's base image.
            network: ``"isolated"`` (default: no network at all) or ``"default"``.
            metadata: Free-form JSON kept with the workspace.
            from_snapshot: Restore a snapshot's id into the new workspace: its files, and its processes and memory
                when the snapshot has them. The snapshot fixes provider, container type, limits, image and
                network, so those must be left out.

        Returns:
            The new workspace; ``async with`` it to destroy it on exit.

        Raises:
            ProviderNotFoundError: No provider has that name.
            ProviderUnavailableError: The provider (or, for ``auto``, every provider) could not create it.
            InvalidRequestError: A malformed field, or a field ``from_snapshot`` fixes; the message names it.
            SnapshotNotFoundError: ``from_snapshot`` names no snapshot.
            WorkspaceStateError: The snapshot is not ready (still being taken, or failed).
        """
        op = _api.create_workspace(
            provider=provider,
            container_type=container_type,
            resource_limits=resource_limits,
            base_image=base_image,
            network=network,
            metadata=metadata,
            from_snapshot=from_snapshot,
        )
        return AsyncWorkspace(self._client, await self._client._call(op))

    async def get(self, workspace_id: str) -> AsyncWorkspace:
        """An existing workspace (destroyed ones too, with status ``destroyed``).

        Args:
            workspace_id: The workspace's id.

        Returns:
            The workspace, described as the server sees it now.

        Raises:
            WorkspaceNotFoundError: No workspace has that id.
        """
        return AsyncWorkspace(self._client, await self._client._call(_api.get_workspace(workspace_id)))

    async def list(self, *, include_warm: bool = False) -> builtins.list[AsyncWorkspace]:
        """Every workspace that is not destroyed.

        Args:
            include_warm: Also the warm-pool workspaces waiting to be claimed (their ``warm`` is true).

        Returns:
            The workspaces, oldest first.
        """
        op = _api.list_workspaces(include_warm=include_warm)
        return [AsyncWorkspace(self._client, info) for info in await self._client._call(op)]


class AsyncWorkspace:
    """One workspace: run commands, use its files, pause, stop, resume, snapshot, fork or destroy it."""

    def __init__(self, client: AsyncCorral, info: WorkspaceInfo) -> None:
        """Wrap a workspace description (done by :class:`AsyncWorkspaces`)."""
        self._client = client
        self._info = info
        self._files = AsyncFiles(client, info.id)

    def __repr__(self) -> str:
        """``<AsyncWorkspace ID status on PROVIDER>``."""
        return f"<{type(self).__name__} {self.id} {self.status} on {self._info.provider}>"

    @property
    def id(self) -> str:
        """The workspace's id."""
        return self._info.id

    @property
    def status(self) -> str:
        """The status when last fetched: ``ready``, ``paused``, ``stopped``, ``error`` or ``destroyed``."""
        return self._info.status

    @property
    def info(self) -> WorkspaceInfo:
        """Everything the server said about the workspace when last fetched."""
        return self._info

    @property
    def files(self) -> AsyncFiles:
        """Read, write and manage files under ``/workspace``."""
        return self._files

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        args: Sequence[str] = (),
        mode: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> ExecResult:
        """Run a command and wait for it; a nonzero exit is a result, not an error.

        Args:
            command: A shell command line (``"ls -la | wc -l"``, run by ``/bin/sh -c``), or an argv list
                (``["ls", "-la"]``) that runs without a shell.
            args: More arguments; shell-quoted onto a command line, or appended to an argv list.
            mode: ``"shell"`` or ``"argv"`` to override the choice made from ``command``'s type.
            cwd: Working directory (default ``/workspace``).
            env: Extra environment variables.
            timeout_s: Kill the command's process group after this many seconds (server default: 600).
            stdin: Text the command reads on its standard input, then end of file (default: none, ``/dev/null``).

        Returns:
            Exit code, stdout, stderr, duration; ``timed_out`` when the timeout killed it.

        Raises:
            WorkspaceStateError: The workspace is stopped.
            WorkspaceDestroyedError: The workspace was destroyed.
        """
        op = _api.exec_command(
            self.id, command, args=args, mode=mode, cwd=cwd, env=env, timeout_s=timeout_s, stdin=stdin
        )
        return await self._client._call(op)

    async def exec_stream(
        self,
        command: str | Sequence[str],
        *,
        args: Sequence[str] = (),
        mode: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> AsyncIterator[ExecChunk | ExecResult]:
        """Start a command and return its output as it is produced::

            async for item in await ws.exec_stream("make test"):
                if isinstance(item, ExecChunk):
                    print(item.data, end="")

        Iterate to the end, or close the iterator (``aclose()``): closing it early ends the request, and the server
        then kills the command.

        Args:
            command: As for :meth:`exec`.
            args: As for :meth:`exec`.
            mode: As for :meth:`exec`.
            cwd: As for :meth:`exec`.
            env: As for :meth:`exec`.
            timeout_s: As for :meth:`exec`; the last item then has ``timed_out`` set.
            stdin: As for :meth:`exec`.

        Returns:
            An iterator of :class:`ExecChunk` (``stdout`` or ``stderr`` text, as written), then one
            :class:`ExecResult` with the exit code and duration (its ``stdout`` and ``stderr`` are empty).

        Raises:
            WorkspaceNotFoundError: No workspace has that id (raised here, before any output).
            WorkspaceStateError: The workspace is stopped.
        """
        op = _api.exec_command(
            self.id, command, args=args, mode=mode, cwd=cwd, env=env, timeout_s=timeout_s, stdin=stdin, stream=True
        )
        http = self._client._http
        try:
            response = await http.send(http.build_request(op.method, op.path, **op.request_kwargs()), stream=True)
        except httpx.TransportError as exc:
            raise transport_error(exc, self._client._base_url) from exc
        if not response.is_success:
            try:
                await response.aread()
            finally:
                await response.aclose()
            _api.check(response)
        return self._exec_lines(response)

    async def _exec_lines(self, response: httpx.Response) -> AsyncIterator[ExecChunk | ExecResult]:
        try:
            async for line in response.aiter_lines():
                if line:
                    item = _api.exec_line(line)
                    yield item
                    if isinstance(item, ExecResult):
                        return
        except httpx.TransportError as exc:
            raise transport_error(exc, self._client._base_url) from exc
        finally:
            await response.aclose()
        raise CorralConnectionError("the streamed exec ended before the command's exit status")

    async def refresh(self) -> WorkspaceInfo:
        """Fetch the workspace's current description (also kept in :attr:`info`).

        Returns:
            The current description.
        """
        self._info = await self._client._call(_api.get_workspace(self.id))
        return self._info

    async def stop(self) -> WorkspaceInfo:
        """Stop the workspace; its disk is kept for :meth:`resume` (the whole filesystem where the provider's
        ``persistence`` capability is ``full``, else ``/workspace``). Its processes end.

        Returns:
            The description after stopping.
        """
        self._info = await self._client._call(_api.stop_workspace(self.id))
        return self._info

    async def pause(self) -> str:
        """Pause the workspace, freeing its CPU and memory, and refresh :attr:`info`.

        Where the provider can checkpoint memory, processes, memory and open files come back on :meth:`resume`
        (status ``paused``); otherwise this is a stop that keeps the whole disk (status ``stopped``). Commands in
        flight end. Pausing a paused workspace is fine.

        Returns:
            What was kept: ``"memory"`` or ``"filesystem"``.

        Raises:
            WorkspaceStateError: The workspace is stopped (resume it first) or not ready.
            WorkspaceDestroyedError: The workspace was destroyed.
        """
        self._info, kept = await self._client._call(_api.pause_workspace(self.id))
        return kept

    async def resume(self) -> WorkspaceInfo:
        """Start a stopped or paused workspace again; a paused one gets its processes and memory back.

        Returns:
            The description after resuming.
        """
        self._info = await self._client._call(_api.resume_workspace(self.id))
        return self._info

    async def snapshot(self, name: str | None = None) -> Snapshot:
        """Snapshot the running workspace: its files, and its processes and memory where the provider can.

        The workspace carries on; it is held only while the checkpoint and copy are taken. Restore the snapshot
        with ``client.workspaces.create(from_snapshot=snapshot.id)``.

        Args:
            name: A label to find it by (1-128 letters, digits, ``.``, ``_`` or ``-``); names need not be unique.

        Returns:
            The snapshot; its ``kind`` says whether memory was captured.

        Raises:
            InvalidRequestError: A bad name, or a provider that cannot take snapshots.
            WorkspaceStateError: The workspace is not ready.
            ResourceLimitError: The server's snapshot storage limit is reached.
        """
        return await self._client._call(_api.snapshot_workspace(self.id, name))

    async def fork(self, count: int = 1) -> builtins.list[AsyncWorkspace]:
        """Make ``count`` independent copies of the running workspace, each with its files and running processes.

        The source keeps running; a write in one fork is invisible to the others and to the source. All or
        nothing: when one copy fails, none is left behind.

        Args:
            count: How many forks, 1 to 16.

        Returns:
            The new workspaces, each ready; destroy them when done.

        Raises:
            InvalidRequestError: ``count`` outside 1-16, or a provider that cannot take snapshots.
            WorkspaceStateError: The workspace is not ready.
        """
        infos = await self._client._call(_api.fork_workspace(self.id, count))
        return [AsyncWorkspace(self._client, info) for info in infos]

    async def destroy(self) -> WorkspaceInfo:
        """Destroy the workspace and its volume; repeating it is fine.

        Returns:
            The description, with status ``destroyed``.
        """
        self._info = await self._client._call(_api.destroy_workspace(self.id))
        return self._info

    async def __aenter__(self) -> AsyncWorkspace:
        """Enter: the workspace itself."""
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Exit: destroy the workspace."""
        await self.destroy()


class AsyncFiles:
    """``workspace.files``: paths are relative to ``/workspace`` (absolute ones must be inside it)."""

    def __init__(self, client: AsyncCorral, workspace_id: str) -> None:
        """Bind to a workspace (done by :class:`AsyncWorkspace`)."""
        self._client = client
        self._workspace_id = workspace_id

    async def read(self, path: str) -> bytes:
        """A file's bytes.

        Args:
            path: The file.

        Returns:
            Its content.

        Raises:
            WorkspaceFileNotFoundError: There is no such file.
        """
        return await self._client._call(_api.read_file(self._workspace_id, path))

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        """A file's content decoded as text.

        Args:
            path: The file.
            encoding: How its bytes are decoded.

        Returns:
            Its content.
        """
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> int:
        """Write a file, creating its parent directories.

        Args:
            path: The file.
            data: Bytes, or text written as UTF-8.
            mode: Permission bits such as ``0o755``.

        Returns:
            The number of bytes written.
        """
        return await self._client._call(_api.write_file(self._workspace_id, path, data, mode=mode))

    async def list(self, path: str | None = None) -> builtins.list[FileInfo]:
        """A directory's entries, sorted by name.

        Args:
            path: The directory (default ``/workspace``).

        Returns:
            One entry per child.
        """
        return await self._client._call(_api.list_files(self._workspace_id, path))

    async def stat(self, path: str) -> FileInfo:
        """One path's metadata (a final symlink is not followed).

        Args:
            path: The path.

        Returns:
            Its type, size, mode and modification time.

        Raises:
            WorkspaceFileNotFoundError: There is no such path.
        """
        return await self._client._call(_api.stat_file(self._workspace_id, path))

    async def exists(self, path: str) -> bool:
        """Whether the path exists.

        Args:
            path: The path.

        Returns:
            True when :meth:`stat` finds it.
        """
        try:
            await self.stat(path)
        except WorkspaceFileNotFoundError:
            return False
        return True

    async def glob(self, pattern: str, path: str | None = None) -> builtins.list[str]:
        """Paths matching a glob; ``**`` matches any depth.

        Args:
            pattern: The glob, relative to ``path``.
            path: Where to search (default ``/workspace``).

        Returns:
            The matching paths, sorted.
        """
        return await self._client._call(_api.glob_files(self._workspace_id, pattern, path))

    async def delete(self, path: str, *, recursive: bool = False) -> None:
        """Delete a file or directory.

        Args:
            path: The path.
            recursive: Also delete a non-empty directory's content.
        """
        await self._client._call(_api.delete_file(self._workspace_id, path, recursive=recursive))

    async def move(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst``, creating ``dst``'s parents.

        Args:
            src: The path to move.
            dst: Its new path.
        """
        await self._client._call(_api.move_file(self._workspace_id, src, dst))

    async def chmod(self, path: str, mode: int | str) -> None:
        """Set permission bits.

        Args:
            path: The path.
            mode: ``0o755`` or the octal string ``"0755"``.
        """
        await self._client._call(_api.chmod_file(self._workspace_id, path, mode))

    async def upload_archive(self, path: str, archive: AsyncIterable[bytes]) -> int:
        """Extract a tar archive into a directory of the workspace, the archive streamed as it comes.

        Args:
            path: The directory; it is created, with its parents, when missing.
            archive: The archive's bytes in chunks (never held whole, on either side).

        Returns:
            The archive's size in bytes.

        Raises:
            InvalidRequestError: ``path`` is a file, or outside /workspace.
            FileOperationError: The workspace's tar refused the archive.
        """
        return await self._client._call(_api.put_archive(self._workspace_id, path, archive))

    async def download_archive(self, path: str, into: BinaryIO) -> int:
        """Write a tar archive of a file or directory of the workspace into ``into``, chunk by chunk as it comes.

        The archive is made inside the workspace: unpack it as untrusted (``tarfile`` with ``filter="data"``).

        Args:
            path: The file or directory; the archive's one top-level entry is its last component.
            into: A binary file object (a file, a pipe) written as the chunks arrive.

        Returns:
            The archive's size in bytes.

        Raises:
            WorkspaceFileNotFoundError: Nothing is at ``path``.
            CorralConnectionError: The stream broke off (the archive is then incomplete).
        """
        written = 0
        request = self._client._http.build_request(
            "GET", _api.archive_path(self._workspace_id), params={"path": path}, timeout=_api.ARCHIVE_TIMEOUT_S
        )
        try:
            response = await self._client._http.send(request, stream=True)
            try:
                if not response.is_success:
                    await response.aread()
                    _api.check(response)
                async for chunk in response.aiter_bytes():
                    into.write(chunk)
                    written += len(chunk)
            finally:
                await response.aclose()
        except httpx.TransportError as exc:
            raise transport_error(exc, self._client._base_url) from exc
        return written


class AsyncSnapshots:
    """``client.snapshots``: list, get and delete snapshots (take them with :meth:`AsyncWorkspace.snapshot`)."""

    def __init__(self, client: AsyncCorral) -> None:
        """Bind to a client (done by :class:`AsyncCorral`)."""
        self._client = client

    async def list(self, *, workspace_id: str | None = None, name: str | None = None) -> builtins.list[Snapshot]:
        """Snapshots, newest first.

        Args:
            workspace_id: Only the snapshots of this workspace.
            name: Only the snapshots with this name.

        Returns:
            The matching snapshots.
        """
        return await self._client._call(_api.list_snapshots(workspace_id, name))

    async def get(self, snapshot_id: str) -> Snapshot:
        """One snapshot.

        Args:
            snapshot_id: Its id.

        Returns:
            The snapshot as the server sees it now.

        Raises:
            SnapshotNotFoundError: No snapshot has that id.
        """
        return await self._client._call(_api.get_snapshot(snapshot_id))

    async def delete(self, snapshot_id: str) -> None:
        """Delete a snapshot and its files; workspaces restored from it keep running.

        Args:
            snapshot_id: Its id.

        Raises:
            SnapshotNotFoundError: No snapshot has that id.
        """
        await self._client._call(_api.delete_snapshot(snapshot_id))


class AsyncAgentTypes:
    """``client.agent_types``: declare agent types and their workspace configuration."""

    def __init__(self, client: AsyncCorral) -> None:
        """Bind to a client (done by :class:`AsyncCorral`)."""
        self._client = client

    async def create(self, name: str, *, workspace: Mapping[str, Any] | None = None) -> AgentType:
        """Declare an agent type.

        Args:
            name: A name for people.
            workspace: Its workspace configuration (``enabled``, ``tools``, ``repo_source``, ``setup_commands``...);
                without one, the type has no workspace (``enabled: false``).

        Returns:
            The agent type with its id and full configuration.

        Raises:
            InvalidRequestError: The configuration is invalid; the message names every problem.
        """
        return await self._client._call(_api.create_agent_type(name, workspace))

    async def get(self, agent_type_id: str) -> AgentType:
        """One agent type.

        Args:
            agent_type_id: Its id.

        Returns:
            The agent type with its full configuration.
        """
        return await self._client._call(_api.get_agent_type(agent_type_id))

    async def list(self) -> builtins.list[AgentType]:
        """Every agent type.

        Returns:
            The agent types.
        """
        return await self._client._call(_api.list_agent_types())

    async def delete(self, agent_type_id: str) -> None:
        """Delete an agent type; its ended sessions keep their records (and its name).

        Args:
            agent_type_id: Its id.

        Raises:
            AgentTypeInUseError: Sessions of the type are still provisioning or active (they are named).
            AgentTypeNotFoundError: No agent type has that id.
        """
        await self._client._call(_api.delete_agent_type(agent_type_id))

    async def config(self, agent_type_id: str) -> dict[str, Any]:
        """An agent type's workspace configuration, every field included.

        Args:
            agent_type_id: Its id.

        Returns:
            The configuration as the API spells it.
        """
        return await self._client._call(_api.get_config(agent_type_id))

    async def set_config(self, agent_type_id: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Replace an agent type's workspace configuration; sessions started afterwards use it.

        Args:
            agent_type_id: Its id.
            config: The new configuration; fields left out take their defaults.

        Returns:
            The configuration as stored, every field included.

        Raises:
            InvalidRequestError: The configuration is invalid; the message names every problem.
        """
        return await self._client._call(_api.set_config(agent_type_id, config))


class AsyncSessions:
    """``client.sessions``: start and find agent sessions."""

    def __init__(self, client: AsyncCorral) -> None:
        """Bind to a client (done by :class:`AsyncCorral`)."""
        self._client = client

    async def start(
        self,
        agent_type_id: str,
        *,
        task_context: Mapping[str, Any] | None = None,
        wait: bool = False,
        timeout_s: float = DEFAULT_WAIT_S,
    ) -> AsyncSession:
        """Start a session; its workspace is provisioned in the background.

        Args:
            agent_type_id: The agent type.
            task_context: The task's repository: ``repository_url``, ``branch``, ``pull_request_number``,
                ``base_branch``.
            wait: Return only once the session is no longer ``provisioning`` (see :meth:`AsyncSession.wait`).
            timeout_s: How long ``wait`` may take.

        Returns:
            The session; ``async with`` it to end it on exit.

        Raises:
            TimeoutError: ``wait`` and the session is still provisioning after ``timeout_s``.
        """
        session = AsyncSession(self._client, await self._client._call(_api.start_session(agent_type_id, task_context)))
        if wait:
            await session.wait(timeout_s=timeout_s)
        return session

    async def get(self, session_id: str) -> AsyncSession:
        """An existing session.

        Args:
            session_id: Its id.

        Returns:
            The session as the server sees it now.
        """
        return AsyncSession(self._client, await self._client._call(_api.get_session(session_id)))

    async def list(self, *, status: str | None = None) -> builtins.list[AsyncSession]:
        """Sessions, newest first.

        Args:
            status: Only sessions in this status (``provisioning``, ``active``, ``ended``...).

        Returns:
            The sessions as the server sees them now.
        """
        return [AsyncSession(self._client, info) for info in await self._client._call(_api.list_sessions(status))]


class AsyncSession:
    """One agent session: its status, its tools and its audit log."""

    def __init__(self, client: AsyncCorral, info: SessionInfo) -> None:
        """Wrap a session description (done by :class:`AsyncSessions`)."""
        self._client = client
        self._info = info
        self._tools = AsyncTools(client, info.id)

    def __repr__(self) -> str:
        """``<AsyncSession ID status>``."""
        return f"<{type(self).__name__} {self.id} {self.status}{' degraded' if self._info.degraded else ''}>"

    @property
    def id(self) -> str:
        """The session's id."""
        return self._info.id

    @property
    def status(self) -> str:
        """The status when last fetched: ``provisioning``, ``active`` or ``ended``."""
        return self._info.status

    @property
    def info(self) -> SessionInfo:
        """Everything the server said about the session when last fetched (warnings, degraded reason...)."""
        return self._info

    @property
    def tools(self) -> AsyncTools:
        """The agent's tools in the session's workspace, as the agent type allows them."""
        return self._tools

    async def refresh(self) -> SessionInfo:
        """Fetch the session's current description (also kept in :attr:`info`).

        Returns:
            The current description.
        """
        self._info = await self._client._call(_api.get_session(self.id))
        return self._info

    async def wait(self, *, timeout_s: float = DEFAULT_WAIT_S, poll_interval_s: float = 0.25) -> SessionInfo:
        """Poll until the session is no longer ``provisioning``.

        Args:
            timeout_s: Give up after this many seconds.
            poll_interval_s: Seconds between polls.

        Returns:
            The description once ``active`` (check ``degraded``) or ``ended``.

        Raises:
            TimeoutError: Still provisioning after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while self._info.status == "provisioning":
            if time.monotonic() >= deadline:
                raise TimeoutError(f"session {self.id} is still provisioning after {timeout_s:g} s")
            await asyncio.sleep(poll_interval_s)
            await self.refresh()
        return self._info

    async def workspace(self) -> AsyncWorkspace | None:
        """The session's workspace, or None when it has none (yet).

        Returns:
            The workspace, as the server describes it now.
        """
        workspace_id = (await self.refresh()).workspace_id
        if workspace_id is None:
            return None
        return await self._client.workspaces.get(workspace_id)

    async def audit(self) -> builtins.list[AuditEntry]:
        """Every tool call of the session so far, refused ones included.

        Returns:
            The entries, oldest first.
        """
        return await self._client._call(_api.audit(self.id))

    async def end(self) -> SessionInfo:
        """End the session and destroy its workspace.

        Returns:
            The description, with status ``ended``.
        """
        self._info = await self._client._call(_api.end_session(self.id))
        return self._info

    async def __aenter__(self) -> AsyncSession:
        """Enter: the session itself."""
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Exit: end the session."""
        await self.end()


class AsyncTools:
    """``session.tools``: the seven agent tools. Paths are relative to ``/workspace``.

    A tool outside the agent type's list raises ``ToolNotAllowedError`` (``Tool 'bash' is not enabled for this agent
    type``); every call, refused ones too, lands in the session's audit log.
    """

    def __init__(self, client: AsyncCorral, session_id: str) -> None:
        """Bind to a session (done by :class:`AsyncSession`)."""
        self._client = client
        self._session_id = session_id

    async def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Call a tool by name with its JSON arguments, as the HTTP API takes them.

        Args:
            tool: ``bash``, ``read``, ``write``, ``edit``, ``grep``, ``glob`` or ``git``.
            arguments: The tool's arguments, e.g. ``{"command": "ls"}`` for bash.

        Returns:
            The tool's JSON result.

        Raises:
            ToolNotAllowedError: The agent type does not enable the tool.
            UnknownToolError: No tool has that name.
            InvalidRequestError: Bad arguments; the message names the argument.
        """
        timeout = arguments.get("timeout_s") if arguments else None
        op = _api.call_tool(self._session_id, tool, arguments, timeout_s=float(timeout) if timeout else None)
        return await self._client._call(op)

    async def bash(self, command: str, *, timeout_s: float | None = None) -> BashResult:
        """Run a command in the session's shell; ``cd`` and ``export`` carry over to the next call.

        Args:
            command: The command line.
            timeout_s: Kill it after this many seconds (server default: 120).

        Returns:
            Exit code and output (a visible marker shows where long output was cut).
        """
        return await self._client._call(_api.bash(self._session_id, command, timeout_s))

    async def read(self, path: str, *, offset: int | None = None, limit: int | None = None) -> ReadResult:
        """Read a text file's lines.

        Args:
            path: The file.
            offset: The first line, 1-based.
            limit: How many lines.

        Returns:
            The lines, the file's line count, and whether more follow.
        """
        return await self._client._call(_api.read(self._session_id, path, offset, limit))

    async def write(self, path: str, content: str) -> int:
        """Write a text file, creating its parents.

        Args:
            path: The file.
            content: Its new content.

        Returns:
            The number of bytes written.
        """
        return await self._client._call(_api.write(self._session_id, path, content))

    async def edit(self, path: str, old_string: str, new_string: str, *, replace_all: bool = False) -> int:
        """Replace an exact string in a file.

        Args:
            path: The file.
            old_string: The text to replace; it must occur exactly once unless ``replace_all``.
            new_string: Its replacement.
            replace_all: Replace every occurrence.

        Returns:
            The number of replacements.

        Raises:
            ToolError: ``old_string`` is absent, or ambiguous without ``replace_all``; the message says which.
        """
        return await self._client._call(_api.edit(self._session_id, path, old_string, new_string, replace_all))

    async def grep(
        self, pattern: str, *, path: str | None = None, include: str | None = None, case_insensitive: bool = False
    ) -> GrepResult:
        """Search file contents with a regular expression (ripgrep).

        Args:
            pattern: The regular expression.
            path: Where to search (default ``/workspace``).
            include: A glob the file names must match, e.g. ``"*.py"``.
            case_insensitive: Ignore case.

        Returns:
            The matching lines, capped by the server.
        """
        return await self._client._call(_api.grep(self._session_id, pattern, path, include, case_insensitive))

    async def glob(self, pattern: str, *, path: str | None = None) -> GlobResult:
        """Find paths matching a glob; ``**`` matches any depth.

        Args:
            pattern: The glob.
            path: Where to search (default ``/workspace``).

        Returns:
            The matching paths, capped by the server.
        """
        return await self._client._call(_api.glob(self._session_id, pattern, path))

    async def git(self, *args: str) -> GitResult:
        """Run git in ``/workspace``: ``await tools.git("log", "--oneline", "-3")``.

        Args:
            *args: git's arguments. Options that make git run programs (``-c``, hooks, ``ext::``...) are refused.

        Returns:
            Exit code and output.
        """
        return await self._client._call(_api.git(self._session_id, args))
