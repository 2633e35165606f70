"""The reaper: ends what has outlived its time, in one periodic sweep.

* TTL (CORRAL_WORKSPACE_TTL_S, off by default): a workspace older than it is destroyed, however busy.
* Idle timeout (CORRAL_IDLE_TIMEOUT_S, one hour by default): an active session with no tool call for that long is
  ended, which destroys its workspace as ending it by hand does; a ready workspace of no session with no exec or
  file call for that long is stopped (its disk is kept, resume brings it back). Warm workspaces and E2B sandboxes
  (which keep E2B's own timeout) are left alone.
* Failed creates (CORRAL_FAILED_RECORD_TTL_S, one hour by default): the ``error`` record a create kept with
  ``?keep_failed=true`` is deleted that long after it failed.

Idle time counts from the last exec or file call this server saw (a session's tool calls run in its workspace, so
they count), or from creation, or from this server's start, whichever came last. The API shows when each workspace
and session expires (``expires_at``), so people are warned before it strikes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from corral.errors import CorralError
from corral.orchestrator._periodic import Periodic
from corral.orchestrator.service import WorkspaceService
from corral.store import SessionRecord

__all__ = ["Reaper", "SessionEnder"]

log = logging.getLogger(__name__)


class SessionEnder(Protocol):
    """What the reaper needs of the agent layer (:class:`corral.agents.sessions.AgentService`)."""

    async def list_sessions(self, status: str | None = None) -> list[SessionRecord]:
        """Sessions in ``status``."""
        ...

    async def end(self, session_id: str) -> SessionRecord:
        """End the session and destroy its workspace."""
        ...


class Reaper:
    """Periodic sweep over workspaces, sessions and kept failed creates."""

    def __init__(
        self,
        service: WorkspaceService,
        *,
        ttl_s: float,
        idle_s: float,
        interval_s: float,
        failed_ttl_s: float = 0.0,
        sessions: SessionEnder | None = None,
    ) -> None:
        self.service = service
        self.ttl_s = ttl_s
        self.idle_s = idle_s
        self.interval_s = interval_s
        self.failed_ttl_s = failed_ttl_s
        self.sessions = sessions
        """Set once the agent layer exists (it is built after the reaper); without it idle sessions are not ended."""
        self._periodic: Periodic | None = None

    @property
    def enabled(self) -> bool:
        """True when a TTL, an idle timeout or a failed-record TTL is configured."""
        return self.ttl_s > 0 or self.idle_s > 0 or self.failed_ttl_s > 0

    async def sweep(self) -> list[str]:
        """Do every expired thing's end now; returns the ids of the workspaces and sessions it ended."""
        done = await self._sweep_failed()
        if self.idle_s > 0 and self.sessions is not None:
            done += await self._sweep_sessions(self.sessions)
        done += await self._sweep_workspaces()
        return done

    async def _sweep_workspaces(self) -> list[str]:
        now = time.time()
        reaped = []
        for record in await self.service.list_workspaces():
            if record.status not in ("ready", "stopped", "paused"):
                continue
            created = record.created_at.timestamp()
            action: Callable[[str], Awaitable[object]]
            if self.ttl_s > 0 and now - created > self.ttl_s:
                reason, action = f"older than the {self.ttl_s:g} s TTL", self.service.discard
            elif (
                self.idle_s > 0
                and record.status == "ready"
                # A session's workspace ends with its session (swept above), not on its own.
                and (self.sessions is None or "session_id" not in record.metadata)
                and self.service.idle_timeout_of(record) is not None
                and now - self.service.last_activity(record.id, record.created_at, record.last_used_at) > self.idle_s
            ):
                reason, action = f"idle for more than {self.idle_s:g} s; stopped, resume brings it back", self._stop
            else:
                continue
            log.info("reaper: workspace %s: %s", record.id, reason)
            try:
                await action(record.id)
            except CorralError as exc:  # one workspace that cannot be ended must not stop the sweep
                log.warning("reaper: workspace %s: %s", record.id, exc.message)
                continue
            reaped.append(record.id)
        return reaped

    async def _stop(self, workspace_id: str) -> None:
        await self.service.stop(workspace_id)

    async def _sweep_sessions(self, sessions: SessionEnder) -> list[str]:
        now = time.time()
        ended = []
        for session in await sessions.list_sessions("active"):
            used = self.service.last_activity(session.workspace_id, session.created_at, session.updated_at)
            if now - used <= self.idle_s:
                continue
            log.info("reaper: session %s: no tool call for more than %g s; ending it", session.id, self.idle_s)
            try:
                await sessions.end(session.id)
            except CorralError as exc:
                log.warning("reaper: session %s: %s", session.id, exc.message)
                continue
            ended.append(session.id)
        return ended

    async def _sweep_failed(self) -> list[str]:
        """Delete kept records of failed creates (``error`` with no provider: none ever ran) past their TTL.

        A workspace that broke after it was created (``error`` with a provider) is not a failed create: it stays,
        for a resume to restart or a person to destroy.
        """
        if self.failed_ttl_s <= 0:
            return []
        now = time.time()
        deleted = []
        for record in await self.service.store.workspaces.list(status="error"):
            if record.provider is not None or now - record.updated_at.timestamp() <= self.failed_ttl_s:
                continue
            log.info("reaper: deleting the record of failed create %s (%s)", record.id, record.error)
            await self.service.store.workspaces.delete(record.id)
            deleted.append(record.id)
        return deleted

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
