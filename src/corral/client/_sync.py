"""The synchronous twin of :mod:`corral.client._async`: the same classes and methods, without ``await``.

Each class mirrors its ``Async`` namesake method for method (a unit test compares every signature), and sends the
same :class:`~corral.client._api.Op` descriptions over an ``httpx.Client``. Docstrings are taken from the async
twin, so the two are documented once.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

import httpx

from corral.client import _api
from corral.client._async import (
    DEFAULT_WAIT_S,
    AsyncAgentTypes,
    AsyncCorral,
    AsyncFiles,
    AsyncSession,
    AsyncSessions,
    AsyncSnapshots,
    AsyncTools,
    AsyncWorkspace,
    AsyncWorkspaces,
)
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

__all__ = ["AgentTypes", "Corral", "Files", "Session", "Sessions", "Snapshots", "Tools", "Workspace", "Workspaces"]

T = TypeVar("T")
C = TypeVar("C", bound=type)

ASYNC_NAMES = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}
"""Sync method name -> its async twin's name, where they differ."""


def twin_of(source: type) -> Callable[[C], C]:
    """Give the decorated class's members without a docstring the docstring of their async twin."""

    def apply(cls: C) -> C:
        for name, member in vars(cls).items():
            twin = vars(source).get(ASYNC_NAMES.get(name, name))
            if twin is None:
                continue
            if isinstance(member, property) and member.fget is not None and member.fget.__doc__ is None:
                member.fget.__doc__ = twin.fget.__doc__
                member.__doc__ = twin.__doc__
            elif callable(member) and member.__doc__ is None:
                member.__doc__ = twin.__doc__
        return cls

    return apply


@twin_of(AsyncCorral)
class Corral:
    """A synchronous client for a Corral server; see :class:`AsyncCorral` for the details.

    Example::

        with Corral() as corral, corral.workspaces.create(provider="gvisor") as ws:
            print(ws.exec("echo hi").stdout)
    """

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = _api.DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._base_url = _api.resolve_base_url(base_url)
        resolved = _api.resolve_token(token)
        headers = {"Authorization": f"Bearer {resolved}"} if resolved else {}
        self._http = httpx.Client(base_url=self._base_url, headers=headers, timeout=timeout_s, transport=transport)
        self._workspaces = Workspaces(self)
        self._agent_types = AgentTypes(self)
        self._sessions = Sessions(self)
        self._snapshots = Snapshots(self)

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def workspaces(self) -> Workspaces:
        return self._workspaces

    @property
    def snapshots(self) -> Snapshots:
        return self._snapshots

    @property
    def agent_types(self) -> AgentTypes:
        return self._agent_types

    @property
    def sessions(self) -> Sessions:
        return self._sessions

    def providers(self) -> builtins.list[ProviderStatus]:
        return self._call(_api.providers())

    def pool(self) -> PoolReport:
        return self._call(_api.pool())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Corral:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, op: _api.Op[T]) -> T:
        try:
            response = self._http.request(op.method, op.path, **op.request_kwargs())
        except httpx.TransportError as exc:
            raise transport_error(exc, self._base_url) from exc
        return op.parse(_api.check(response))


@twin_of(AsyncWorkspaces)
class Workspaces:
    """``client.workspaces``: create, get and list workspaces."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def create(
        self,
        *,
        provider: str | None = None,
        container_type: str | None = None,
        resource_limits: Mapping[str, str | int | float] | None = None,
        base_image: str | None = None,
        network: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        from_snapshot: str | None = None,
    ) -> Workspace:
        op = _api.create_workspace(
            provider=provider,
            container_type=container_type,
            resource_limits=resource_limits,
            base_image=base_image,
            network=network,
            metadata=metadata,
            from_snapshot=from_snapshot,
        )
        return Workspace(self._client, self._client._call(op))

    def get(self, workspace_id: str) -> Workspace:
        return Workspace(self._client, self._client._call(_api.get_workspace(workspace_id)))

    def list(self, *, include_warm: bool = False) -> builtins.list[Workspace]:
        op = _api.list_workspaces(include_warm=include_warm)
        return [Workspace(self._client, info) for info in self._client._call(op)]


@twin_of(AsyncWorkspace)
class Workspace:
    """One workspace: run commands, use its files, pause, stop, resume, snapshot, fork or destroy it."""

    def __init__(self, client: Corral, info: WorkspaceInfo) -> None:
        self._client = client
        self._info = info
        self._files = Files(client, info.id)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.status} on {self._info.provider}>"

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def status(self) -> str:
        return self._info.status

    @property
    def info(self) -> WorkspaceInfo:
        return self._info

    @property
    def files(self) -> Files:
        return self._files

    def exec(
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
        op = _api.exec_command(
            self.id, command, args=args, mode=mode, cwd=cwd, env=env, timeout_s=timeout_s, stdin=stdin
        )
        return self._client._call(op)

    def exec_stream(
        self,
        command: str | Sequence[str],
        *,
        args: Sequence[str] = (),
        mode: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> Iterator[ExecChunk | ExecResult]:
        op = _api.exec_command(
            self.id, command, args=args, mode=mode, cwd=cwd, env=env, timeout_s=timeout_s, stdin=stdin, stream=True
        )
        http = self._client._http
        try:
            response = http.send(http.build_request(op.method, op.path, **op.request_kwargs()), stream=True)
        except httpx.TransportError as exc:
            raise transport_error(exc, self._client._base_url) from exc
        if not response.is_success:
            try:
                response.read()
            finally:
                response.close()
            _api.check(response)
        return self._exec_lines(response)

    def _exec_lines(self, response: httpx.Response) -> Iterator[ExecChunk | ExecResult]:
        try:
            for line in response.iter_lines():
                if line:
                    item = _api.exec_line(line)
                    yield item
                    if isinstance(item, ExecResult):
                        return
        except httpx.TransportError as exc:
            raise transport_error(exc, self._client._base_url) from exc
        finally:
            response.close()
        raise CorralConnectionError("the streamed exec ended before the command's exit status")

    def refresh(self) -> WorkspaceInfo:
        self._info = self._client._call(_api.get_workspace(self.id))
        return self._info

    def stop(self) -> WorkspaceInfo:
        self._info = self._client._call(_api.stop_workspace(self.id))
        return self._info

    def pause(self) -> str:
        self._info, kept = self._client._call(_api.pause_workspace(self.id))
        return kept

    def resume(self) -> WorkspaceInfo:
        self._info = self._client._call(_api.resume_workspace(self.id))
        return self._info

    def snapshot(self, name: str | None = None) -> Snapshot:
        return self._client._call(_api.snapshot_workspace(self.id, name))

    def fork(self, count: int = 1) -> builtins.list[Workspace]:
        return [Workspace(self._client, info) for info in self._client._call(_api.fork_workspace(self.id, count))]

    def destroy(self) -> WorkspaceInfo:
        self._info = self._client._call(_api.destroy_workspace(self.id))
        return self._info

    def __enter__(self) -> Workspace:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.destroy()


@twin_of(AsyncFiles)
class Files:
    """``workspace.files``: paths are relative to ``/workspace`` (absolute ones must be inside it)."""

    def __init__(self, client: Corral, workspace_id: str) -> None:
        self._client = client
        self._workspace_id = workspace_id

    def read(self, path: str) -> bytes:
        return self._client._call(_api.read_file(self._workspace_id, path))

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: bytes | str, *, mode: int | None = None) -> int:
        return self._client._call(_api.write_file(self._workspace_id, path, data, mode=mode))

    def list(self, path: str | None = None) -> builtins.list[FileInfo]:
        return self._client._call(_api.list_files(self._workspace_id, path))

    def stat(self, path: str) -> FileInfo:
        return self._client._call(_api.stat_file(self._workspace_id, path))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except WorkspaceFileNotFoundError:
            return False
        return True

    def glob(self, pattern: str, path: str | None = None) -> builtins.list[str]:
        return self._client._call(_api.glob_files(self._workspace_id, pattern, path))

    def delete(self, path: str, *, recursive: bool = False) -> None:
        self._client._call(_api.delete_file(self._workspace_id, path, recursive=recursive))

    def move(self, src: str, dst: str) -> None:
        self._client._call(_api.move_file(self._workspace_id, src, dst))

    def chmod(self, path: str, mode: int | str) -> None:
        self._client._call(_api.chmod_file(self._workspace_id, path, mode))

    def upload_archive(self, path: str, archive: Iterable[bytes]) -> int:
        return self._client._call(_api.put_archive(self._workspace_id, path, archive))

    def download_archive(self, path: str, into: BinaryIO) -> int:
        written = 0
        request = self._client._http.build_request(
            "GET", _api.archive_path(self._workspace_id), params={"path": path}, timeout=_api.ARCHIVE_TIMEOUT_S
        )
        try:
            response = self._client._http.send(request, stream=True)
            try:
                if not response.is_success:
                    response.read()
                    _api.check(response)
                for chunk in response.iter_bytes():
                    into.write(chunk)
                    written += len(chunk)
            finally:
                response.close()
        except httpx.TransportError as exc:
            raise transport_error(exc, self._client._base_url) from exc
        return written


@twin_of(AsyncSnapshots)
class Snapshots:
    """``client.snapshots``: list, get and delete snapshots (take them with :meth:`Workspace.snapshot`)."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def list(self, *, workspace_id: str | None = None, name: str | None = None) -> builtins.list[Snapshot]:
        return self._client._call(_api.list_snapshots(workspace_id, name))

    def get(self, snapshot_id: str) -> Snapshot:
        return self._client._call(_api.get_snapshot(snapshot_id))

    def delete(self, snapshot_id: str) -> None:
        self._client._call(_api.delete_snapshot(snapshot_id))


@twin_of(AsyncAgentTypes)
class AgentTypes:
    """``client.agent_types``: declare agent types and their workspace configuration."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def create(self, name: str, *, workspace: Mapping[str, Any] | None = None) -> AgentType:
        return self._client._call(_api.create_agent_type(name, workspace))

    def get(self, agent_type_id: str) -> AgentType:
        return self._client._call(_api.get_agent_type(agent_type_id))

    def list(self) -> builtins.list[AgentType]:
        return self._client._call(_api.list_agent_types())

    def delete(self, agent_type_id: str) -> None:
        self._client._call(_api.delete_agent_type(agent_type_id))

    def config(self, agent_type_id: str) -> dict[str, Any]:
        return self._client._call(_api.get_config(agent_type_id))

    def set_config(self, agent_type_id: str, config: Mapping[str, Any]) -> dict[str, Any]:
        return self._client._call(_api.set_config(agent_type_id, config))


@twin_of(AsyncSessions)
class Sessions:
    """``client.sessions``: start and find agent sessions."""

    def __init__(self, client: Corral) -> None:
        self._client = client

    def start(
        self,
        agent_type_id: str,
        *,
        task_context: Mapping[str, Any] | None = None,
        wait: bool = False,
        timeout_s: float = DEFAULT_WAIT_S,
    ) -> Session:
        session = Session(self._client, self._client._call(_api.start_session(agent_type_id, task_context)))
        if wait:
            session.wait(timeout_s=timeout_s)
        return session

    def get(self, session_id: str) -> Session:
        return Session(self._client, self._client._call(_api.get_session(session_id)))

    def list(self, *, status: str | None = None) -> builtins.list[Session]:
        return [Session(self._client, info) for info in self._client._call(_api.list_sessions(status))]


@twin_of(AsyncSession)
class Session:
    """One agent session: its status, its tools and its audit log."""

    def __init__(self, client: Corral, info: SessionInfo) -> None:
        self._client = client
        self._info = info
        self._tools = Tools(client, info.id)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} {self.status}{' degraded' if self._info.degraded else ''}>"

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def status(self) -> str:
        return self._info.status

    @property
    def info(self) -> SessionInfo:
        return self._info

    @property
    def tools(self) -> Tools:
        return self._tools

    def refresh(self) -> SessionInfo:
        self._info = self._client._call(_api.get_session(self.id))
        return self._info

    def wait(self, *, timeout_s: float = DEFAULT_WAIT_S, poll_interval_s: float = 0.25) -> SessionInfo:
        deadline = time.monotonic() + timeout_s
        while self._info.status == "provisioning":
            if time.monotonic() >= deadline:
                raise TimeoutError(f"session {self.id} is still provisioning after {timeout_s:g} s")
            time.sleep(poll_interval_s)
            self.refresh()
        return self._info

    def workspace(self) -> Workspace | None:
        workspace_id = self.refresh().workspace_id
        if workspace_id is None:
            return None
        return self._client.workspaces.get(workspace_id)

    def audit(self) -> builtins.list[AuditEntry]:
        return self._client._call(_api.audit(self.id))

    def end(self) -> SessionInfo:
        self._info = self._client._call(_api.end_session(self.id))
        return self._info

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()


@twin_of(AsyncTools)
class Tools:
    """``session.tools``: the seven agent tools. Paths are relative to ``/workspace``.

    A tool outside the agent type's list raises ``ToolNotAllowedError`` (``Tool 'bash' is not enabled for this agent
    type``); every call, refused ones too, lands in the session's audit log.
    """

    def __init__(self, client: Corral, session_id: str) -> None:
        self._client = client
        self._session_id = session_id

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
        timeout = arguments.get("timeout_s") if arguments else None
        op = _api.call_tool(self._session_id, tool, arguments, timeout_s=float(timeout) if timeout else None)
        return self._client._call(op)

    def bash(self, command: str, *, timeout_s: float | None = None) -> BashResult:
        return self._client._call(_api.bash(self._session_id, command, timeout_s))

    def read(self, path: str, *, offset: int | None = None, limit: int | None = None) -> ReadResult:
        return self._client._call(_api.read(self._session_id, path, offset, limit))

    def write(self, path: str, content: str) -> int:
        return self._client._call(_api.write(self._session_id, path, content))

    def edit(self, path: str, old_string: str, new_string: str, *, replace_all: bool = False) -> int:
        return self._client._call(_api.edit(self._session_id, path, old_string, new_string, replace_all))

    def grep(
        self, pattern: str, *, path: str | None = None, include: str | None = None, case_insensitive: bool = False
    ) -> GrepResult:
        return self._client._call(_api.grep(self._session_id, pattern, path, include, case_insensitive))

    def glob(self, pattern: str, *, path: str | None = None) -> GlobResult:
        return self._client._call(_api.glob(self._session_id, pattern, path))

    def git(self, *args: str) -> GitResult:
        return self._client._call(_api.git(self._session_id, args))
