"""Watching disk use where the runtime cannot enforce the limit (Docker's local volume driver on ext4/overlay2).

Every ``interval_s`` the watcher asks each ready workspace's provider how much ``/workspace`` holds; past
``warn_ratio`` of the workspace's disk limit it logs a warning and records it on the workspace (once).
"""

from __future__ import annotations

import asyncio
import logging

from corral.errors import CorralError
from corral.orchestrator._periodic import Periodic
from corral.orchestrator.service import WorkspaceService
from corral.values import ResourceLimits, format_size

__all__ = ["DiskWatcher"]

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 30.0


class DiskWatcher:
    """Periodic disk-usage checks with a warning near the limit."""

    def __init__(self, service: WorkspaceService, *, interval_s: float, warn_ratio: float) -> None:
        self.service = service
        self.interval_s = interval_s
        self.warn_ratio = warn_ratio
        self._periodic = Periodic("corral-disk-watcher", interval_s, self.check_all)

    async def check_all(self) -> list[str]:
        """Check every ready workspace now; returns the ids that got a new warning."""
        warned: list[str] = []
        for record in await self.service.store.workspaces.list(status="ready"):
            if record.pool_key is not None:
                continue
            try:
                # Bounded: a stuck workspace (its agent stopped) must not hold up the checks of the others.
                used = await asyncio.wait_for(self.service.disk_usage(record.id), CHECK_TIMEOUT_S)
            except (CorralError, TimeoutError) as exc:
                log.debug("disk check of %s skipped: %s", record.id, exc)
                continue
            except Exception:  # what a workspace answers is not trusted; one bad answer must not end the sweep
                log.exception("disk check of %s failed", record.id)
                continue
            if used is None:
                continue  # its provider enforces the limit (or has none to watch)
            limit = ResourceLimits.parse(record.resource_limits).disk_bytes
            if used < self.warn_ratio * limit:
                continue
            warning = (
                f"disk usage {format_size_approx(used)} is at {used / limit:.0%} of the {format_size(limit)} limit; "
                "this runtime monitors the limit but cannot enforce it"
            )
            if any(w.startswith("disk usage") for w in record.warnings):
                continue
            log.warning("workspace %s: %s", record.id, warning)
            await self.service.add_warnings(record.id, warning)
            warned.append(record.id)
        return warned

    async def start(self) -> None:
        """Check in the background every interval."""
        self._periodic.start()

    async def stop(self) -> None:
        """Stop the background checks (a check in progress finishes first)."""
        await self._periodic.stop()


def format_size_approx(size: int) -> str:
    """``123456789 -> "117.7M"``."""
    for unit, factor in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size >= factor:
            return f"{size / factor:.1f}{unit}"
    return f"{size}B"
