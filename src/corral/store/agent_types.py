"""The agent-type repository: agent types and their workspace configuration; names are unique.

``get`` and ``get_by_name`` return ``None`` for an unknown agent type, and so does ``update_config`` (there is no
agent-type error class; the caller decides what a miss means).
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from corral.store._common import database_errors, finish_when_cancelled, new_id, update_returning
from corral.store.models import AgentTypeRow, utcnow
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
