"""The workspace repository: workspaces, including destroyed ones, and the atomic claim from a warm pool.

Updates write only the columns they are given (``UPDATE ... SET col = :value``), never a whole row read earlier, so
two tasks changing different fields of one workspace both keep their change. Appending warnings and claiming a warm
workspace must read before they write; they lock the row first.

``get`` returns ``None`` for an unknown id; ``update``, ``mark_status`` and ``add_warnings`` raise
:class:`~corral.errors.WorkspaceNotFoundError`.
"""

from __future__ import annotations

import builtins
import functools
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, Update, bindparam, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from corral.errors import WorkspaceNotFoundError
from corral.store._common import (
    append_warnings,
    attempt_dicts,
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
from corral.store.models import WorkspaceRow, utcnow
from corral.store.records import UNSET, ProviderAttempt, Unset, WorkspaceRecord, WorkspaceStatus

__all__ = ["WorkspaceRepository"]


class WorkspaceRepository:
    """Workspaces, including destroyed ones (kept for history, hidden from :meth:`list` unless asked for)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], transactions: Transactions) -> None:
        self._sessions = sessions
        self._transactions = transactions

    @finish_when_cancelled
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
            id=id or new_id(),
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
        with database_errors({"workspaces.id": taken, "pk_workspaces": taken}):
            async with self._sessions.begin() as session:
                session.add(row)
        return WorkspaceRecord._from_row(row)

    async def get(self, workspace_id: str) -> WorkspaceRecord | None:
        """The workspace, destroyed or not, or ``None`` if the id is unknown."""
        with database_errors():
            async with self._sessions() as session:
                row = await session.get(WorkspaceRow, workspace_id)
        return None if row is None else WorkspaceRecord._from_row(row)

    @finish_when_cancelled
    async def delete(self, workspace_id: str) -> bool:
        """Remove the record altogether (a failed create nobody asked to keep); True if it existed."""
        with database_errors():
            async with self._sessions.begin() as session:
                result = await session.execute(delete(WorkspaceRow).where(WorkspaceRow.id == workspace_id))
        return bool(getattr(result, "rowcount", 0))

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
        statuses = status_list(status)
        if statuses is not None:
            query = query.where(WorkspaceRow.status.in_(statuses))
        elif not include_destroyed:
            query = query.where(WorkspaceRow.status != "destroyed")
        if pool_key is not None:
            query = query.where(WorkspaceRow.pool_key == pool_key)
        with database_errors():
            async with self._sessions() as session:
                rows = (await session.scalars(query)).all()
        return [WorkspaceRecord._from_row(row) for row in rows]

    @finish_when_cancelled
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
            WorkspaceNotFoundError: No workspace has this id.
        """
        now = utcnow()
        values = given(
            {
                WorkspaceRow.status: status,
                WorkspaceRow.provider: provider,
                WorkspaceRow.requested_provider: requested_provider,
                WorkspaceRow.container_type: container_type,
                WorkspaceRow.resource_limits: plain(resource_limits),
                WorkspaceRow.base_image: base_image,
                WorkspaceRow.metadata_: plain(metadata),
                WorkspaceRow.warnings: plain(warnings),
                WorkspaceRow.from_warm_pool: from_warm_pool,
                WorkspaceRow.provider_attempts: attempt_dicts(provider_attempts),
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
        with database_errors():
            async with self._sessions.begin() as session:
                row = await update_returning(session, WorkspaceRow, WorkspaceRow.id == workspace_id, values)
        if row is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id!r} does not exist", details={"id": workspace_id})
        return WorkspaceRecord._from_row(row)

    async def mark_status(
        self, workspace_id: str, status: WorkspaceStatus, *, error: str | Unset | None = UNSET
    ) -> WorkspaceRecord:
        """Move the workspace to ``status`` (optionally recording ``error``); see :meth:`update`.

        Raises:
            WorkspaceNotFoundError: No workspace has this id.
        """
        return await self.update(workspace_id, status=status, error=error)

    @finish_when_cancelled
    async def add_warnings(self, workspace_id: str, *warnings: str) -> WorkspaceRecord:
        """Append warnings not already present, safely against concurrent appends.

        Raises:
            WorkspaceNotFoundError: No workspace has this id.
        """
        with database_errors():
            async with self._sessions.begin() as session:
                row = await append_warnings(session, WorkspaceRow, workspace_id, warnings)
        if row is None:
            raise WorkspaceNotFoundError(f"workspace {workspace_id!r} does not exist", details={"id": workspace_id})
        return WorkspaceRecord._from_row(row)

    @finish_when_cancelled
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
        values = given(
            {
                WorkspaceRow.pool_key: None,
                WorkspaceRow.from_warm_pool: True,
                WorkspaceRow.last_used_at: now,
                WorkspaceRow.requested_provider: requested_provider,
                WorkspaceRow.container_type: container_type,
                WorkspaceRow.metadata_: plain(metadata),
                WorkspaceRow.warnings: plain(warnings),
                WorkspaceRow.provider_attempts: attempt_dicts(provider_attempts),
            },
            updated_at=WorkspaceRow.updated_at,
            now=now,
        )
        statement = _claim_statement(tuple(column.key for column in values))
        params = {"claim_key": pool_key, **{f"set_{column.key}": value for column, value in values.items()}}

        def claim(connection: Connection) -> Row[Any] | None:
            return connection.execute(statement, params).first()

        with database_errors():  # a warm start waits for this: one call, not one per statement
            row = await self._transactions.run(claim)
        return None if row is None else WorkspaceRecord._from_row(row)


@functools.cache
def _claim_statement(columns: tuple[str, ...]) -> Update:
    """The claim's ``UPDATE ... RETURNING`` setting ``columns``, built once per set of columns: its values are bind
    parameters (``claim_key``, and ``set_<column>`` for each column), so a warm start neither builds nor hashes a
    statement (0.2-0.5 ms of SQLAlchemy work each time on these machines)."""
    key = bindparam("claim_key", type_=WorkspaceRow.pool_key.type)
    candidate = (
        select(WorkspaceRow.id)
        .where(WorkspaceRow.pool_key == key, WorkspaceRow.status == "ready")
        .order_by(WorkspaceRow.created_at, WorkspaceRow.id)
        .limit(1)
        # PostgreSQL: concurrent claimers skip each other's rows instead of queueing on them. SQLite ignores
        # this; its single writer lock already serializes the statement.
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    # The pool_key test again: a row claimed and committed by another caller after this statement's snapshot is
    # re-checked under its lock and dropped.
    where = (WorkspaceRow.id == candidate) & (WorkspaceRow.pool_key == key)
    values = {
        getattr(WorkspaceRow, name): bindparam(f"set_{name}", type_=getattr(WorkspaceRow, name).type)
        for name in columns
    }
    # Core, not the ORM's bulk UPDATE: the same SQL at half the Python cost (see corral.store.db.Transactions).
    return update(table(WorkspaceRow)).where(where).values(values).returning(*row_columns(WorkspaceRow))
