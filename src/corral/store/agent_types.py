"""The agent-type repository: agent types and their workspace configuration; names are unique.

``get`` and ``get_by_name`` return ``None`` for an unknown agent type, and so do ``update_config`` and ``delete``
(there is no agent-type error class; the caller decides what a miss means).
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from corral.store._common import database_errors, finish_when_cancelled, new_id, update_returning
from corral.store.models import AgentTypeRow, AuditEntryRow, SessionRow, utcnow
from corral.store.records import AgentTypeRecord

__all__ = ["AgentTypeRepository"]


class AgentTypeRepository:
    """Agent types; names are unique."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @finish_when_cancelled
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
            id=id or new_id(), name=name, workspace_config=dict(workspace_config), created_at=now, updated_at=now
        )
        name_taken = f"an agent type named {name!r} already exists"
        id_taken = f"agent type id {row.id!r} already exists"
        with database_errors(
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
        with database_errors():
            async with self._sessions() as session:
                row = await session.get(AgentTypeRow, agent_type_id)
        return None if row is None else AgentTypeRecord._from_row(row)

    async def get_by_name(self, name: str) -> AgentTypeRecord | None:
        """The agent type with this exact name, or ``None``."""
        with database_errors():
            async with self._sessions() as session:
                row = await session.scalar(select(AgentTypeRow).where(AgentTypeRow.name == name))
        return None if row is None else AgentTypeRecord._from_row(row)

    async def list(self) -> builtins.list[AgentTypeRecord]:
        """All agent types, oldest first."""
        with database_errors():
            async with self._sessions() as session:
                rows = (
                    await session.scalars(select(AgentTypeRow).order_by(AgentTypeRow.created_at, AgentTypeRow.id))
                ).all()
        return [AgentTypeRecord._from_row(row) for row in rows]

    @finish_when_cancelled
    async def update_config(self, agent_type_id: str, workspace_config: Mapping[str, Any]) -> AgentTypeRecord | None:
        """Replace the workspace configuration; ``None`` if the id is unknown. Running sessions keep their snapshot."""
        values = {AgentTypeRow.workspace_config: dict(workspace_config), AgentTypeRow.updated_at: utcnow()}
        with database_errors():
            async with self._sessions.begin() as session:
                row = await update_returning(session, AgentTypeRow, AgentTypeRow.id == agent_type_id, values)
        return None if row is None else AgentTypeRecord._from_row(row)

    @finish_when_cancelled
    async def delete(self, agent_type_id: str, *, live: Collection[str]) -> builtins.list[str] | None:
        """Delete the agent type, unless sessions of it are in a ``live`` status; in one transaction.

        Its other (ended) sessions and their audit entries go with it: sessions reference their agent type, so keeping
        them would need the type's row kept as well.

        Returns:
            ``None`` for an unknown id; the ids of the live sessions (then nothing is deleted), oldest first; or an
            empty list when the agent type was deleted.
        """
        sessions_of = select(SessionRow.id).where(SessionRow.agent_type_id == agent_type_id)
        live_of = sessions_of.where(SessionRow.status.in_(list(live))).order_by(SessionRow.created_at, SessionRow.id)
        with database_errors():
            try:
                async with self._sessions.begin() as session:
                    if await session.get(AgentTypeRow, agent_type_id) is None:
                        return None
                    blocking = list((await session.scalars(live_of)).all())
                    if blocking:
                        return blocking
                    await session.execute(delete(AuditEntryRow).where(AuditEntryRow.session_id.in_(sessions_of)))
                    await session.execute(delete(SessionRow).where(SessionRow.agent_type_id == agent_type_id))
                    await session.execute(delete(AgentTypeRow).where(AgentTypeRow.id == agent_type_id))
            except IntegrityError:
                # A session of this type started meanwhile (its row references the type): it is live.
                async with self._sessions() as session:
                    return list((await session.scalars(live_of)).all()) or ["(a session being started)"]
        return []
