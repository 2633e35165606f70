"""The tables, as typed SQLAlchemy 2 declarative models.

The models are the store's private representation: repositories hand out frozen dataclasses built from them
(:mod:`corral.store.records`), so nothing outside ``corral.store`` holds an ORM row or a session.

Timestamps are timezone-aware UTC everywhere. SQLite has no timezone-aware type, so :class:`UTCDateTime` stores
naive UTC there and puts ``tzinfo=UTC`` back on the way out; PostgreSQL uses ``timestamptz``. JSON columns use the
generic :class:`~sqlalchemy.types.JSON` so both databases read and write plain dicts and lists.

Every schema change needs a migration in ``migrations/versions``; ``tests/integration/test_store.py`` checks that
the migrations and these models agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

__all__ = [
    "AgentTypeRow",
    "AuditEntryRow",
    "Base",
    "SessionRow",
    "SnapshotRow",
    "UTCDateTime",
    "WorkspaceRow",
    "utcnow",
]

# Constraint names must be stable so that later migrations can alter or drop them (SQLite batch mode needs them).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python, whatever the database keeps."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to the store; use a timezone-aware UTC time")
        value = value.astimezone(UTC)
        # SQLite would drop the offset anyway; storing naive UTC keeps its string comparisons in time order.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base carrying the shared metadata and its naming convention."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads this class attribute as configuration
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        dict[str, str]: JSON(),
        list[str]: JSON(),
        list[dict[str, str]]: JSON(),
    }


class WorkspaceRow(Base):
    """One workspace, from ``creating`` to ``destroyed``; destroyed rows are kept for history."""

    __tablename__ = "workspaces"
    __table_args__ = (Index("ix_workspaces_status", "status"), Index("ix_workspaces_pool_key", "pool_key"))

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str | None] = mapped_column(String(64))
    requested_provider: Mapped[str] = mapped_column(String(64))
    container_type: Mapped[str] = mapped_column(String(32))
    resource_limits: Mapped[dict[str, str]]
    network: Mapped[str] = mapped_column(String(16))
    base_image: Mapped[str] = mapped_column(String(512))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata")
    warnings: Mapped[list[str]]
    from_warm_pool: Mapped[bool] = mapped_column(Boolean)
    provider_attempts: Mapped[list[dict[str, str]]]
    pool_key: Mapped[str | None] = mapped_column(String(255))
    error: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    destroyed_at: Mapped[datetime | None]


class SnapshotRow(Base):
    """One snapshot of a workspace: its filesystem, and its memory where the provider keeps it.

    The row is written (``creating``) before the provider writes any file, so a crash leaves a record that
    reconciliation can find. ``workspace_id`` names the source and stays after that workspace is destroyed (no
    foreign key). ``setup_key`` is set on snapshots taken after an agent type's setup ("set up once, start many").
    """

    __tablename__ = "snapshots"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(255))
    workspace_id: Mapped[str] = mapped_column(String(32), index=True)
    provider: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    base_image: Mapped[str] = mapped_column(String(512))
    container_type: Mapped[str] = mapped_column(String(32))
    network: Mapped[str] = mapped_column(String(16))
    resource_limits: Mapped[dict[str, str]]
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata")
    setup_key: Mapped[str | None] = mapped_column(String(64), index=True)
    error: Mapped[str | None] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class AgentTypeRow(Base):
    """An operator-declared agent type and its workspace configuration."""

    __tablename__ = "agent_types"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    workspace_config: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class SessionRow(Base):
    """One agent session; ``workspace_config`` is the agent type's config as it was when the session started."""

    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    agent_type_id: Mapped[str] = mapped_column(String(64), ForeignKey("agent_types.id"), index=True)
    status: Mapped[str] = mapped_column(String(16))
    degraded: Mapped[bool] = mapped_column(Boolean)
    degraded_reason: Mapped[str | None] = mapped_column(String)
    workspace_id: Mapped[str | None] = mapped_column(String(32))
    task_context: Mapped[dict[str, Any]]
    workspace_config: Mapped[dict[str, Any]]
    warnings: Mapped[list[str]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]


class AuditEntryRow(Base):
    """One tool call made in a session."""

    __tablename__ = "audit_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(String(64), index=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    tool: Mapped[str] = mapped_column(String(64))
    arguments_summary: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(32))
    duration_ms: Mapped[float] = mapped_column(Float)
