"""The audit repository: the append-only log of a session's tool calls.

Summaries are free text built from commands and arguments; they are masked with
:func:`corral.credentials.redact_text` on the way in, so no credential reaches the log even if a caller forgot to.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, exists, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from corral.credentials import redact_text
from corral.store._common import database_errors, finish_when_cancelled
from corral.store.models import AuditEntryRow, SessionRow, utcnow
from corral.store.records import AuditEntry

__all__ = ["AuditRepository", "ToolCall"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call to record: :meth:`AuditRepository.record` takes them in batches."""

    session_id: str
    at: datetime
    tool: str
    arguments_summary: str
    status: str
    duration_ms: float


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

    @finish_when_cancelled
    async def record(self, calls: Sequence[ToolCall]) -> None:
        """Record tool calls in one transaction, in order, each only if its session exists.

        The hot path of every tool call: one ``INSERT ... SELECT ... WHERE EXISTS`` statement run for every call
        (``executemany``), no read before it and no ORM unit of work. Credentials in the summaries are masked.
        """
        if not calls:
            return
        columns = AuditEntryRow.__table__.c
        names = ("session_id", "at", "tool", "arguments_summary", "status", "duration_ms")
        values = select(*(bindparam(name, type_=columns[name].type) for name in names))
        statement = insert(AuditEntryRow).from_select(
            list(names), values.where(exists().where(SessionRow.id == bindparam("session_id")))
        )
        rows = [
            {
                "session_id": call.session_id,
                "at": call.at,
                "tool": call.tool,
                "arguments_summary": redact_text(call.arguments_summary),
                "status": call.status,
                "duration_ms": call.duration_ms,
            }
            for call in calls
        ]
        with database_errors():
            async with self._sessions.begin() as session:
                await (await session.connection()).execute(statement, rows)

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
