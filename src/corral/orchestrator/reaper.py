"""The reaper: destroys workspaces past their lifetime (TTL) or idle for too long. Both are off by default.

Idle time counts from the last exec or file call this server saw, or from creation when there was none.
"""

from __future__ import annotations

import logging
import time

from corral.orchestrator._periodic import Periodic
from corral.orchestrator.service import WorkspaceService

__all__ = ["Reaper"]

log = logging.getLogger(__name__)


class Reaper:
    """Periodic sweep over ready and stopped workspaces."""

    def __init__(self, service: WorkspaceService, *, ttl_s: float, idle_s: float, interval_s: float) -> None:
        self.service = service
        self.ttl_s = ttl_s
        self.idle_s = idle_s
        self.interval_s = interval_s
        self._periodic: Periodic | None = None

    @property
    def enabled(self) -> bool:
        """True when a TTL or an idle timeout is configured."""
        return self.ttl_s > 0 or self.idle_s > 0

    async def sweep(self) -> list[str]:
        """Destroy every expired workspace now; returns their ids."""
        now = time.time()
        reaped = []
        for record in await self.service.list_workspaces():
            if record.status not in ("ready", "stopped", "paused"):
                continue
            created = record.created_at.timestamp()
            used = max(
                self.service.last_used(record.id) or 0.0,
                record.last_used_at.timestamp() if record.last_used_at else 0.0,
                created,
            )
            if self.ttl_s > 0 and now - created > self.ttl_s:
                reason = f"older than the {self.ttl_s:g} s TTL"
            elif self.idle_s > 0 and now - used > self.idle_s:
                reason = f"idle for more than {self.idle_s:g} s"
            else:
                continue
            log.info("reaper: destroying workspace %s (%s)", record.id, reason)
            await self.service.discard(record.id)
            reaped.append(record.id)
        return reaped

    async def start(self) -> None:
        """Sweep in the background when enabled."""
        if self.enabled:
            # Looked up at each run, not bound now, so tests may wrap sweep() after construction.
            self._periodic = Periodic("corral-reaper", self.interval_s, lambda: self.sweep())  # noqa: PLW0108
            self._periodic.start()

    async def stop(self) -> None:
        """Stop sweeping (a sweep in progress finishes first)."""
        if self._periodic is not None:
            await self._periodic.stop()
