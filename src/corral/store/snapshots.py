"""The snapshot repository: snapshot records, their storage total and the "set up once, start many" lookup.

A record is written (``creating``) before the provider writes any file and deleted after the files are gone, so
reconciliation can match host objects to records and the storage total counts snapshots still being written.
Records outlive their source workspace: ``workspace_id`` is kept, without a foreign key.

Updates write only the columns they are given (``UPDATE ... SET col = :value``), like the workspace repository.
``get`` and ``find_setup`` return ``None`` on a miss, ``delete`` returns ``False``, and ``update`` raises
:class:`~corral.errors.SnapshotNotFoundError`.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from corral.errors import SnapshotNotFoundError
from corral.store._common import (
    database_errors,
    finish_when_cancelled,
    given,
    new_id,
    plain,
    status_list,
    update_returning,
)
from corral.store.models import SnapshotRow, utcnow
from corral.store.records import UNSET, SnapshotKind, SnapshotRecord, SnapshotStatus, Unset

__all__ = ["SnapshotRepository"]

_HELD: tuple[SnapshotStatus, ...] = ("creating", "ready")
"""Statuses whose files count against the storage limit: an ``error`` snapshot's leftovers are reconciliation's."""


class SnapshotRepository:
    """Snapshots of workspaces, kept after their source workspace is destroyed."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    @finish_when_cancelled
    async def create(
        self,
        *,
        workspace_id: str,
        provider: str,
        base_image: str,
        container_type: str,
        network: str,
        resource_limits: Mapping[str, str],
        name: str | None = None,
        kind: SnapshotKind = "filesystem",
        metadata: Mapping[str, Any] | None = None,
        setup_key: str | None = None,
        id: str | None = None,  # the column's name; keyword-only, so callers shadow nothing
        status: SnapshotStatus = "creating",
    ) -> SnapshotRecord:
        """Insert a snapshot record (``size_bytes`` 0); ``id`` defaults to a new 32-character hex id.

        Args:
            workspace_id: The source workspace.
            provider: The provider that holds the snapshot's files; only it can restore or delete them.
            base_image: The source workspace's image, for restoring where the provider needs it.
            container_type: The source workspace's container type, given to workspaces restored from it.
            network: The source workspace's network mode, given to workspaces restored from it.
            resource_limits: The source workspace's limits, given to workspaces restored from it.
            name: A label chosen by the caller; names need not be unique.
            kind: What the provider is expected to keep; :meth:`update` records what it really kept.
            metadata: Free-form JSON object.
            setup_key: The "set up once, start many" key, for snapshots taken after an agent type's setup.
            id: The snapshot id; also the name the provider stores the files under.
            status: ``creating`` until the provider has written the files.

        Raises:
            InvalidRequestError: A snapshot with this id already exists.
        """
        now = utcnow()
        row = SnapshotRow(
            id=id or new_id(),
            name=name,
            workspace_id=workspace_id,
            provider=provider,
            kind=kind,
            status=status,
            size_bytes=0,
            base_image=base_image,
            container_type=container_type,
            network=network,
            resource_limits=dict(resource_limits),
            metadata_=dict(metadata or {}),
            setup_key=setup_key,
            error=None,
            created_at=now,
            updated_at=now,
        )
        id_taken = f"snapshot id {row.id!r} already exists"
        with database_errors({"snapshots.id": id_taken, "pk_snapshots": id_taken}):
            async with self._sessions.begin() as session:
                session.add(row)
        return SnapshotRecord._from_row(row)

    async def get(self, snapshot_id: str) -> SnapshotRecord | None:
        """The snapshot, or ``None`` if the id is unknown."""
        with database_errors():
            async with self._sessions() as session:
                row = await session.get(SnapshotRow, snapshot_id)
        return None if row is None else SnapshotRecord._from_row(row)

    async def list(
        self,
        *,
        workspace_id: str | None = None,
        name: str | None = None,
        statuses: SnapshotStatus | Collection[SnapshotStatus] | None = None,
        setup_key: str | None = None,
        provider: str | None = None,
    ) -> builtins.list[SnapshotRecord]:
        """Snapshots, newest first; the filters given must all match.

        Args:
            workspace_id: Only snapshots of this source workspace.
            name: Only snapshots with exactly this name.
            statuses: Only these statuses (one or several).
            setup_key: Only snapshots with this "set up once, start many" key.
            provider: Only snapshots this provider holds.
        """
        query = select(SnapshotRow).order_by(SnapshotRow.created_at.desc(), SnapshotRow.id.desc())
        wanted = status_list(statuses)
        if wanted is not None:
            query = query.where(SnapshotRow.status.in_(wanted))
        for column, value in (
            (SnapshotRow.workspace_id, workspace_id),
            (SnapshotRow.name, name),
            (SnapshotRow.setup_key, setup_key),
            (SnapshotRow.provider, provider),
        ):
            if value is not None:
                query = query.where(column == value)
        with database_errors():
            async with self._sessions() as session:
                rows = (await session.scalars(query)).all()
        return [SnapshotRecord._from_row(row) for row in rows]

    @finish_when_cancelled
    async def update(
        self,
        snapshot_id: str,
        *,
        status: SnapshotStatus | Unset = UNSET,
        kind: SnapshotKind | Unset = UNSET,
        size_bytes: int | Unset = UNSET,
        error: str | Unset | None = UNSET,
        metadata: Mapping[str, Any] | Unset = UNSET,
    ) -> SnapshotRecord:
        """Set the given fields, and only those, in one ``UPDATE``; ``updated_at`` is always refreshed.

        Raises:
            SnapshotNotFoundError: No snapshot has this id.
        """
        values = given(
            {
                SnapshotRow.status: status,
                SnapshotRow.kind: kind,
                SnapshotRow.size_bytes: size_bytes,
                SnapshotRow.error: error,
                SnapshotRow.metadata_: plain(metadata),
            },
            updated_at=SnapshotRow.updated_at,
            now=utcnow(),
        )
        with database_errors():
            async with self._sessions.begin() as session:
                row = await update_returning(session, SnapshotRow, SnapshotRow.id == snapshot_id, values)
        if row is None:
            raise SnapshotNotFoundError(f"snapshot {snapshot_id!r} does not exist", details={"id": snapshot_id})
        return SnapshotRecord._from_row(row)

    @finish_when_cancelled
    async def delete(self, snapshot_id: str) -> bool:
        """Remove the record; ``False`` if there was none. Delete the provider's files first."""
        with database_errors():
            async with self._sessions.begin() as session:
                removed = await session.scalar(
                    delete(SnapshotRow).where(SnapshotRow.id == snapshot_id).returning(SnapshotRow.id),
                    execution_options={"synchronize_session": False},
                )
        return removed is not None

    async def total_size(self, *, provider: str | None = None) -> int:
        """Bytes held by snapshots that are ``creating`` or ``ready`` (what counts against the storage limit).

        Args:
            provider: Only snapshots this provider holds.
        """
        query = select(func.coalesce(func.sum(SnapshotRow.size_bytes), 0)).where(SnapshotRow.status.in_(_HELD))
        if provider is not None:
            query = query.where(SnapshotRow.provider == provider)
        with database_errors():
            async with self._sessions() as session:
                total = await session.scalar(query)
        # PostgreSQL sums a bigint into a numeric (a Decimal); the total is whole bytes either way.
        return int(total or 0)

    async def find_setup(self, setup_key: str) -> SnapshotRecord | None:
        """The newest ``ready`` snapshot with this "set up once, start many" key, or ``None``."""
        query = (
            select(SnapshotRow)
            .where(SnapshotRow.setup_key == setup_key, SnapshotRow.status == "ready")
            .order_by(SnapshotRow.created_at.desc(), SnapshotRow.id.desc())
            .limit(1)
        )
        with database_errors():
            async with self._sessions() as session:
                row = await session.scalar(query)
        return None if row is None else SnapshotRecord._from_row(row)
