"""Request and response bodies of the HTTP API (pydantic lives here, at the edge, and nowhere deeper)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.images.reference import IMAGE_REFERENCE_PATTERN
from corral.orchestrator.service import Lifetime
from corral.providers.base import FileInfo
from corral.store import SnapshotRecord, WorkspaceRecord

__all__ = [
    "AgentTypeList",
    "AgentTypeModel",
    "AuditEntryModel",
    "AuditResponse",
    "ChmodBody",
    "CreateWorkspaceBody",
    "DirectoryListing",
    "ErrorBody",
    "ErrorResponse",
    "ExecBody",
    "ExecResponse",
    "FileInfoModel",
    "GlobResponse",
    "HealthResponse",
    "Isolation",
    "MoveBody",
    "PoolModel",
    "PoolStatusResponse",
    "ProviderStatusModel",
    "ProvidersResponse",
    "SessionModel",
    "WorkspaceList",
    "WorkspaceModel",
    "WriteFileResponse",
]

Isolation = Literal["microvm", "gvisor", "container", "remote", "none"]
"""How a workspace is isolated: a microVM, gVisor, plain runc (``container``), a remote service (E2B, HTTP), or not
at all (the test provider)."""


class ErrorBody(BaseModel):
    """What went wrong: a stable code, a sentence for people, and structured details."""

    code: str = Field(description="stable snake_case code, e.g. workspace_not_found; clients branch on it")
    message: str = Field(description="what was wrong and, for bad input, what is allowed")
    details: dict[str, Any] = Field(description="structured context, e.g. the field or the provider attempts")


class ErrorResponse(BaseModel):
    """Every error the API sends: ``{"error": {"code", "message", "details"}}``."""

    error: ErrorBody


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateWorkspaceBody(_Body):
    """``POST /api/v1/agent/workspaces``."""

    provider: str = "auto"
    container_type: Literal["agent_workspace", "mcp_server"] = "agent_workspace"
    resource_limits: dict[str, Any] | None = None
    # The pattern is documented here and enforced (with a readable message) by the service, for every caller.
    base_image: (
        Annotated[str, Field(min_length=1, max_length=256, json_schema_extra={"pattern": IMAGE_REFERENCE_PATTERN})]
        | None
    ) = None
    network: Literal["isolated", "default"] = "isolated"
    metadata: dict[str, Any] = Field(default_factory=dict)
    from_snapshot: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="restore from this snapshot: its files, and its processes and memory when it has them; the "
        "snapshot decides provider, image, limits and network, so those fields must be left out",
    )


class SnapshotBody(_Body):
    """``POST /api/v1/agent/workspaces/{id}/snapshots``."""

    name: str | None = Field(None, min_length=1, max_length=128)


class ForkBody(_Body):
    """``POST /api/v1/agent/workspaces/{id}/fork``."""

    count: int = Field(1, ge=1, le=16, description="how many forks to make (1-16)")


class ExecBody(_Body):
    """``POST /api/v1/agent/workspaces/{id}/exec``."""

    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    mode: Literal["shell", "argv"] = "shell"
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float | None = Field(None, gt=0, le=86400)
    stream: bool = Field(False, strict=True)
    """Answer ``application/x-ndjson`` as the command runs: ``{"stream", "data"}`` chunks, then the exit line."""
    stdin: str | None = None
    """Text the command reads on its standard input, then end of file; none: ``/dev/null``."""


class ExecResponse(BaseModel):
    """The outcome of an exec; a nonzero ``exit_code`` is a result, not an error."""

    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    timed_out: bool
    truncated: bool


class MoveBody(_Body):
    """``POST .../files/move``."""

    src: str
    dst: str


class ChmodBody(_Body):
    """``POST .../files/chmod``; ``mode`` as an octal string ("0644") or a number."""

    path: str
    mode: str | int


class FileInfoModel(BaseModel):
    """One path's metadata."""

    path: str
    name: str
    type: str
    size: int
    mode: str
    mtime: float
    symlink_target: str | None = None

    @classmethod
    def of(cls, info: FileInfo) -> FileInfoModel:
        """Convert from the provider's value."""
        return cls(
            path=info.path,
            name=info.name,
            type=info.type,
            size=info.size,
            mode=f"{info.mode:04o}",
            mtime=info.mtime,
            symlink_target=info.symlink_target,
        )


class ProviderAttempt(BaseModel):
    """One provider tried while creating a workspace, and why it failed."""

    provider: str
    error: str


class WorkspaceModel(BaseModel):
    """A workspace as every workspace route answers it."""

    id: str
    status: str
    provider: str | None
    isolation: Isolation | None = Field(
        description="how the workspace is isolated, from its provider's capabilities; null before it has one"
    )
    requested_provider: str
    container_type: str
    resource_limits: dict[str, str]
    network: str
    base_image: str
    metadata: dict[str, Any]
    warnings: list[str]
    from_warm_pool: bool
    provider_attempts: list[ProviderAttempt]
    error: str | None = None
    created_at: datetime
    warm: bool = Field(
        False,
        description="waiting unclaimed in a warm pool (listed only by GET /api/v1/agent/workspaces?include_warm=true)",
    )
    pool: str | None = Field(None, description="the warm pool's key while ``warm``, else null")
    idle_timeout_s: float | None = Field(
        None,
        description="seconds without an exec or file call after which the workspace is stopped (a session's: its "
        "session ends); null when no idle timeout applies (CORRAL_IDLE_TIMEOUT_S=0, warm, E2B sandboxes)",
    )
    expires_at: datetime | None = Field(
        None, description="when the idle timeout strikes unless the workspace is used; null when it is not ready"
    )

    @classmethod
    def of(cls, record: WorkspaceRecord, *, isolation: str | None, lifetime: Lifetime | None = None) -> WorkspaceModel:
        """Convert from the store's record; ``isolation`` is its provider's (``WorkspaceService.isolation_of``),
        ``lifetime`` its idle timeout (``WorkspaceService.workspace_lifetime``; None: no timeout)."""
        return cls(
            id=record.id,
            status=record.status,
            provider=record.provider,
            isolation=isolation,  # validated against Isolation here
            requested_provider=record.requested_provider,
            container_type=record.container_type,
            resource_limits=dict(record.resource_limits),
            network=record.network,
            base_image=record.base_image,
            metadata=dict(record.metadata),
            warnings=list(record.warnings),
            from_warm_pool=record.from_warm_pool,
            provider_attempts=[ProviderAttempt(provider=a.provider, error=a.error) for a in record.provider_attempts],
            error=record.error,
            created_at=record.created_at,
            warm=record.pool_key is not None,
            pool=record.pool_key,
            idle_timeout_s=None if lifetime is None else lifetime.idle_timeout_s,
            expires_at=None if lifetime is None else lifetime.expires_at,
        )


class HealthResponse(BaseModel):
    """``GET /healthz``."""

    status: Literal["ok"]
    version: str


class WorkspaceList(BaseModel):
    """``GET /api/v1/agent/workspaces``."""

    workspaces: list[WorkspaceModel]


class ProviderStatusModel(BaseModel):
    """One configured provider as ``GET .../providers`` shows it."""

    name: str
    status: Literal["healthy", "unhealthy"]
    last_check: str | None
    active_workspaces: int
    available_resources: dict[str, Any]
    capabilities: dict[str, Any]
    error: str | None


class ProvidersResponse(BaseModel):
    """``GET /api/v1/agent/workspaces/providers``."""

    providers: list[ProviderStatusModel]


class PoolModel(BaseModel):
    """One warm pool: its shape, target and current size, hits and misses."""

    key: str
    provider: str
    image: str
    resource_limits: dict[str, str]
    network: str
    snapshot_id: str | None = None
    """The snapshot its workspaces are restored from (an agent type's setup pool); None: created fresh."""
    target: int = Field(description="warm workspaces it keeps now: base_size, or more while a burst grew it")
    base_size: int = Field(description="its configured size")
    max_size: int = Field(description="the most a burst may grow it to (CORRAL_WARM_POOL_GROWTH, or max_size)")
    size: int
    creating: int
    hits: int
    misses: int
    miss_reasons: dict[str, int]
    last_error: str | None


class PoolStatusResponse(BaseModel):
    """``GET /api/v1/agent/workspaces/pool``."""

    pools: list[PoolModel]
    unpooled_misses: dict[str, int]


class WriteFileResponse(BaseModel):
    """``PUT .../files``: where the bytes went and how many."""

    path: str
    bytes_written: int


class DirectoryListing(BaseModel):
    """``GET .../files/list``."""

    path: str
    entries: list[FileInfoModel]


class GlobResponse(BaseModel):
    """``GET .../files/glob``."""

    paths: list[str]


# --- agent types and sessions: documented shapes; extra fields pass through (the answers are built as dicts) ----


class AgentTypeModel(BaseModel):
    """``{id, name, workspace}``; ``workspace`` is the full workspace configuration."""

    model_config = ConfigDict(extra="allow")
    id: str
    name: str
    workspace: dict[str, Any]


class AgentTypeList(BaseModel):
    """``GET /api/v1/agent-types``."""

    model_config = ConfigDict(extra="allow")
    agent_types: list[AgentTypeModel]


class SessionModel(BaseModel):
    """A session: its status, workspace and that workspace's isolation, warnings and tools."""

    model_config = ConfigDict(extra="allow")
    id: str
    agent_type_id: str
    status: str
    workspace_id: str | None
    isolation: Isolation | None = Field(description="the isolation of the session's workspace; null without one")
    degraded: bool
    degraded_reason: str | None
    warnings: list[str]
    tools: list[str]
    created_at: str
    ended_at: str | None
    idle_timeout_s: float | None = Field(
        None, description="seconds without a tool call after which the session ends; null when none applies"
    )
    expires_at: str | None = Field(
        None, description="when the idle timeout ends the session unless it is used; null unless it is active"
    )


class AuditEntryModel(BaseModel):
    """One tool call of a session."""

    at: str
    tool: str
    arguments_summary: str
    status: str
    duration_ms: float


class AuditResponse(BaseModel):
    """``GET /api/v1/agent/sessions/{id}/audit``."""

    entries: list[AuditEntryModel]


class PausedWorkspace(WorkspaceModel):
    """The answer to pause: the workspace, and what the pause kept."""

    pause: Literal["memory", "filesystem"] = Field(
        description="memory: processes and memory come back on resume (status paused); filesystem: the provider "
        "cannot checkpoint memory, so this was a stop that keeps the whole disk (status stopped)"
    )


class ForkResponse(BaseModel):
    """The answer to fork: the new workspaces, each already running."""

    workspaces: list[WorkspaceModel]


class SnapshotModel(BaseModel):
    """A snapshot as the snapshot routes answer it."""

    id: str
    name: str | None
    workspace_id: str = Field(description="the workspace it was taken from (which may since have been destroyed)")
    provider: str
    kind: Literal["memory", "filesystem"] = Field(
        description="memory: restores bring back processes and memory; filesystem: files only"
    )
    status: Literal["creating", "ready", "error"]
    size_bytes: int
    base_image: str
    container_type: str
    network: str
    resource_limits: dict[str, str]
    metadata: dict[str, Any]
    error: str | None = None
    created_at: datetime

    @classmethod
    def of(cls, record: SnapshotRecord) -> SnapshotModel:
        """Convert from the store's record."""
        return cls(
            id=record.id,
            name=record.name,
            workspace_id=record.workspace_id,
            provider=record.provider,
            kind=record.kind,
            status=record.status,
            size_bytes=record.size_bytes,
            base_image=record.base_image,
            container_type=record.container_type,
            network=record.network,
            resource_limits=dict(record.resource_limits),
            metadata=dict(record.metadata),
            error=record.error,
            created_at=record.created_at,
        )


class SnapshotList(BaseModel):
    """``GET /api/v1/agent/snapshots``, newest first."""

    snapshots: list[SnapshotModel]
