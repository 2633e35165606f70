"""Every HTTP API call, described once as an :class:`Op`, for the async and the sync client alike.

An ``Op`` says which request to send and how to read the answer; ``AsyncCorral`` awaits it on an
``httpx.AsyncClient``, ``Corral`` sends it on an ``httpx.Client``. So the two clients cannot drift apart in what they
send, only in how they wait.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from corral.client._errors import CorralConnectionError, error_from_json, error_from_response
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
from corral.client._token import token_from_environment

__all__ = ["DEFAULT_TIMEOUT_S", "DEFAULT_URL", "Op", "check", "resolve_base_url", "resolve_token"]

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 300.0
"""Seconds to wait for an answer; creating a workspace may try several providers."""
_EXEC_DEFAULT_S = 600.0  # the server's exec timeout when none is given
_TOOL_DEFAULT_S = 120.0  # the server's bash and git timeout when none is given
_GRACE_S = 60.0  # a command's own timeout plus this is how long the HTTP answer may take

WORKSPACES = "/api/v1/agent/workspaces"
AGENT_TYPES = "/api/v1/agent-types"
SESSIONS = "/api/v1/agent/sessions"
SNAPSHOTS = "/api/v1/agent/snapshots"


def resolve_base_url(base_url: str | None) -> str:
    """The argument, else ``CORRAL_URL``, else ``http://127.0.0.1:8000``."""
    return (base_url or os.environ.get("CORRAL_URL") or DEFAULT_URL).rstrip("/")


def resolve_token(token: str | None) -> str | None:
    """The argument, else ``CORRAL_API_TOKEN``, else the token a local ``corral serve`` wrote.

    ``corral serve`` without ``CORRAL_API_TOKEN`` generates one into ``$CORRAL_DATA_DIR/api-token`` (``./data`` by
    default); reading it makes the client work out of the box next to ``make run``, and anywhere once
    ``CORRAL_DATA_DIR`` names that directory. With none, requests go out without a token and the server's 401 is
    raised as an :class:`~corral.errors.AuthenticationError` saying what is missing (see ``_token``).
    """
    return token or token_from_environment()


def check(response: httpx.Response) -> httpx.Response:
    """The response when it is a success; otherwise raise its typed error."""
    if response.is_success:
        return response
    raise error_from_response(response)


@dataclass(frozen=True, slots=True)
class Op(Generic[T]):
    """One request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, str] | None = None
    json: object = None
    content: bytes | Iterable[bytes] | AsyncIterable[bytes] | None = None
    """A body: bytes, or chunks streamed as they come (an archive upload)."""
    timeout_s: float | None = None

    def request_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``httpx.(Async)Client.request``."""
        kwargs: dict[str, Any] = {}
        if self.params:
            kwargs["params"] = dict(self.params)
        if self.json is not None:
            kwargs["json"] = self.json
        if self.content is not None:
            kwargs["content"] = self.content
        if self.timeout_s is not None:
            kwargs["timeout"] = self.timeout_s
        return kwargs


def _id(value: str) -> str:
    return quote(value, safe="")


def _none(_: httpx.Response) -> None:
    return None


def _json_object(response: httpx.Response) -> dict[str, Any]:
    data: dict[str, Any] = response.json()
    return data


def _given(**values: object) -> dict[str, Any]:
    """Only the arguments that were given, so the server's defaults apply to the rest."""
    return {k: v for k, v in values.items() if v is not None}


# --- server -----------------------------------------------------------------------------------------------------


def providers() -> Op[list[ProviderStatus]]:
    """``GET /api/v1/agent/workspaces/providers``."""
    return Op("GET", f"{WORKSPACES}/providers", lambda r: [ProviderStatus.from_json(p) for p in r.json()["providers"]])


def pool() -> Op[PoolReport]:
    """``GET /api/v1/agent/workspaces/pool``."""
    return Op("GET", f"{WORKSPACES}/pool", lambda r: PoolReport.from_json(r.json()))


# --- workspaces -------------------------------------------------------------------------------------------------


def _workspace(response: httpx.Response) -> WorkspaceInfo:
    return WorkspaceInfo.from_json(response.json())


def create_workspace(
    *,
    provider: str | None,
    container_type: str | None,
    resource_limits: Mapping[str, str | int | float] | None,
    base_image: str | None,
    network: str | None,
    metadata: Mapping[str, Any] | None,
    from_snapshot: str | None,
) -> Op[WorkspaceInfo]:
    """``POST /api/v1/agent/workspaces``; with ``from_snapshot``, the server refuses the fields the snapshot fixes."""
    body = _given(
        provider=provider,
        container_type=container_type,
        resource_limits=dict(resource_limits) if resource_limits is not None else None,
        base_image=base_image,
        network=network,
        metadata=dict(metadata) if metadata is not None else None,
        from_snapshot=from_snapshot,
    )
    return Op("POST", WORKSPACES, _workspace, json=body)


def list_workspaces(*, include_warm: bool = False) -> Op[list[WorkspaceInfo]]:
    """``GET /api/v1/agent/workspaces``; ``include_warm`` adds ``?include_warm=true`` (warm-pool workspaces too)."""
    return Op("GET", WORKSPACES, lambda r: [WorkspaceInfo.from_json(w) for w in r.json()["workspaces"]],
              params={"include_warm": "true"} if include_warm else None)  # fmt: skip


def get_workspace(workspace_id: str) -> Op[WorkspaceInfo]:
    """``GET /api/v1/agent/workspaces/{id}``."""
    return Op("GET", f"{WORKSPACES}/{_id(workspace_id)}", _workspace)


def destroy_workspace(workspace_id: str) -> Op[WorkspaceInfo]:
    """``DELETE /api/v1/agent/workspaces/{id}``."""
    return Op("DELETE", f"{WORKSPACES}/{_id(workspace_id)}", _workspace)


def stop_workspace(workspace_id: str) -> Op[WorkspaceInfo]:
    """``POST /api/v1/agent/workspaces/{id}/stop``."""
    return Op("POST", f"{WORKSPACES}/{_id(workspace_id)}/stop", _workspace)


def resume_workspace(workspace_id: str) -> Op[WorkspaceInfo]:
    """``POST /api/v1/agent/workspaces/{id}/resume``."""
    return Op("POST", f"{WORKSPACES}/{_id(workspace_id)}/resume", _workspace)


def _paused(response: httpx.Response) -> tuple[WorkspaceInfo, str]:
    data = response.json()
    return WorkspaceInfo.from_json(data), str(data["pause"])


def pause_workspace(workspace_id: str) -> Op[tuple[WorkspaceInfo, str]]:
    """``POST /api/v1/agent/workspaces/{id}/pause``: the workspace, and what was kept (``memory``/``filesystem``)."""
    return Op("POST", f"{WORKSPACES}/{_id(workspace_id)}/pause", _paused)


def snapshot_workspace(workspace_id: str, name: str | None) -> Op[Snapshot]:
    """``POST /api/v1/agent/workspaces/{id}/snapshots``."""
    return Op("POST", f"{WORKSPACES}/{_id(workspace_id)}/snapshots", _snapshot, json=_given(name=name))


def fork_workspace(workspace_id: str, count: int) -> Op[list[WorkspaceInfo]]:
    """``POST /api/v1/agent/workspaces/{id}/fork``."""
    return Op(
        "POST",
        f"{WORKSPACES}/{_id(workspace_id)}/fork",
        lambda r: [WorkspaceInfo.from_json(w) for w in r.json()["workspaces"]],
        json={"count": count},
    )


def exec_command(
    workspace_id: str,
    command: str | Sequence[str],
    *,
    args: Sequence[str],
    mode: str | None,
    cwd: str | None,
    env: Mapping[str, str] | None,
    timeout_s: float | None,
    stdin: str | None = None,
    stream: bool = False,
) -> Op[ExecResult]:
    """``POST /api/v1/agent/workspaces/{id}/exec``; a sequence ``command`` runs as argv, without a shell.

    With ``stream`` the answer is NDJSON, read line by line with :func:`exec_line` (``parse`` does not apply)."""
    if isinstance(command, str):
        program, rest = command, list(args)
    else:
        if not command:
            raise ValueError("command: an empty argument list")
        program, rest = command[0], [*command[1:], *args]
        mode = mode or "argv"
    body = _given(command=program, args=rest or None, mode=mode, cwd=cwd, env=dict(env) if env else None)
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if stdin is not None:
        body["stdin"] = stdin
    if stream:
        body["stream"] = True
    wait = (timeout_s if timeout_s is not None else _EXEC_DEFAULT_S) + _GRACE_S
    return Op("POST", f"{WORKSPACES}/{_id(workspace_id)}/exec", lambda r: ExecResult.from_json(r.json()), json=body,
              timeout_s=max(wait, DEFAULT_TIMEOUT_S))  # fmt: skip


def exec_line(line: str) -> ExecChunk | ExecResult:
    """One line of a streamed exec: an output chunk, or the exit as an :class:`ExecResult` (its ``stdout`` and
    ``stderr`` empty: the output came as chunks). An error line raises its typed error."""
    data = json.loads(line)
    if not isinstance(data, dict):
        raise CorralConnectionError(f"the server sent a streamed exec line that is not an object: {line[:200]!r}")
    if "stream" in data:
        return ExecChunk(stream=str(data["stream"]), data=str(data.get("data", "")))
    if "exit_code" in data:
        return ExecResult.from_json(data)
    error = data.get("error")
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        raise error_from_json(error)
    raise CorralConnectionError(f"the server sent an unknown streamed exec line: {line[:200]!r}")


def read_file(workspace_id: str, path: str) -> Op[bytes]:
    """``GET .../files?path=``: the raw bytes."""
    return Op("GET", f"{WORKSPACES}/{_id(workspace_id)}/files", lambda r: r.content, params={"path": path})


def write_file(workspace_id: str, path: str, data: bytes | str, *, mode: int | None) -> Op[int]:
    """``PUT .../files?path=``: returns the bytes written."""
    params = {"path": path}
    if mode is not None:
        params["mode"] = f"{mode:04o}"
    content = data.encode() if isinstance(data, str) else bytes(data)
    return Op("PUT", f"{WORKSPACES}/{_id(workspace_id)}/files", lambda r: int(r.json()["bytes_written"]),
              params=params, content=content)  # fmt: skip


ARCHIVE_TIMEOUT_S = 3600.0
"""Seconds an archive transfer may wait for the next bytes (extracting a large upload takes a while)."""


def archive_path(workspace_id: str) -> str:
    """``/api/v1/agent/workspaces/{id}/files/archive``: a tar of a path (GET), or one extracted into it (PUT)."""
    return f"{WORKSPACES}/{_id(workspace_id)}/files/archive"


def put_archive(workspace_id: str, path: str, archive: Iterable[bytes] | AsyncIterable[bytes]) -> Op[int]:
    """``PUT .../files/archive?path=``, the body streamed from ``archive``: returns the archive's size."""
    return Op("PUT", archive_path(workspace_id), lambda r: int(r.json()["bytes_written"]), params={"path": path},
              content=archive, timeout_s=ARCHIVE_TIMEOUT_S)  # fmt: skip


def delete_file(workspace_id: str, path: str, *, recursive: bool) -> Op[None]:
    """``DELETE .../files?path=``."""
    params = {"path": path, **({"recursive": "true"} if recursive else {})}
    return Op("DELETE", f"{WORKSPACES}/{_id(workspace_id)}/files", _none, params=params)


def stat_file(workspace_id: str, path: str) -> Op[FileInfo]:
    """``GET .../files/stat``."""
    return Op("GET", f"{WORKSPACES}/{_id(workspace_id)}/files/stat", lambda r: FileInfo.from_json(r.json()),
              params={"path": path})  # fmt: skip


def list_files(workspace_id: str, path: str | None) -> Op[list[FileInfo]]:
    """``GET .../files/list``."""
    return Op("GET", f"{WORKSPACES}/{_id(workspace_id)}/files/list",
              lambda r: [FileInfo.from_json(e) for e in r.json()["entries"]], params=_given(path=path))  # fmt: skip


def glob_files(workspace_id: str, pattern: str, path: str | None) -> Op[list[str]]:
    """``GET .../files/glob``."""
    return Op("GET", f"{WORKSPACES}/{_id(workspace_id)}/files/glob", lambda r: list(r.json()["paths"]),
              params=_given(pattern=pattern, path=path))  # fmt: skip


def move_file(workspace_id: str, src: str, dst: str) -> Op[None]:
    """``POST .../files/move``."""
    return Op("POST", f"{WORKSPACES}/{_id(workspace_id)}/files/move", _none, json={"src": src, "dst": dst})


def chmod_file(workspace_id: str, path: str, mode: int | str) -> Op[None]:
    """``POST .../files/chmod``; an int is sent as its octal spelling, so ``0o755`` means what it says."""
    spelled = f"{mode:04o}" if isinstance(mode, int) else mode
    return Op("POST", f"{WORKSPACES}/{_id(workspace_id)}/files/chmod", _none, json={"path": path, "mode": spelled})


# --- snapshots --------------------------------------------------------------------------------------------------


def _snapshot(response: httpx.Response) -> Snapshot:
    return Snapshot.from_json(response.json())


def list_snapshots(workspace_id: str | None, name: str | None) -> Op[list[Snapshot]]:
    """``GET /api/v1/agent/snapshots?workspace_id=&name=``, newest first."""
    return Op("GET", SNAPSHOTS, lambda r: [Snapshot.from_json(s) for s in r.json()["snapshots"]],
              params=_given(workspace_id=workspace_id, name=name))  # fmt: skip


def get_snapshot(snapshot_id: str) -> Op[Snapshot]:
    """``GET /api/v1/agent/snapshots/{id}``."""
    return Op("GET", f"{SNAPSHOTS}/{_id(snapshot_id)}", _snapshot)


def delete_snapshot(snapshot_id: str) -> Op[None]:
    """``DELETE /api/v1/agent/snapshots/{id}``."""
    return Op("DELETE", f"{SNAPSHOTS}/{_id(snapshot_id)}", _none)


# --- agent types ------------------------------------------------------------------------------------------------


def create_agent_type(name: str, workspace: Mapping[str, Any] | None) -> Op[AgentType]:
    """``POST /api/v1/agent-types``."""
    body = _given(name=name, workspace=dict(workspace) if workspace is not None else None)
    return Op("POST", AGENT_TYPES, lambda r: AgentType.from_json(r.json()), json=body)


def list_agent_types() -> Op[list[AgentType]]:
    """``GET /api/v1/agent-types``."""
    return Op("GET", AGENT_TYPES, lambda r: [AgentType.from_json(t) for t in r.json()["agent_types"]])


def get_agent_type(agent_type_id: str) -> Op[AgentType]:
    """``GET /api/v1/agent-types/{id}``."""
    return Op("GET", f"{AGENT_TYPES}/{_id(agent_type_id)}", lambda r: AgentType.from_json(r.json()))


def delete_agent_type(agent_type_id: str) -> Op[None]:
    """``DELETE /api/v1/agent-types/{id}``: 409 ``agent_type_in_use`` while sessions of the type are live."""
    return Op("DELETE", f"{AGENT_TYPES}/{_id(agent_type_id)}", _none)


def get_config(agent_type_id: str) -> Op[dict[str, Any]]:
    """``GET /api/v1/agent-types/{id}/workspace-config``."""
    return Op("GET", f"{AGENT_TYPES}/{_id(agent_type_id)}/workspace-config", _json_object)


def set_config(agent_type_id: str, config: Mapping[str, Any]) -> Op[dict[str, Any]]:
    """``PUT /api/v1/agent-types/{id}/workspace-config``."""
    return Op("PUT", f"{AGENT_TYPES}/{_id(agent_type_id)}/workspace-config", _json_object, json=dict(config))


# --- sessions ---------------------------------------------------------------------------------------------------


def _session(response: httpx.Response) -> SessionInfo:
    return SessionInfo.from_json(response.json())


def start_session(agent_type_id: str, task_context: Mapping[str, Any] | None) -> Op[SessionInfo]:
    """``POST /api/v1/agent/sessions``."""
    body: dict[str, Any] = {"agent_type_id": agent_type_id}
    if task_context is not None:
        body["task"] = {"context": dict(task_context)}
    return Op("POST", SESSIONS, _session, json=body)


def list_sessions(status: str | None) -> Op[list[SessionInfo]]:
    """``GET /api/v1/agent/sessions?status=``, newest first."""
    return Op("GET", SESSIONS, lambda r: [SessionInfo.from_json(s) for s in r.json()["sessions"]],
              params=_given(status=status))  # fmt: skip


def get_session(session_id: str) -> Op[SessionInfo]:
    """``GET /api/v1/agent/sessions/{id}``."""
    return Op("GET", f"{SESSIONS}/{_id(session_id)}", _session)


def end_session(session_id: str) -> Op[SessionInfo]:
    """``DELETE /api/v1/agent/sessions/{id}``."""
    return Op("DELETE", f"{SESSIONS}/{_id(session_id)}", _session)


def audit(session_id: str) -> Op[list[AuditEntry]]:
    """``GET /api/v1/agent/sessions/{id}/audit``."""
    return Op("GET", f"{SESSIONS}/{_id(session_id)}/audit",
              lambda r: [AuditEntry.from_json(e) for e in r.json()["entries"]])  # fmt: skip


# --- tools ------------------------------------------------------------------------------------------------------


def call_tool(
    session_id: str, tool: str, arguments: Mapping[str, Any] | None, *, timeout_s: float | None = None
) -> Op[dict[str, Any]]:
    """``POST /api/v1/agent/sessions/{id}/tools/{tool}`` with the tool's JSON arguments."""
    wait = (timeout_s if timeout_s is not None else _TOOL_DEFAULT_S) + _GRACE_S
    return Op("POST", f"{SESSIONS}/{_id(session_id)}/tools/{_id(tool)}", _json_object, json=dict(arguments or {}),
              timeout_s=max(wait, DEFAULT_TIMEOUT_S))  # fmt: skip


def _tool(op: Op[dict[str, Any]], parse: Callable[[Mapping[str, Any]], T]) -> Op[T]:
    return Op(op.method, op.path, lambda r: parse(r.json()), json=op.json, timeout_s=op.timeout_s)


def bash(session_id: str, command: str, timeout_s: float | None) -> Op[BashResult]:
    """The bash tool."""
    args = _given(command=command, timeout_s=timeout_s)
    return _tool(call_tool(session_id, "bash", args, timeout_s=timeout_s), BashResult.from_json)


def read(session_id: str, path: str, offset: int | None, limit: int | None) -> Op[ReadResult]:
    """The read tool."""
    return _tool(call_tool(session_id, "read", _given(path=path, offset=offset, limit=limit)), ReadResult.from_json)


def write(session_id: str, path: str, content: str) -> Op[int]:
    """The write tool; returns the bytes written."""
    return _tool(call_tool(session_id, "write", {"path": path, "content": content}), lambda d: int(d["bytes_written"]))


def edit(session_id: str, path: str, old_string: str, new_string: str, replace_all: bool) -> Op[int]:
    """The edit tool; returns the number of replacements."""
    args = {"path": path, "old_string": old_string, "new_string": new_string, "replace_all": replace_all}
    return _tool(call_tool(session_id, "edit", args), lambda d: int(d["replacements"]))


def grep(
    session_id: str, pattern: str, path: str | None, include: str | None, case_insensitive: bool
) -> Op[GrepResult]:
    """The grep tool."""
    args = _given(pattern=pattern, path=path, include=include, case_insensitive=case_insensitive or None)
    return _tool(call_tool(session_id, "grep", args), GrepResult.from_json)


def glob(session_id: str, pattern: str, path: str | None) -> Op[GlobResult]:
    """The glob tool."""
    return _tool(call_tool(session_id, "glob", _given(pattern=pattern, path=path)), GlobResult.from_json)


def git(session_id: str, args: Sequence[str]) -> Op[GitResult]:
    """The git tool."""
    return _tool(call_tool(session_id, "git", {"args": list(args)}), GitResult.from_json)
