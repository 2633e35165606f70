"""Crash safety: on start, make the records and the runtime agree again.

A server can die anywhere (SIGKILL, power loss) between writing a record and the runtime finishing its work, so at
start-up every configured provider's runtime objects are matched with the records:

* runtime objects with no record, or whose record is destroyed, failed or still ``creating`` (the client never got
  an answer) are destroyed: nothing Corral made is left without a record;
* warm-pool workspaces that are still running are adopted back into their pool if that pool is still configured;
  dead ones, and those of pools no longer configured, are discarded;
* a ``ready`` record whose container is gone but whose volume is left becomes ``stopped``; a ``stopped`` record
  whose container runs again becomes ``ready``;
* records whose runtime objects vanished entirely are marked ``error`` with the reason.

Only objects carrying this installation's owner label are considered (see ``Settings.owner_id``), so servers with
different databases on one Docker engine never touch each other's workspaces.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from corral.errors import CorralError
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import WorkspaceState
from corral.store import WorkspaceRecord

__all__ = ["ReconcileReport", "reconcile"]

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    """What reconciliation changed, for logs and tests."""

    orphans_destroyed: list[str] = field(default_factory=list)
    interrupted_creates: list[str] = field(default_factory=list)
    pool_adopted: list[str] = field(default_factory=list)
    pool_discarded: list[str] = field(default_factory=list)
    marked_stopped: list[str] = field(default_factory=list)
    marked_ready: list[str] = field(default_factory=list)
    marked_vanished: list[str] = field(default_factory=list)
    skipped_providers: dict[str, str] = field(default_factory=dict)


async def reconcile(service: WorkspaceService, *, pool_keys: Collection[str] = ()) -> ReconcileReport:
    """Bring records and runtime into agreement; see the module docstring for the rules.

    ``pool_keys`` are the pools configured now; warm workspaces of any other pool are discarded.
    """
    report = ReconcileReport()
    records = {r.id: r for r in await service.store.workspaces.list(include_destroyed=True)}
    for name in service.providers:
        try:
            runtime_ids = await service.runtime_ids(name)
        except CorralError as exc:
            report.skipped_providers[name] = exc.message
            log.warning("reconcile: skipped provider %s: %s", name, exc.message)
            continue
        for workspace_id in sorted(runtime_ids):
            await _reconcile_runtime_object(service, name, workspace_id, records.get(workspace_id), report)
        for record in records.values():
            if record.provider == name:
                await _reconcile_record(service, record.id, runtime_ids, set(pool_keys), report)
    for record in records.values():
        if record.status == "creating" and record.provider is None and record.id not in report.interrupted_creates:
            report.interrupted_creates.append(record.id)
            await service.mark_error(record.id, INTERRUPTED)
    for field_name, ids in vars(report).items():
        if ids:
            log.info("reconcile: %s: %s", field_name, ids)
    return report


INTERRUPTED = "the server stopped while this workspace was being created"


async def _reconcile_runtime_object(
    service: WorkspaceService, name: str, workspace_id: str, record: WorkspaceRecord | None, report: ReconcileReport
) -> None:
    """Destroy a runtime object unless a live record (or an interrupted pool create, handled later) owns it."""
    if record is not None and record.provider == name and record.status in ("ready", "stopped", "paused"):
        return
    if record is not None and record.status == "creating" and record.provider == name and record.pool_key:
        return
    why = "no record" if record is None else f"record is {record.status}"
    log.warning("reconcile: destroying %s workspace %s (%s)", name, workspace_id, why)
    await service.remove_runtime(name, workspace_id)
    if record is None or record.status == "destroyed":
        report.orphans_destroyed.append(workspace_id)
    elif record.status == "creating":
        report.interrupted_creates.append(workspace_id)
        await service.mark_error(workspace_id, INTERRUPTED)


async def _reconcile_record(
    service: WorkspaceService, workspace_id: str, runtime_ids: set[str], pool_keys: set[str], report: ReconcileReport
) -> None:
    record = await service.get(workspace_id)
    if record.status in ("destroyed", "error") or record.provider is None:
        return
    state = await service.runtime_state(workspace_id) if workspace_id in runtime_ids else WorkspaceState.MISSING
    if record.pool_key is not None:
        if record.status == "ready" and state is WorkspaceState.RUNNING and record.pool_key in pool_keys:
            report.pool_adopted.append(workspace_id)
        else:
            await service.discard(workspace_id)
            report.pool_discarded.append(workspace_id)
        return
    if state is WorkspaceState.MISSING and record.status in ("ready", "stopped", "paused", "creating"):
        await service.mark_error(workspace_id, "its runtime objects vanished while the server was down")
        report.marked_vanished.append(workspace_id)
    elif state is WorkspaceState.STOPPED and record.status in ("ready", "paused"):
        await service.mark_status(workspace_id, "stopped")
        report.marked_stopped.append(workspace_id)
    elif state is WorkspaceState.PAUSED and record.status != "paused":
        await service.mark_status(workspace_id, "paused")
        report.marked_stopped.append(workspace_id)
    elif state is WorkspaceState.RUNNING and record.status in ("stopped", "paused"):
        await service.mark_status(workspace_id, "ready")
        report.marked_ready.append(workspace_id)
    if state is not WorkspaceState.MISSING and "egress" in record.metadata:
        try:
            await service.restore_egress(workspace_id)
        except CorralError as exc:
            # Fail closed: a running workspace whose rules cannot be put back is stopped, not left unrestricted.
            log.warning("reconcile: egress rules of %s could not be restored (%s); stopping it", workspace_id, exc)
            try:
                await service.stop(workspace_id)
            except CorralError as stop_exc:
                log.warning("reconcile: could not stop %s either: %s", workspace_id, stop_exc)
