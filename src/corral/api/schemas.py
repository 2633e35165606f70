"""Request and response bodies of the HTTP API (pydantic lives here, at the edge, and nowhere deeper)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from corral.providers.base import FileInfo
from corral.store import WorkspaceRecord

__all__ = [
    "ChmodBody",
    "CreateWorkspaceBody",
    "ExecBody",
    "ExecResponse",
    "FileInfoModel",
    "MoveBody",
    "WorkspaceModel",
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateWorkspaceBody(_Body):
    """``POST /api/v1/agent/workspaces``."""

    provider: str = "auto"
    container_type: Literal["agent_workspace", "mcp_server"] = "agent_workspace"
    resource_limits: dict[str, Any] | None = None
    base_image: str | None = Field(None, min_length=1, max_length=256)
    network: Literal["isolated", "default"] = "isolated"
    metadata: dict[str, Any] = Field(default_factory=dict)


class ExecBody(_Body):
    """``POST /api/v1/agent/workspaces/{id}/exec``."""

    command: str = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    mode: Literal["shell", "argv"] = "shell"
    cwd: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float | None = Field(None, gt=0, le=86400)


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
    """The workspace JSON of DESIGN.md."""

    id: str
    status: str
    provider: str | None
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

    @classmethod
    def of(cls, record: WorkspaceRecord) -> WorkspaceModel:
        """Convert from the store's record."""
        return cls(
            id=record.id,
            status=record.status,
            provider=record.provider,
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
        )
