"""Snapshots and forks: the only writer of snapshot records.

A snapshot's record is written (``creating``) before the provider writes a byte and removed after its files are
gone, so a crash at any point leaves something :func:`reconcile_snapshots` can match: host objects without a record
are deleted, records still ``creating`` at start are failed and their leftovers deleted, ``ready`` records whose
host objects vanished are marked ``error``, and what an ``error`` snapshot left on the host (its cleanup failed) is
deleted.

Every snapshot counts against ``CORRAL_SNAPSHOT_STORAGE_LIMIT`` on its host: a new one is refused once the total is
at the limit, and one that takes the total past it is removed again with an error naming both numbers.

A fork is a snapshot restored N times: the snapshot is taken once (the source is held only for its checkpoint),
the forks are restored from it concurrently, and the snapshot is deleted afterwards (restored workspaces keep what
they need). The runtime calls go through :class:`~corral.orchestrator.service.WorkspaceService`, which owns
workspace records.

Setup pools ("set up once, start many", served warm): the newest ready setup snapshot of each agent type (a
snapshot with a ``setup_key``; ``metadata.agent_type_id`` names the type) gets a warm pool of ``setup_pool_size``
workspaces restored from it ahead of time (:meth:`SnapshotService.sync_setup_pools`). A newer setup snapshot of the
same type (a new commit, a changed config) supersedes it: the old pool is drained. Deleting a snapshot drains its pool
before its files go. One pool per agent type keeps the number of warm workspaces bounded however many branches a
type's sessions check out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corral.egress import EgressPolicy
from corral.errors import (
    CorralError,
    InvalidRequestError,
    ResourceLimitError,
    SnapshotNotFoundError,
    WorkspaceStateError,
)
from corral.orchestrator.pool import PoolSpec, grown, snapshot_pool_key
from corral.orchestrator.service import EGRESS_KEY, CreateWorkspace, WorkspaceService
from corral.store import SnapshotRecord, Store, WorkspaceRecord
from corral.values import ResourceLimits

__all__ = ["MAX_FORKS", "SETUP_OWNER", "SnapshotReconcileReport", "SnapshotService", "reconcile_snapshots"]

log = logging.getLogger(__name__)

MAX_FORKS = 16
"""The most workspaces one fork call makes."""
RESTORE_CONCURRENCY = 4
"""Restores run at once during a fork: each is mostly copying and a gVisor restore, bounded by the host."""
SETUP_OWNER = "agent_type_id"
"""The metadata key of a setup snapshot naming its agent type: of one type's setup snapshots only the newest has a
pool."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class SnapshotService:
    """Create, list, delete and restore snapshots; fork workspaces."""

    def __init__(
        self, workspaces: WorkspaceService, store: Store, *, storage_limit: int, setup_pool_size: int = 0
    ) -> None:
        """``setup_pool_size`` warm workspaces are kept restored from each agent type's newest setup snapshot
        (CORRAL_SETUP_POOL_SIZE); 0, or a workspace service without warm pools, keeps none."""
        self.workspaces = workspaces
        self.store = store
        self.storage_limit = storage_limit
        self.setup_pool_size = setup_pool_size
        self._setup_pools = asyncio.Lock()  # one change of the set of setup pools at a time

    async def create(
        self,
        workspace_id: str,
        *,
        name: str | None = None,
        setup_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SnapshotRecord:
        """Snapshot a ready workspace: its files, and its processes and memory where its provider can.

        Raises:
            InvalidRequestError: a bad name, or a provider without snapshots.
            WorkspaceStateError: the workspace is not ready.
            ResourceLimitError: the snapshot storage limit is reached (or this snapshot passed it).
        """
        if name is not None and not _NAME.fullmatch(name):
            raise InvalidRequestError(
                f"name: {name!r} is not allowed; use 1-128 letters, digits, '.', '_' or '-', starting with a letter "
                "or digit",
                details={"field": "name"},
            )
        _, source = await self.workspaces.snapshotter(workspace_id)
        used = await self.store.snapshots.total_size(provider=source.provider)
        # Checked before anything is written: a workspace can make its disk look small and commit big (sparse files).
        estimate = await self.workspaces.snapshot_estimate(workspace_id)
        if used + estimate > self.storage_limit or used >= self.storage_limit:
            raise ResourceLimitError(
                f"snapshot storage is full: snapshots on {source.provider} hold {_human(used)} and this one "
                f"would add about {_human(estimate)}, past the {_human(self.storage_limit)} limit "
                "(CORRAL_SNAPSHOT_STORAGE_LIMIT); delete some first",
                details={"used_bytes": used, "estimate_bytes": estimate, "limit_bytes": self.storage_limit},
            )
        record = await self.store.snapshots.create(
            id=uuid.uuid4().hex[:16],
            workspace_id=workspace_id,
            provider=source.provider or "",
            base_image=source.base_image,
            container_type=source.container_type,
            network=source.network,
            resource_limits=source.resource_limits,
            name=name,
            metadata=metadata,
            setup_key=setup_key,
        )
        try:
            info = await self.workspaces.take_snapshot(workspace_id, record.id)
        except BaseException as exc:
            reason = exc.message if isinstance(exc, CorralError) else f"interrupted ({type(exc).__name__})"
            with contextlib.suppress(Exception):
                await asyncio.shield(self._fail(record, reason))
            raise
        record = await self.store.snapshots.update(
            record.id, status="ready", kind=info.kind, size_bytes=info.size_bytes
        )
        total = await self.store.snapshots.total_size(provider=record.provider)
        if total > self.storage_limit:
            await self.delete(record.id)
            raise ResourceLimitError(
                f"snapshot storage limit passed: this snapshot holds {_human(info.size_bytes)}, which takes "
                f"the snapshots on {record.provider} to {_human(total)} of the {_human(self.storage_limit)} "
                "limit (CORRAL_SNAPSHOT_STORAGE_LIMIT); it was removed",
                details={"size_bytes": info.size_bytes, "used_bytes": total, "limit_bytes": self.storage_limit},
            )
        if setup_key is not None:
            await self._sync_quietly()
        return record

    async def _fail(self, record: SnapshotRecord, reason: str) -> None:
        """Remove what the provider wrote, then say why in the record (kept so the client can see it)."""
        try:
            await self.workspaces.remove_snapshot(record.provider, record.id)
        except CorralError as exc:
            log.warning("snapshot %s: could not remove its files: %s", record.id, exc.message)
        await self.store.snapshots.update(record.id, status="error", error=reason)

    async def get(self, snapshot_id: str) -> SnapshotRecord:
        """The record.

        Raises:
            SnapshotNotFoundError: no snapshot with that id.
        """
        record = await self.store.snapshots.get(snapshot_id)
        if record is None:
            raise SnapshotNotFoundError(f"snapshot {snapshot_id!r} does not exist", details={"id": snapshot_id})
        return record

    async def find(self, *, workspace_id: str | None = None, name: str | None = None) -> list[SnapshotRecord]:
        """Snapshots, newest first, optionally of one workspace or with one name."""
        return await self.store.snapshots.list(workspace_id=workspace_id, name=name)

    async def delete(self, snapshot_id: str) -> None:
        """Remove the snapshot's files, then its record. Workspaces restored from it are not affected.

        Raises:
            SnapshotNotFoundError: no snapshot with that id.
        """
        record = await self.get(snapshot_id)
        async with self._setup_pools:  # no pool may be (re)made for it while its files go
            if self.workspaces.pools is not None:
                await self.workspaces.pools.remove(snapshot_pool_key(record.id))
            await self.workspaces.remove_snapshot(record.provider, record.id)
            await self.store.snapshots.delete(record.id)
        if record.setup_key is not None:
            await self._sync_quietly()  # the type's previous setup snapshot, if ready, is its newest now

    async def restore(self, snapshot_id: str, *, metadata: Mapping[str, Any] | None = None) -> WorkspaceRecord:
        """A new ready workspace from a ready snapshot: its files, and its processes and memory when it has them.

        Raises:
            SnapshotNotFoundError: no snapshot with that id.
            WorkspaceStateError: the snapshot is not ready (still being taken, or failed).
        """
        record = await self.get(snapshot_id)
        if record.status != "ready":
            raise WorkspaceStateError(
                f"snapshot {snapshot_id} is {record.status}{': ' + record.error if record.error else ''}; only a "
                "ready snapshot can be restored",
                details={"id": snapshot_id, "status": record.status},
            )
        return await self.workspaces.restore(
            record.provider,
            record.id,
            source=CreateWorkspace(
                provider=record.provider,
                container_type=record.container_type,
                limits=ResourceLimits.parse(record.resource_limits),
                base_image=record.base_image,
                network=record.network,
            ),
            metadata={**(metadata or {}), "from_snapshot": record.id},
        )

    async def restore_warm(self, snapshot_id: str, *, metadata: Mapping[str, Any]) -> WorkspaceRecord | None:
        """A workspace restored from the snapshot ahead of time, out of its setup pool, or None when the pool is
        empty or the snapshot has none (restore it on demand then)."""
        return await self.workspaces.restore_if_warm(snapshot_id, {**metadata, "from_snapshot": snapshot_id})

    async def sync_setup_pools(self) -> None:
        """Make the setup pools match the snapshots: one pool for each agent type's newest ready setup snapshot
        (restorable here, of an agent workspace), and none for any other snapshot (superseded, failed, deleted).

        Call at start-up before reconciliation (so the pools' warm workspaces are adopted back) and again after
        snapshot reconciliation (a snapshot whose files vanished loses its pool); creating and deleting setup
        snapshots calls it too.
        """
        pools = self.workspaces.pools
        if pools is None:
            return
        async with self._setup_pools:
            wanted = await self._wanted_setup_pools()
            for spec in wanted:
                if pools.add(spec):
                    log.info("setup pool for snapshot %s: %d warm workspace(s)", spec.snapshot_id, spec.size)
            keep = {spec.key for spec in wanted}
            for spec in pools.specs:
                if spec.snapshot_id is not None and spec.key not in keep:
                    await pools.remove(spec.key)

    async def _wanted_setup_pools(self) -> list[PoolSpec]:
        if self.setup_pool_size <= 0:
            return []
        newest: dict[str, SnapshotRecord] = {}
        for record in await self.store.snapshots.list(statuses="ready"):  # newest first
            if record.setup_key is None or record.container_type != "agent_workspace":
                continue  # pools hold agent workspaces only; an MCP server's setup snapshot is restored on demand
            if record.provider not in self.workspaces.providers:
                continue
            owner = record.metadata.get(SETUP_OWNER)
            newest.setdefault(owner if isinstance(owner, str) else f"key:{record.setup_key}", record)
        return [
            PoolSpec(
                provider=record.provider,
                image=record.base_image,
                limits=ResourceLimits.parse(record.resource_limits),
                network=record.network,
                size=self.setup_pool_size,
                snapshot_id=record.id,
                max_size=grown(self.workspaces.settings, self.setup_pool_size),
            )
            for record in newest.values()
        ]

    async def _sync_quietly(self) -> None:
        """:meth:`sync_setup_pools`, where a failure must not fail the snapshot call that made it necessary."""
        try:
            await self.sync_setup_pools()
        except CorralError as exc:
            log.warning("setup pools not updated: %s", exc.message)

    async def fork(self, workspace_id: str, count: int) -> list[WorkspaceRecord]:
        """``count`` new workspaces, each with the source's files and running processes; the source carries on.

        Raises:
            InvalidRequestError: ``count`` outside 1..MAX_FORKS, or a provider without snapshots.
            WorkspaceStateError: the source is not ready.
        """
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            raise InvalidRequestError(
                f"count: {count!r} is not allowed; fork makes 1 to {MAX_FORKS} workspaces at a time",
                details={"field": "count"},
            )
        source = await self.workspaces.get(workspace_id)
        egress = source.metadata.get(EGRESS_KEY)
        snapshot = await self.create(workspace_id, metadata={"fork_of": workspace_id})
        slots = asyncio.Semaphore(RESTORE_CONCURRENCY)

        async def one() -> WorkspaceRecord:
            async with slots:
                record = await self.restore(snapshot.id, metadata={"forked_from": workspace_id})
                if isinstance(egress, dict):
                    # A fork is a copy of the running workspace: its egress rules too (a networked fork starts
                    # cold, so nothing of the source's runs before they are in force).
                    try:
                        record = await self.workspaces.set_egress(record.id, EgressPolicy.from_json(egress))
                    except BaseException:
                        with contextlib.suppress(Exception):
                            await asyncio.shield(self.workspaces.destroy(record.id))
                        raise
                return record

        try:
            results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
        finally:
            with contextlib.suppress(CorralError):
                await asyncio.shield(self.delete(snapshot.id))
        made = [r for r in results if isinstance(r, WorkspaceRecord)]
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            for record in made:  # all or nothing: half a fork is a surprise
                with contextlib.suppress(CorralError):
                    await self.workspaces.destroy(record.id)
            raise failures[0]
        return made


@dataclass
class SnapshotReconcileReport:
    """What snapshot reconciliation changed."""

    orphans_deleted: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    leftovers_deleted: list[str] = field(default_factory=list)


async def reconcile_snapshots(workspaces: WorkspaceService, store: Store) -> SnapshotReconcileReport:
    """Make snapshot records and host objects agree again after a restart (see the module docstring)."""
    report = SnapshotReconcileReport()
    held = await workspaces.runtime_snapshot_ids()
    records = {r.id: r for r in await store.snapshots.list()}
    for provider, ids in held.items():
        for snapshot_id in sorted(ids):
            record = records.get(snapshot_id)
            if record is None or record.provider != provider:
                log.warning("reconcile: deleting %s snapshot %s (no record)", provider, snapshot_id)
                await workspaces.remove_snapshot(provider, snapshot_id)
                report.orphans_deleted.append(snapshot_id)
    for record in records.values():
        if record.provider not in held:
            continue  # the provider is not configured here, or could not be asked: leave its records alone
        if record.status == "creating":
            await workspaces.remove_snapshot(record.provider, record.id)
            await store.snapshots.update(
                record.id, status="error", error="the server stopped while this snapshot was being taken"
            )
            report.interrupted.append(record.id)
        elif record.status == "ready" and record.id not in held[record.provider]:
            await store.snapshots.update(record.id, status="error", error="its files vanished from the host")
            report.vanished.append(record.id)
        elif record.status == "error" and record.id in held[record.provider]:
            await workspaces.remove_snapshot(record.provider, record.id)  # what _fail could not remove
            report.leftovers_deleted.append(record.id)
    for field_name, ids in vars(report).items():
        if ids:
            log.info("reconcile snapshots: %s: %s", field_name, ids)
    return report


def _human(size: int) -> str:
    """A byte count for people: ``1288490188 -> "1.2 GiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
