"""What the API answers, as frozen values (the JSON shapes of the HTTP API v1; the README's "HTTP API").

Each value keeps the JSON it came from in ``raw`` (left out of ``repr`` and equality), so fields a newer server adds
are reachable before this client learns their names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = [
    "AgentType",
    "AuditEntry",
    "BashResult",
    "ExecChunk",
    "ExecResult",
    "FileInfo",
    "GitResult",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "PoolReport",
    "PoolStatus",
    "ProviderAttempt",
    "ProviderStatus",
    "ReadResult",
    "SessionInfo",
    "Snapshot",
    "WorkspaceInfo",
]

Json = Mapping[str, Any]


def _time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class ProviderAttempt:
    """One provider tried while creating a workspace, and why it failed."""

    provider: str
    error: str


@dataclass(frozen=True, slots=True)
class WorkspaceInfo:
    """A workspace as the server last described it."""

    id: str
    status: str
    """``creating``, ``ready``, ``paused``, ``stopped``, ``error`` or ``destroyed``."""
    provider: str | None
    """The provider actually used (None while creating)."""
    requested_provider: str
    container_type: str
    resource_limits: Mapping[str, str]
    network: str
    base_image: str
    metadata: Mapping[str, Any]
    warnings: tuple[str, ...]
    from_warm_pool: bool
    provider_attempts: tuple[ProviderAttempt, ...]
    error: str | None
    created_at: datetime | None
    raw: Json = field(default_factory=dict, repr=False, compare=False)
    warm: bool = False
    """Waiting unclaimed in a warm pool (listed only with ``include_warm``)."""
    idle_timeout_s: float | None = None
    """Seconds without an exec or file call after which the server stops it (None: no idle timeout)."""
    expires_at: datetime | None = None
    """When that idle timeout strikes unless the workspace is used (None unless it is ready)."""

    @classmethod
    def from_json(cls, data: Json) -> WorkspaceInfo:
        """Parse the workspace JSON."""
        return cls(
            id=str(data["id"]),
            status=str(data.get("status", "")),
            provider=data.get("provider"),
            requested_provider=str(data.get("requested_provider", "auto")),
            container_type=str(data.get("container_type", "")),
            resource_limits=dict(data.get("resource_limits") or {}),
            network=str(data.get("network", "")),
            base_image=str(data.get("base_image", "")),
            metadata=dict(data.get("metadata") or {}),
            warnings=tuple(data.get("warnings") or ()),
            from_warm_pool=bool(data.get("from_warm_pool", False)),
            provider_attempts=tuple(
                ProviderAttempt(str(a.get("provider")), str(a.get("error")))
                for a in data.get("provider_attempts") or ()
            ),
            error=data.get("error"),
            created_at=_time(data.get("created_at")),
            raw=dict(data),
            warm=bool(data.get("warm", False)),
            idle_timeout_s=data.get("idle_timeout_s"),
            expires_at=_time(data.get("expires_at")),
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A snapshot of a workspace: its files, and its processes and memory when ``kind`` is ``memory``."""

    id: str
    name: str | None
    workspace_id: str
    """The workspace it was taken from (which may since have been destroyed)."""
    provider: str
    """The provider that holds it; workspaces restored from it run there."""
    kind: str
    """``memory`` (a restore brings back processes and memory) or ``filesystem`` (files only)."""
    status: str
    """``creating``, ``ready`` or ``error`` (``error`` says why)."""
    size_bytes: int
    base_image: str
    container_type: str
    network: str
    resource_limits: Mapping[str, str]
    metadata: Mapping[str, Any]
    error: str | None
    created_at: datetime | None
    raw: Json = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Json) -> Snapshot:
        """Parse the snapshot JSON."""
        return cls(
            id=str(data["id"]),
            name=data.get("name"),
            workspace_id=str(data.get("workspace_id", "")),
            provider=str(data.get("provider", "")),
            kind=str(data.get("kind", "")),
            status=str(data.get("status", "")),
            size_bytes=int(data.get("size_bytes") or 0),
            base_image=str(data.get("base_image", "")),
            container_type=str(data.get("container_type", "")),
            network=str(data.get("network", "")),
            resource_limits=dict(data.get("resource_limits") or {}),
            metadata=dict(data.get("metadata") or {}),
            error=data.get("error"),
            created_at=_time(data.get("created_at")),
            raw=dict(data),
        )


@dataclass(frozen=True, slots=True)
class ExecResult:
    """The outcome of a command; a nonzero ``exit_code`` is a result, not an error."""

    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool
    """The command ran past its timeout and was killed (``exit_code`` is then 137)."""
    truncated: bool
    """Output past the server's limit was dropped."""

    @property
    def ok(self) -> bool:
        """Exit code 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, data: Json) -> ExecResult:
        """Parse an exec answer."""
        return cls(
            exit_code=int(data["exit_code"]),
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            duration_ms=float(data.get("duration_ms", 0.0)),
            timed_out=bool(data.get("timed_out", False)),
            truncated=bool(data.get("truncated", False)),
        )


@dataclass(frozen=True, slots=True)
class ExecChunk:
    """A piece of a streamed command's output, as the command wrote it (see ``Workspace.exec_stream``)."""

    stream: str
    """``stdout`` or ``stderr``."""
    data: str
    """The text (UTF-8; bytes that are not become U+FFFD)."""


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One path's metadata inside a workspace."""

    path: str
    name: str
    type: str
    """``file``, ``directory``, ``symlink`` or ``other``."""
    size: int
    mode: int
    """Permission bits, e.g. ``0o644``."""
    mtime: float
    symlink_target: str | None = None

    @classmethod
    def from_json(cls, data: Json) -> FileInfo:
        """Parse the API's file JSON (``mode`` comes as an octal string)."""
        mode = data.get("mode", 0)
        return cls(
            path=str(data["path"]),
            name=str(data.get("name", "")),
            type=str(data.get("type", "")),
            size=int(data.get("size", 0)),
            mode=int(mode, 8) if isinstance(mode, str) else int(mode),
            mtime=float(data.get("mtime", 0.0)),
            symlink_target=data.get("symlink_target"),
        )


@dataclass(frozen=True, slots=True)
class ProviderStatus:
    """One provider's cached health, load and capabilities."""

    name: str
    status: str
    """``healthy`` or ``unhealthy``."""
    last_check: datetime | None
    active_workspaces: int
    available_resources: Mapping[str, Any]
    capabilities: Mapping[str, Any]
    error: str | None
    raw: Json = field(default_factory=dict, repr=False, compare=False)

    @property
    def healthy(self) -> bool:
        """Whether the last health check passed."""
        return self.status == "healthy"

    @classmethod
    def from_json(cls, data: Json) -> ProviderStatus:
        """Parse one entry of ``GET .../providers``."""
        return cls(
            name=str(data["name"]),
            status=str(data.get("status", "")),
            last_check=_time(data.get("last_check")),
            active_workspaces=int(data.get("active_workspaces") or 0),
            available_resources=dict(data.get("available_resources") or {}),
            capabilities=dict(data.get("capabilities") or {}),
            error=data.get("error"),
            raw=dict(data),
        )


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One warm pool: what it keeps, how full it is, and how requests fared."""

    key: str
    provider: str
    image: str
    target: int
    size: int
    creating: int
    hits: int
    misses: int
    miss_reasons: Mapping[str, int]
    last_error: str | None
    base_size: int = 0
    """Its configured size; ``target`` is larger while a burst has grown it."""
    max_size: int = 0
    """The most a burst may grow it to."""
    raw: Json = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Json) -> PoolStatus:
        """Parse one entry of ``GET .../pool``."""
        return cls(
            key=str(data.get("key", "")),
            provider=str(data.get("provider", "")),
            image=str(data.get("image", "")),
            target=int(data.get("target") or 0),
            base_size=int(data.get("base_size") or data.get("target") or 0),
            max_size=int(data.get("max_size") or data.get("target") or 0),
            size=int(data.get("size") or 0),
            creating=int(data.get("creating") or 0),
            hits=int(data.get("hits") or 0),
            misses=int(data.get("misses") or 0),
            miss_reasons=dict(data.get("miss_reasons") or {}),
            last_error=data.get("last_error"),
            raw=dict(data),
        )


@dataclass(frozen=True, slots=True)
class PoolReport:
    """Every warm pool, and the misses of requests no pool was configured for."""

    pools: tuple[PoolStatus, ...]
    unpooled_misses: Mapping[str, int]

    @classmethod
    def from_json(cls, data: Json) -> PoolReport:
        """Parse ``GET .../pool``."""
        return cls(
            pools=tuple(PoolStatus.from_json(p) for p in data.get("pools") or ()),
            unpooled_misses=dict(data.get("unpooled_misses") or {}),
        )


@dataclass(frozen=True, slots=True)
class AgentType:
    """An agent type and its workspace configuration (the API's JSON, every field)."""

    id: str
    name: str
    workspace: Mapping[str, Any]

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools its sessions may call (none when the workspace is disabled)."""
        if not self.workspace.get("enabled"):
            return ()
        return tuple(self.workspace.get("tools") or ())

    @classmethod
    def from_json(cls, data: Json) -> AgentType:
        """Parse ``{id, name, workspace}``."""
        return cls(id=str(data["id"]), name=str(data.get("name", "")), workspace=dict(data.get("workspace") or {}))


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as the server last described it."""

    id: str
    agent_type_id: str
    status: str
    """``provisioning`` until the workspace is ready, then ``active``; ``ended`` after end()."""
    workspace_id: str | None
    degraded: bool
    """The session runs without the workspace it should have; ``degraded_reason`` says why."""
    degraded_reason: str | None
    warnings: tuple[str, ...]
    task_context: Mapping[str, Any]
    created_at: datetime | None
    ended_at: datetime | None
    raw: Json = field(default_factory=dict, repr=False, compare=False)
    idle_timeout_s: float | None = None
    """Seconds without a tool call after which the server ends the session (None: no idle timeout)."""
    expires_at: datetime | None = None
    """When that idle timeout strikes unless the session is used (None unless it is active)."""

    @classmethod
    def from_json(cls, data: Json) -> SessionInfo:
        """Parse the session JSON."""
        task = data.get("task") or {}
        return cls(
            id=str(data["id"]),
            agent_type_id=str(data.get("agent_type_id", "")),
            status=str(data.get("status", "")),
            workspace_id=data.get("workspace_id"),
            degraded=bool(data.get("degraded", False)),
            degraded_reason=data.get("degraded_reason"),
            warnings=tuple(data.get("warnings") or ()),
            task_context=dict(task.get("context") or {}) if isinstance(task, Mapping) else {},
            created_at=_time(data.get("created_at")),
            ended_at=_time(data.get("ended_at")),
            raw=dict(data),
            idle_timeout_s=data.get("idle_timeout_s"),
            expires_at=_time(data.get("expires_at")),
        )


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One tool call of a session, refused ones included."""

    at: datetime | None
    tool: str
    arguments_summary: str
    status: str
    duration_ms: float

    @classmethod
    def from_json(cls, data: Json) -> AuditEntry:
        """Parse one audit entry."""
        return cls(
            at=_time(data.get("at")),
            tool=str(data.get("tool", "")),
            arguments_summary=str(data.get("arguments_summary", "")),
            status=str(data.get("status", "")),
            duration_ms=float(data.get("duration_ms") or 0.0),
        )


@dataclass(frozen=True, slots=True)
class BashResult:
    """What the session's shell printed; ``cd`` and ``export`` carry over to the next call."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool

    @property
    def ok(self) -> bool:
        """Exit code 0 and no timeout."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, data: Json) -> BashResult:
        """Parse the bash tool's answer."""
        return cls(
            exit_code=int(data["exit_code"]),
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            timed_out=bool(data.get("timed_out", False)),
            truncated=bool(data.get("truncated", False)),
        )


@dataclass(frozen=True, slots=True)
class ReadResult:
    """A window of a text file's lines."""

    content: str
    total_lines: int
    truncated: bool
    """More lines follow the window."""

    @classmethod
    def from_json(cls, data: Json) -> ReadResult:
        """Parse the read tool's answer."""
        return cls(
            content=str(data.get("content", "")),
            total_lines=int(data.get("total_lines") or 0),
            truncated=bool(data.get("truncated", False)),
        )


@dataclass(frozen=True, slots=True)
class GrepMatch:
    """One matching line."""

    path: str
    line_number: int
    line: str


@dataclass(frozen=True, slots=True)
class GrepResult:
    """Matching lines, capped by the server."""

    matches: tuple[GrepMatch, ...]
    truncated: bool

    @classmethod
    def from_json(cls, data: Json) -> GrepResult:
        """Parse the grep tool's answer."""
        return cls(
            matches=tuple(
                GrepMatch(str(m.get("path", "")), int(m.get("line_number") or 0), str(m.get("line", "")))
                for m in data.get("matches") or ()
            ),
            truncated=bool(data.get("truncated", False)),
        )


@dataclass(frozen=True, slots=True)
class GlobResult:
    """Matching paths, capped by the server."""

    paths: tuple[str, ...]
    truncated: bool

    @classmethod
    def from_json(cls, data: Json) -> GlobResult:
        """Parse the glob tool's answer."""
        return cls(paths=tuple(data.get("paths") or ()), truncated=bool(data.get("truncated", False)))


@dataclass(frozen=True, slots=True)
class GitResult:
    """What git printed, run in ``/workspace``."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        """Exit code 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, data: Json) -> GitResult:
        """Parse the git tool's answer."""
        return cls(
            exit_code=int(data["exit_code"]),
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
        )
