"""The health monitor: checks every configured provider on an interval and caches the answers.

Selection reads the cache (never waits for a check); a provider that fails its check leaves the auto pool with a
logged warning and returns when a later check passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import UTC, datetime

from corral.orchestrator._periodic import Periodic
from corral.providers.base import Health, WorkspaceProvider

__all__ = ["HealthMonitor"]

log = logging.getLogger(__name__)
CHECK_TIMEOUT_S = 10.0


class HealthMonitor:
    """Periodic, concurrent health checks with a cache of the latest result per provider."""

    def __init__(self, providers: Mapping[str, WorkspaceProvider], interval_s: float) -> None:
        self._providers = providers
        self.interval_s = interval_s
        self._latest: dict[str, Health] = {}
        self._periodic = Periodic("corral-health-monitor", interval_s, self.check_all)

    def latest(self, name: str) -> Health | None:
        """The cached result for one provider, or None before its first check."""
        return self._latest.get(name)

    def healthy(self) -> list[str]:
        """Names of providers whose latest check passed."""
        return [name for name, h in self._latest.items() if h.healthy]

    async def check_all(self) -> dict[str, Health]:
        """Check every provider now, concurrently; update the cache and log transitions."""
        names = list(self._providers)
        results = await asyncio.gather(*(self._check(n) for n in names))
        for name, health in zip(names, results, strict=True):
            before = self._latest.get(name)
            if not health.healthy and (before is None or before.healthy):
                log.warning("provider %s is unhealthy and leaves auto selection: %s", name, health.error)
            elif health.healthy and before is not None and not before.healthy:
                log.info("provider %s is healthy again and rejoins auto selection", name)
            self._latest[name] = health
        return dict(self._latest)

    async def _check(self, name: str) -> Health:
        try:
            return await asyncio.wait_for(self._providers[name].health(), CHECK_TIMEOUT_S)
        except TimeoutError:
            return Health(False, f"health check did not answer within {CHECK_TIMEOUT_S:g} s")
        except Exception as exc:  # a buggy provider must not stop the monitor
            return Health(False, f"health check raised {type(exc).__name__}: {exc}", checked_at=datetime.now(UTC))

    def mark_unhealthy(self, name: str, error: str) -> None:
        """Record a failure seen outside a check (a create that failed for a provider-wide reason)."""
        self._latest[name] = Health(False, error)

    async def start(self) -> None:
        """Run a first check now, then keep checking in the background."""
        await self.check_all()
        self._periodic.start()

    async def stop(self) -> None:
        """Stop the background checks."""
        await self._periodic.stop()
