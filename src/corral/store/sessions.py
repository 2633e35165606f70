"""The session repository: agent sessions, each with the workspace configuration snapshotted at its start.

``get`` returns ``None`` for an unknown id, and so do ``update`` and ``add_warnings`` (there is no session error
class; the caller decides what a miss means). A session's ``degraded_reason`` and warnings are free text built from
tool output and error messages; they are masked with :func:`corral.credentials.redact_text` on the way in, so no
credential reaches those columns even if a caller forgot to.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from corral.credentials import redact_text
from corral.errors import InvalidRequestError
from corral.store._common import (
    append_warnings,
    database_errors,
    finish_when_cancelled,
    given,
    new_id,
    plain,
    row_columns,
    status_list,
    table,
    update_returning,
)
from corral.store.db import Transactions
from corral.store.models import AgentTypeRow, SessionRow, utcnow
from corral.store.records import UNSET, SessionRecord, SessionStatus, Unset

__all__ = ["SessionRepository"]

_INSERT = insert(table(SessionRow)).returning(*row_columns(SessionRow))
"""A session's insert, built once (Core, not the ORM's unit of work: see corral.store.db.Transactions); its
parameters are the table's column names."""


class SessionRepository:
    """Agent sessions."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], transactions: Transactions) -> None:
        self._sessions = sessions
        self._transactions = transactions

    @finish_when_cancelled
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
        session_id = id or new_id()
        taken = f"session {session_id!r} already exists"
        with database_errors(
            {"foreign key": unknown, "fk_sessions_agent_type_id": unknown, "sessions.id": taken, "pk_sessions": taken}
        ):

            def add(connection: Connection) -> Row[Any]:
                config = workspace_config
                if config is None:
                    config = connection.scalar(
                        select(AgentTypeRow.workspace_config).where(AgentTypeRow.id == agent_type_id)
                    )
                    if config is None:
                        raise InvalidRequestError(unknown, details={"agent_type_id": agent_type_id})
                values = {
                    "id": session_id,
                    "agent_type_id": agent_type_id,
                    "status": status,
                    "degraded": degraded,
                    "degraded_reason": redact_text(degraded_reason) if degraded_reason else degraded_reason,
                    "workspace_id": workspace_id,
                    "task_context": dict(task_context or {}),
                    # A deep copy through JSON would be stricter, but the value is serialized on insert anyway and
                    # the record hands out its own dict.
                    "workspace_config": dict(config),
                    "warnings": [redact_text(w) for w in warnings],
                    "created_at": now,
                    "updated_at": now,
                    "ended_at": None,
                }
                return connection.execute(_INSERT, values).one()

            # A warm session start waits for this insert: one call, not one per statement.
            row = await self._transactions.run(add)
        return SessionRecord._from_row(row)

    async def get(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` if the id is unknown."""
        with database_errors():
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
        statuses = status_list(status)
        if statuses is not None:
            query = query.where(SessionRow.status.in_(statuses))
        if agent_type_id is not None:
            query = query.where(SessionRow.agent_type_id == agent_type_id)
        if workspace_id is not None:
            query = query.where(SessionRow.workspace_id == workspace_id)
        with database_errors():
            async with self._sessions() as session:
                rows = (await session.scalars(query)).all()
        return [SessionRecord._from_row(row) for row in rows]

    @finish_when_cancelled
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
        values = given(
            {
                SessionRow.status: status,
                SessionRow.degraded: degraded,
                SessionRow.degraded_reason: degraded_reason,
                SessionRow.workspace_id: workspace_id,
                SessionRow.warnings: plain(warnings),
                SessionRow.task_context: plain(task_context),
                SessionRow.workspace_config: plain(workspace_config),
            },
            updated_at=SessionRow.updated_at,
            now=now,
        )
        if status == "ended":
            values[SessionRow.ended_at] = now
        with database_errors():
            async with self._sessions.begin() as session:
                row = await update_returning(session, SessionRow, SessionRow.id == session_id, values)
        return None if row is None else SessionRecord._from_row(row)

    @finish_when_cancelled
    async def add_warnings(self, session_id: str, *warnings: str) -> SessionRecord | None:
        """Append warnings not already present, safely against concurrent appends; ``None`` if the id is unknown."""
        masked = tuple(redact_text(w) for w in warnings)
        with database_errors():
            async with self._sessions.begin() as session:
                row = await append_warnings(session, SessionRow, session_id, masked)
        return None if row is None else SessionRecord._from_row(row)
