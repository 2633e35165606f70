"""The store's values: frozen dataclasses the repositories return, never ORM rows, and the status literals.

:data:`UNSET` means "leave this field as it is" in the repositories' update methods, where ``None`` is a value.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, cast

from sqlalchemy import Row

from corral.store.models import AgentTypeRow, AuditEntryRow, SessionRow, SnapshotRow, WorkspaceRow

__all__ = [
    "UNSET",
    "AgentTypeRecord",
    "AuditEntry",
    "ProviderAttempt",
    "SessionRecord",
    "SessionStatus",
    "SnapshotKind",
    "SnapshotRecord",
    "SnapshotStatus",
    "Unset",
    "WorkspaceRecord",
    "WorkspaceStatus",
]

WorkspaceStatus = Literal["creating", "ready", "paused", "stopped", "error", "destroyed"]
"""``paused``: checkpointed with its memory (or its whole disk where the provider cannot keep memory); resuming it
brings back its processes. ``stopped``: shut down; resuming it is a cold start."""
SessionStatus = Literal["provisioning", "active", "ended"]
SnapshotStatus = Literal["creating", "ready", "error"]
"""``creating``: the record is written and the provider is writing files; ``ready``: restorable; ``error``: the
provider failed (``error`` says why) and may have left files for reconciliation to collect."""
SnapshotKind = Literal["memory", "filesystem"]
""""memory": restoring brings back processes and memory too; "filesystem": files only, processes start fresh."""


class Unset(enum.Enum):
    """The type of :data:`UNSET`: "leave this field as it is" in update methods, where ``None`` is a value."""

    UNSET = enum.auto()


UNSET: Final = Unset.UNSET


@dataclass(frozen=True, slots=True)
class ProviderAttempt:
    """One provider that auto selection tried before the workspace was created (or every provider failed)."""

    provider: str
    error: str


@dataclass(frozen=True, slots=True)
class WorkspaceRecord:
    """A workspace as stored. ``provider`` is the backend actually used; ``pool_key`` is set only while warm."""

    id: str
    status: WorkspaceStatus
    provider: str | None
    requested_provider: str
    container_type: str
    resource_limits: dict[str, str]
    network: str
    base_image: str
    metadata: dict[str, Any]
    warnings: tuple[str, ...]
    from_warm_pool: bool
    provider_attempts: tuple[ProviderAttempt, ...]
    pool_key: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    last_used_at: datetime | None
    destroyed_at: datetime | None

    @classmethod
    def _from_row(cls, row: WorkspaceRow | Row[Any]) -> WorkspaceRecord:
        return cls(
            id=row.id,
            status=cast(WorkspaceStatus, row.status),
            provider=row.provider,
            requested_provider=row.requested_provider,
            container_type=row.container_type,
            resource_limits=dict(row.resource_limits),
            network=row.network,
            base_image=row.base_image,
            metadata=dict(row.metadata_),
            warnings=tuple(row.warnings),
            from_warm_pool=row.from_warm_pool,
            provider_attempts=tuple(ProviderAttempt(a["provider"], a["error"]) for a in row.provider_attempts),
            pool_key=row.pool_key,
            error=row.error,
            created_at=row.created_at,
            updated_at=row.updated_at,
            last_used_at=row.last_used_at,
            destroyed_at=row.destroyed_at,
        )


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """A snapshot as stored. ``workspace_id`` is the source, which may since have been destroyed; ``setup_key`` is
    set on snapshots taken after an agent type's setup. ``size_bytes`` counts against the storage limit."""

    id: str
    name: str | None
    workspace_id: str
    provider: str
    kind: SnapshotKind
    status: SnapshotStatus
    size_bytes: int
    base_image: str
    container_type: str
    network: str
    resource_limits: dict[str, str]
    metadata: dict[str, Any]
    setup_key: str | None
    error: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def _from_row(cls, row: SnapshotRow) -> SnapshotRecord:
        return cls(
            id=row.id,
            name=row.name,
            workspace_id=row.workspace_id,
            provider=row.provider,
            kind=cast(SnapshotKind, row.kind),
            status=cast(SnapshotStatus, row.status),
            size_bytes=row.size_bytes,
            base_image=row.base_image,
            container_type=row.container_type,
            network=row.network,
            resource_limits=dict(row.resource_limits),
            metadata=dict(row.metadata_),
            setup_key=row.setup_key,
            error=row.error,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


@dataclass(frozen=True, slots=True)
class AgentTypeRecord:
    """An agent type and its current workspace configuration (a JSON object validated by ``corral.agents``)."""

    id: str
    name: str
    workspace_config: dict[str, Any]
    created_at: datetime
    updated_at: datetime

    @classmethod
    def _from_row(cls, row: AgentTypeRow) -> AgentTypeRecord:
        return cls(
            id=row.id,
            name=row.name,
            workspace_config=dict(row.workspace_config),
            created_at=row.created_at,
            updated_at=row.updated_at,
        )


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """An agent session. ``workspace_config`` is the snapshot taken at start; later agent-type edits never reach it."""

    id: str
    agent_type_id: str
    status: SessionStatus
    degraded: bool
    degraded_reason: str | None
    workspace_id: str | None
    task_context: dict[str, Any]
    workspace_config: dict[str, Any]
    warnings: tuple[str, ...]
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None

    @classmethod
    def _from_row(cls, row: SessionRow | Row[Any]) -> SessionRecord:
        return cls(
            id=row.id,
            agent_type_id=row.agent_type_id,
            status=cast(SessionStatus, row.status),
            degraded=row.degraded,
            degraded_reason=row.degraded_reason,
            workspace_id=row.workspace_id,
            task_context=dict(row.task_context),
            workspace_config=dict(row.workspace_config),
            warnings=tuple(row.warnings),
            created_at=row.created_at,
            updated_at=row.updated_at,
            ended_at=row.ended_at,
        )


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One tool call in a session's audit log."""

    id: int
    session_id: str
    at: datetime
    tool: str
    arguments_summary: str
    status: str
    duration_ms: float

    @classmethod
    def _from_row(cls, row: AuditEntryRow) -> AuditEntry:
        return cls(
            id=row.id,
            session_id=row.session_id,
            at=row.at,
            tool=row.tool,
            arguments_summary=row.arguments_summary,
            status=row.status,
            duration_ms=row.duration_ms,
        )
