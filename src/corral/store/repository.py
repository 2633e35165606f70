"""Repositories: the only way the rest of Corral reads and writes the database.

:class:`Store` opens the database (running migrations) and carries one small repository per aggregate:
``store.workspaces``, ``store.agent_types``, ``store.sessions`` and ``store.audit``. Every method is one short
transaction and returns frozen dataclasses, never ORM rows, so callers hold no session and nothing lazy-loads.

Concurrency: updates write only the columns they are given (``UPDATE ... SET col = :value``), never a whole row read
earlier, so two tasks changing different fields of one workspace both keep their change. The few operations that
must read before they write (appending warnings, claiming a warm workspace) lock the row first.

Missing rows and errors:

* ``get`` methods return ``None`` for an unknown id.
* Workspace ``update``, ``mark_status`` and ``add_warnings`` raise :class:`~corral.errors.SandboxNotFoundError`.
* Agent-type ``update_config`` and session ``update``/``add_warnings`` return ``None`` for an unknown id (there is no
  agent-type or session error class; the caller decides what a miss means).
* Constraint violations become :class:`~corral.errors.InvalidRequestError` naming the offending value (a duplicate
  agent-type name, a duplicate id, an unknown agent type); any other database failure becomes a
  :class:`~corral.errors.CorralError` whose message names the failure without the URL's password.

A session's ``degraded_reason`` and warnings, and audit summaries, are free text built from tool output, error
messages and commands; they are masked with :func:`corral.credentials.redact_text` on the way in, so no credential
reaches those columns even if a caller forgot to.
"""

from __future__ import annotations

import builtins
import enum
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Literal, Self, TypeVar, cast

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.engine import URL
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute

from corral.credentials import redact_text
from corral.errors import CorralError, InvalidRequestError, SandboxNotFoundError
from corral.store.db import async_url, create_engine, create_session_factory, migrate
from corral.store.models import AgentTypeRow, AuditEntryRow, SessionRow, WorkspaceRow, utcnow

__all__ = [
    "UNSET",
    "AgentTypeRecord",
    "AgentTypeRepository",
    "AuditEntry",
    "AuditRepository",
    "ProviderAttempt",
    "SessionRecord",
    "SessionRepository",
    "SessionStatus",
    "Store",
    "Unset",
    "WorkspaceRecord",
    "WorkspaceRepository",
    "WorkspaceStatus",
]

WorkspaceStatus = Literal["creating", "ready", "stopped", "error", "destroyed"]
SessionStatus = Literal["provisioning", "active", "ended"]


class Unset(enum.Enum):
    """The type of :data:`UNSET`: "leave this field as it is" in update methods, where ``None`` is a value."""

    UNSET = enum.auto()


UNSET: Final = Unset.UNSET


def _new_id() -> str:
    return uuid.uuid4().hex


# --- values ---------------------------------------------------------------------------------------------------------


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
    def _from_row(cls, row: WorkspaceRow) -> WorkspaceRecord:
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
    def _from_row(cls, row: SessionRow) -> SessionRecord:
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


# --- error translation ----------------------------------------------------------------------------------------------


@contextmanager
def _database_errors(integrity: Mapping[str, str] | None = None) -> Iterator[None]:
    """Translate SQLAlchemy errors raised inside the block into Corral errors.

    Args:
        integrity: For an ``IntegrityError``: the first entry whose key occurs (case-insensitively) in the driver's
            message gives the :class:`InvalidRequestError` message. Keys are constraint or column names, which
            SQLite (``table.column``) and PostgreSQL (constraint name) put in their messages. Without a match the
            message reports the driver's own text.
    """
    try:
        yield
    except IntegrityError as exc:
        text = str(exc.orig).lower()
        for needle, message in (integrity or {}).items():
            if needle.lower() in text:
                raise InvalidRequestError(message) from exc
        raise InvalidRequestError(f"the change breaks a database constraint: {_first_line(exc)}") from exc
    except SQLAlchemyError as exc:
        raise CorralError(f"database operation failed: {type(exc).__name__}: {_first_line(exc)}") from exc
    except OSError as exc:  # asyncpg raises the socket error itself when the server is unreachable
        raise CorralError(f"cannot reach the database: {exc}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _given(
    fields: Mapping[InstrumentedAttribute[Any], Any], *, updated_at: InstrumentedAttribute[datetime], now: datetime
) -> dict[InstrumentedAttribute[Any], Any]:
    """The SET clause of an update: the fields given (not :data:`UNSET`), plus ``updated_at``."""
    values = {column: value for column, value in fields.items() if value is not UNSET}
    values[updated_at] = now
    return values


def _plain(value: Any) -> Any:
    """A fresh JSON-ready copy: mappings become dicts and sequences lists; :data:`UNSET` passes through."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        return builtins.list(value)
    return value


def _attempts(attempts: Sequence[ProviderAttempt] | Unset) -> builtins.list[dict[str, str]] | Unset:
    if isinstance(attempts, Unset):
        return attempts
    return [{"provider": a.provider, "error": a.error} for a in attempts]


def _statuses(status: str | Collection[str] | None) -> builtins.list[str] | None:
    if status is None:
        return None
    return [status] if isinstance(status, str) else builtins.list(status)


# --- repositories ---------------------------------------------------------------------------------------------------


class WorkspaceRepository:
    """Workspaces, including destroyed ones (kept for history, hidden from :meth:`list` unless asked for)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def create(
        self,
        *,
        requested_provider: str,
        container_type: str,
        resource_limits: Mapping[str, str],
        network: str,
        base_image: str,
        id: str | None = None,  # the column's name; keyword-only, so callers shadow nothing
        status: WorkspaceStatus = "creating",
        provider: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        warnings: Sequence[str] = (),
        from_warm_pool: bool = False,
        provider_attempts: Sequence[ProviderAttempt] = (),
        pool_key: str | None = None,
        error: str | None = None,
    ) -> WorkspaceRecord:
        """Insert a workspace; ``id`` defaults to a new 32-character hex id.

        Raises:
            InvalidRequestError: A workspace with this id already exists.
        """
        now = utcnow()
        row = WorkspaceRow(
            id=id or _new_id(),
            status=status,
            provider=provider,
            requested_provider=requested_provider,
            container_type=container_type,
            resource_limits=dict(resource_limits),
            network=network,
            base_image=base_image,
            metadata_=dict(metadata or {}),
            warnings=builtins.list(warnings),
            from_warm_pool=from_warm_pool,
            provider_attempts=[{"provider": a.provider, "error": a.error} for a in provider_attempts],
            pool_key=pool_key,
            error=error,
            created_at=now,
            updated_at=now,
        )
        taken = f"workspace {row.id!r} already exists"
        with _database_errors({"workspaces.id": taken, "pk_workspaces": taken}):
            async with self._sessions.begin() as session:
                session.add(row)
        return WorkspaceRecord._from_row(row)

    async def get(self, workspace_id: str) -> WorkspaceRecord | None:
        """The workspace, destroyed or not, or ``None`` if the id is unknown."""
        with _database_errors():
            async with self._sessions() as session:
                row = await session.get(WorkspaceRow, workspace_id)
        return None if row is None else WorkspaceRecord._from_row(row)

    async def list(
        self,
        *,
        status: WorkspaceStatus | Collection[WorkspaceStatus] | None = None,
        pool_key: str | None = None,
        include_destroyed: bool = False,
    ) -> builtins.list[WorkspaceRecord]:
        """Workspaces, oldest first.

        Args:
            status: Only these statuses. Naming ``"destroyed"`` here includes destroyed workspaces.
            pool_key: Only workspaces sitting in this warm pool.
            include_destroyed: Without ``status``, destroyed workspaces are left out unless this is true.
        """
        query = select(WorkspaceRow).order_by(WorkspaceRow.created_at, WorkspaceRow.id)
        statuses = _statuses(status)
        if statuses is not None:
            query = query.where(WorkspaceRow.status.in_(statuses))
        elif not include_destroyed:
            query = query.where(WorkspaceRow.status != "destroyed")
        if pool_key is not None:
            query = query.where(WorkspaceRow.pool_key == pool_key)
        with _database_errors():
            async with self._sessions() as session:
                rows = (await session.scalars(query)).all()
        return [WorkspaceRecord._from_row(row) for row in rows]

    async def update(
        self,
        workspace_id: str,
        *,
        status: WorkspaceStatus | Unset = UNSET,
        provider: str | Unset | None = UNSET,
        requested_provider: str | Unset = UNSET,
        container_type: str | Unset = UNSET,
        resource_limits: Mapping[str, str] | Unset = UNSET,
        base_image: str | Unset = UNSET,
        metadata: Mapping[str, Any] | Unset = UNSET,
        warnings: Sequence[str] | Unset = UNSET,
        from_warm_pool: bool | Unset = UNSET,
        provider_attempts: Sequence[ProviderAttempt] | Unset = UNSET,
        pool_key: str | Unset | None = UNSET,
        error: str | Unset | None = UNSET,
        last_used_at: datetime | Unset | None = UNSET,
    ) -> WorkspaceRecord:
        """Set the given fields, and only those, in one ``UPDATE``; ``updated_at`` is always refreshed.

        Moving to ``destroyed`` also sets ``destroyed_at`` and takes the workspace out of its warm pool (unless
        ``pool_key`` is given).

        Raises:
            SandboxNotFoundError: No workspace has this id.
        """
        now = utcnow()
        values = _given(
            {
                WorkspaceRow.status: status,
                WorkspaceRow.provider: provider,
                WorkspaceRow.requested_provider: requested_provider,
                WorkspaceRow.container_type: container_type,
                WorkspaceRow.resource_limits: _plain(resource_limits),
                WorkspaceRow.base_image: base_image,
                WorkspaceRow.metadata_: _plain(metadata),
                WorkspaceRow.warnings: _plain(warnings),
                WorkspaceRow.from_warm_pool: from_warm_pool,
                WorkspaceRow.provider_attempts: _attempts(provider_attempts),
                WorkspaceRow.pool_key: pool_key,
                WorkspaceRow.error: error,
                WorkspaceRow.last_used_at: last_used_at,
            },
            updated_at=WorkspaceRow.updated_at,
            now=now,
        )
        if status == "destroyed":
            values[WorkspaceRow.destroyed_at] = now
            values.setdefault(WorkspaceRow.pool_key, None)
        with _database_errors():
            async with self._sessions.begin() as session:
                row = await _update_returning(session, WorkspaceRow, WorkspaceRow.id == workspace_id, values)
        if row is None:
            raise SandboxNotFoundError(f"workspace {workspace_id!r} does not exist", details={"id": workspace_id})
        return WorkspaceRecord._from_row(row)

    async def mark_status(
        self, workspace_id: str, status: WorkspaceStatus, *, error: str | Unset | None = UNSET
    ) -> WorkspaceRecord:
        """Move the workspace to ``status`` (optionally recording ``error``); see :meth:`update`.

        Raises:
            SandboxNotFoundError: No workspace has this id.
        """
        return await self.update(workspace_id, status=status, error=error)

    async def add_warnings(self, workspace_id: str, *warnings: str) -> WorkspaceRecord:
        """Append warnings not already present, safely against concurrent appends.

        Raises:
            SandboxNotFoundError: No workspace has this id.
        """
        with _database_errors():
            async with self._sessions.begin() as session:
                row = await _append_warnings(session, WorkspaceRow, workspace_id, warnings)
        if row is None:
            raise SandboxNotFoundError(f"workspace {workspace_id!r} does not exist", details={"id": workspace_id})
        return WorkspaceRecord._from_row(row)

    async def claim_from_pool(
        self,
        pool_key: str,
        *,
        requested_provider: str | Unset = UNSET,
        container_type: str | Unset = UNSET,
        metadata: Mapping[str, Any] | Unset = UNSET,
        warnings: Sequence[str] | Unset = UNSET,
        provider_attempts: Sequence[ProviderAttempt] | Unset = UNSET,
    ) -> WorkspaceRecord | None:
        """Take the oldest ``ready`` workspace out of the warm pool ``pool_key``, or ``None`` if the pool is empty.

        The claim is atomic: concurrent callers never get the same workspace. The claimed workspace has
        ``pool_key=None``, ``from_warm_pool=True`` and ``last_used_at`` set to now; the other fields given are set
        in the same statement (one write on the hot path of a warm start).
        """
        now = utcnow()
        candidate = (
            select(WorkspaceRow.id)
            .where(WorkspaceRow.pool_key == pool_key, WorkspaceRow.status == "ready")
            .order_by(WorkspaceRow.created_at, WorkspaceRow.id)
            .limit(1)
            # PostgreSQL: concurrent claimers skip each other's rows instead of queueing on them. SQLite ignores
            # this; its single writer lock already serializes the statement.
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        # The pool_key test again: a row claimed and committed by another caller after this statement's snapshot is
        # re-checked under its lock and dropped.
        where = (WorkspaceRow.id == candidate) & (WorkspaceRow.pool_key == pool_key)
        values = _given(
            {
                WorkspaceRow.pool_key: None,
                WorkspaceRow.from_warm_pool: True,
                WorkspaceRow.last_used_at: now,
                WorkspaceRow.requested_provider: requested_provider,
                WorkspaceRow.container_type: container_type,
                WorkspaceRow.metadata_: _plain(metadata),
                WorkspaceRow.warnings: _plain(warnings),
                WorkspaceRow.provider_attempts: _attempts(provider_attempts),
            },
            updated_at=WorkspaceRow.updated_at,
            now=now,
        )
        with _database_errors():
            async with self._sessions.begin() as session:
                row = await _update_returning(session, WorkspaceRow, where, values)
        return None if row is None else WorkspaceRecord._from_row(row)


class AgentTypeRepository:
    """Agent types; names are unique."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def create(
        self,
        name: str,
        workspace_config: Mapping[str, Any],
        *,
        id: str | None = None,  # the column's name; keyword-only
    ) -> AgentTypeRecord:
        """Insert an agent type; ``id`` defaults to a new hex id.

        Raises:
            InvalidRequestError: The name (or the id) is already taken.
        """
        now = utcnow()
        row = AgentTypeRow(
            id=id or _new_id(), name=name, workspace_config=dict(workspace_config), created_at=now, updated_at=now
        )
        name_taken = f"an agent type named {name!r} already exists"
        id_taken = f"agent type id {row.id!r} already exists"
        with _database_errors(
            {
                "agent_types.name": name_taken,
                "uq_agent_types_name": name_taken,
                "agent_types.id": id_taken,
                "pk_agent_types": id_taken,
            }
        ):
            async with self._sessions.begin() as session:
                session.add(row)
        return AgentTypeRecord._from_row(row)

    async def get(self, agent_type_id: str) -> AgentTypeRecord | None:
        """The agent type, or ``None`` if the id is unknown."""
        with _database_errors():
            async with self._sessions() as session:
                row = await session.get(AgentTypeRow, agent_type_id)
        return None if row is None else AgentTypeRecord._from_row(row)

    async def get_by_name(self, name: str) -> AgentTypeRecord | None:
        """The agent type with this exact name, or ``None``."""
        with _database_errors():
            async with self._sessions() as session:
                row = await session.scalar(select(AgentTypeRow).where(AgentTypeRow.name == name))
        return None if row is None else AgentTypeRecord._from_row(row)

    async def list(self) -> builtins.list[AgentTypeRecord]:
        """All agent types, oldest first."""
        with _database_errors():
            async with self._sessions() as session:
                rows = (
                    await session.scalars(select(AgentTypeRow).order_by(AgentTypeRow.created_at, AgentTypeRow.id))
                ).all()
        return [AgentTypeRecord._from_row(row) for row in rows]

    async def update_config(self, agent_type_id: str, workspace_config: Mapping[str, Any]) -> AgentTypeRecord | None:
        """Replace the workspace configuration; ``None`` if the id is unknown. Running sessions keep their snapshot."""
        values = {AgentTypeRow.workspace_config: dict(workspace_config), AgentTypeRow.updated_at: utcnow()}
        with _database_errors():
            async with self._sessions.begin() as session:
                row = await _update_returning(session, AgentTypeRow, AgentTypeRow.id == agent_type_id, values)
        return None if row is None else AgentTypeRecord._from_row(row)


class SessionRepository:
    """Agent sessions."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def create(
        self,
        agent_type_id: str,
        *,
        task_context: Mapping[str, Any] | None = None,
        workspace_config: Mapping[str, Any] | None = None,
        id: str | None = None,  # the column's name; keyword-only
        status: SessionStatus = "provisioning",
        workspace_id: str | None = None,
        degraded: bool = False,
        degraded_reason: str | None = None,
        warnings: Sequence[str] = (),
    ) -> SessionRecord:
        """Insert a session, snapshotting the workspace configuration it will run with.

        Args:
            agent_type_id: The session's agent type; it must exist.
            task_context: The task's context (repository URL, branch, ...), stored as given.
            workspace_config: The effective configuration to snapshot. ``None`` copies the agent type's current
                ``workspace_config``.

        Raises:
            InvalidRequestError: The agent type does not exist, or the session id is taken.
        """
        now = utcnow()
        unknown = f"agent type {agent_type_id!r} does not exist"
        session_id = id or _new_id()
        taken = f"session {session_id!r} already exists"
        with _database_errors(
            {"foreign key": unknown, "fk_sessions_agent_type_id": unknown, "sessions.id": taken, "pk_sessions": taken}
        ):
            async with self._sessions.begin() as session:
                if workspace_config is None:
                    agent_type = await session.get(AgentTypeRow, agent_type_id)
                    if agent_type is None:
                        raise InvalidRequestError(unknown, details={"agent_type_id": agent_type_id})
                    workspace_config = agent_type.workspace_config
                row = SessionRow(
                    id=session_id,
                    agent_type_id=agent_type_id,
                    status=status,
                    degraded=degraded,
                    degraded_reason=redact_text(degraded_reason) if degraded_reason else degraded_reason,
                    workspace_id=workspace_id,
                    task_context=dict(task_context or {}),
                    # A deep copy through JSON would be stricter, but the value is serialized on insert anyway and
                    # the record hands out its own dict.
                    workspace_config=dict(workspace_config),
                    warnings=[redact_text(w) for w in warnings],
                    created_at=now,
                    updated_at=now,
                )
                session.add(row)
        return SessionRecord._from_row(row)

    async def get(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` if the id is unknown."""
        with _database_errors():
            async with self._sessions() as session:
                row = await session.get(SessionRow, session_id)
        return None if row is None else SessionRecord._from_row(row)

    async def list(
        self,
        *,
        status: SessionStatus | Collection[SessionStatus] | None = None,
        agent_type_id: str | None = None,
        workspace_id: str | None = None,
    ) -> builtins.list[SessionRecord]:
        """Sessions matching every given filter, oldest first."""
        query = select(SessionRow).order_by(SessionRow.created_at, SessionRow.id)
        statuses = _statuses(status)
        if statuses is not None:
            query = query.where(SessionRow.status.in_(statuses))
        if agent_type_id is not None:
            query = query.where(SessionRow.agent_type_id == agent_type_id)
        if workspace_id is not None:
            query = query.where(SessionRow.workspace_id == workspace_id)
        with _database_errors():
            async with self._sessions() as session:
                rows = (await session.scalars(query)).all()
        return [SessionRecord._from_row(row) for row in rows]

    async def update(
        self,
        session_id: str,
        *,
        status: SessionStatus | Unset = UNSET,
        degraded: bool | Unset = UNSET,
        degraded_reason: str | Unset | None = UNSET,
        workspace_id: str | Unset | None = UNSET,
        warnings: Sequence[str] | Unset = UNSET,
        task_context: Mapping[str, Any] | Unset = UNSET,
        workspace_config: Mapping[str, Any] | Unset = UNSET,
    ) -> SessionRecord | None:
        """Set the given fields, and only those; ``None`` if the id is unknown. ``ended`` also sets ``ended_at``.

        ``task_context`` and ``workspace_config`` replace the stored ones: the agent service drops the sealed
        credential once provisioning has ended, and seals what older versions stored in clear.
        """
        now = utcnow()
        if isinstance(degraded_reason, str):
            degraded_reason = redact_text(degraded_reason)
        if not isinstance(warnings, Unset):
            warnings = [redact_text(w) for w in warnings]
        values = _given(
            {
                SessionRow.status: status,
                SessionRow.degraded: degraded,
                SessionRow.degraded_reason: degraded_reason,
                SessionRow.workspace_id: workspace_id,
                SessionRow.warnings: _plain(warnings),
                SessionRow.task_context: _plain(task_context),
                SessionRow.workspace_config: _plain(workspace_config),
            },
            updated_at=SessionRow.updated_at,
            now=now,
        )
        if status == "ended":
            values[SessionRow.ended_at] = now
        with _database_errors():
            async with self._sessions.begin() as session:
                row = await _update_returning(session, SessionRow, SessionRow.id == session_id, values)
        return None if row is None else SessionRecord._from_row(row)

    async def add_warnings(self, session_id: str, *warnings: str) -> SessionRecord | None:
        """Append warnings not already present, safely against concurrent appends; ``None`` if the id is unknown."""
        masked = tuple(redact_text(w) for w in warnings)
        with _database_errors():
            async with self._sessions.begin() as session:
                row = await _append_warnings(session, SessionRow, session_id, masked)
        return None if row is None else SessionRecord._from_row(row)


class AuditRepository:
    """The append-only log of tool calls."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def append(
        self,
        session_id: str,
        *,
        tool: str,
        arguments_summary: str,
        status: str,
        duration_ms: float,
        at: datetime | None = None,
    ) -> AuditEntry:
        """Record one tool call; ``at`` defaults to now. Credentials in the summary are masked."""
        row = AuditEntryRow(
            session_id=session_id,
            at=at or utcnow(),
            tool=tool,
            arguments_summary=redact_text(arguments_summary),
            status=status,
            duration_ms=duration_ms,
        )
        with _database_errors():
            async with self._sessions.begin() as session:
                session.add(row)
        return AuditEntry._from_row(row)

    async def list(self, session_id: str) -> builtins.list[AuditEntry]:
        """The session's entries in time order (insertion order among equal times)."""
        query = (
            select(AuditEntryRow)
            .where(AuditEntryRow.session_id == session_id)
            .order_by(AuditEntryRow.at, AuditEntryRow.id)
        )
        with _database_errors():
            async with self._sessions() as session:
                rows = (await session.scalars(query)).all()
        return [AuditEntry._from_row(row) for row in rows]


# --- shared statements ----------------------------------------------------------------------------------------------

_RowT = TypeVar("_RowT", WorkspaceRow, AgentTypeRow, SessionRow)
_WarnedRowT = TypeVar("_WarnedRowT", WorkspaceRow, SessionRow)


async def _update_returning(
    session: AsyncSession, model: type[_RowT], where: ColumnElement[bool], values: Mapping[Any, Any]
) -> _RowT | None:
    """``UPDATE model SET values WHERE where RETURNING *`` as one statement; the first updated row or ``None``."""
    statement = update(model).where(where).values(dict(values)).returning(model)
    result = await session.scalars(statement, execution_options={"synchronize_session": False})
    return result.first()


async def _append_warnings(
    session: AsyncSession, model: type[_WarnedRowT], row_id: str, warnings: Sequence[str]
) -> _WarnedRowT | None:
    # Touch the row first: that takes its lock (PostgreSQL) or the database write lock (SQLite) before the read, so
    # the warnings read below are the latest and nobody can append between our read and our write.
    current = await session.scalar(
        update(model).where(model.id == row_id).values(updated_at=utcnow()).returning(model.warnings),
        execution_options={"synchronize_session": False},
    )
    if current is None:
        return None
    existing: list[str] = list(current)
    merged = existing + [w for w in dict.fromkeys(warnings) if w not in existing]
    return await _update_returning(session, model, model.id == row_id, {model.warnings: merged})


# --- the facade -----------------------------------------------------------------------------------------------------


class Store:
    """The database: an engine plus one repository per aggregate.

    Open with ``store = await Store.open(url)`` (or ``async with await Store.open(url) as store:``) and close with
    ``await store.close()``. ``Store(engine)`` wraps an engine you created and migrated yourself.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        sessions = create_session_factory(engine)
        self.workspaces = WorkspaceRepository(sessions)
        self.agent_types = AgentTypeRepository(sessions)
        self.sessions = SessionRepository(sessions)
        self.audit = AuditRepository(sessions)

    @classmethod
    async def open(cls, url: str | URL, *, run_migrations: bool = True, **engine_options: Any) -> Store:
        """Create the engine for ``url`` (sync or async driver names both work) and migrate the schema to head.

        Args:
            url: ``sqlite:///path/corral.db``, ``postgresql://user:pw@host/db`` or their async forms.
            run_migrations: Upgrade the schema first; turn off only when something else migrates.
            engine_options: Passed to :func:`sqlalchemy.ext.asyncio.create_async_engine`.

        Raises:
            CorralError: The database cannot be reached or migrated; the message hides the password.
        """
        safe = async_url(url).render_as_string(hide_password=True)
        try:
            engine = create_engine(url, **engine_options)
        except OSError as exc:  # the SQLite data directory cannot be created
            raise CorralError(f"cannot open the database {safe}: {exc}") from exc
        try:
            if run_migrations:
                await migrate(engine)
        except (SQLAlchemyError, OSError) as exc:
            await engine.dispose()
            raise CorralError(f"cannot open the database {safe}: {_first_line(exc)}") from exc
        except BaseException:
            await engine.dispose()
            raise
        return cls(engine)

    async def checkpoint(self) -> None:
        """SQLite: move the WAL into the database file and truncate it, so overwritten values leave the WAL too
        (freed pages are already zeroed: ``secure_delete``). A no-op on PostgreSQL."""
        if self.engine.dialect.name != "sqlite":
            return
        with _database_errors():
            async with self.engine.connect() as connection:
                await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    async def close(self) -> None:
        """Close every pooled connection. The store must not be used afterwards."""
        await self.engine.dispose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
