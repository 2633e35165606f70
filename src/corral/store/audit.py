"""The audit repository: the append-only log of a session's tool calls.

Summaries are free text built from commands and arguments; they are masked with
:func:`corral.credentials.redact_text` on the way in, so no credential reaches the log even if a caller forgot to.
"""

from __future__ import annotations

import builtins
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from corral.credentials import redact_text
from corral.store._common import database_errors, finish_when_cancelled
from corral.store.models import AuditEntryRow, utcnow
from corral.store.records import AuditEntry

__all__ = ["AuditRepository"]


class AuditRepository:
    """The append-only log of tool calls."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @finish_when_cancelled
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
        with database_errors():
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
        with database_errors():
            async with self._sessions() as session:
                rows = (await session.scalars(query)).all()
        return [AuditEntry._from_row(row) for row in rows]
