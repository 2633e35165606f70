"""A background job run every N seconds that stops only *between* runs.

Cancelling a job in the middle of a database call can leave a SQLite connection holding its write lock, so stop()
asks the loop to end and waits for the current run to finish instead of cancelling it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

__all__ = ["Periodic"]

log = logging.getLogger(__name__)


class Periodic:
    """Run ``job`` every ``interval_s`` seconds in the background."""

    def __init__(self, name: str, interval_s: float, job: Callable[[], Awaitable[object]]) -> None:
        self.name = name
        self.interval_s = interval_s
        self._job = job
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True while the background loop is alive."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the loop; the first run comes one interval from now."""
        self._stop.clear()
        self._task = asyncio.create_task(self._loop(), name=self.name)

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)
            if self._stop.is_set():
                return
            try:
                await self._job()
            except Exception:  # one failed run must not end the loop
                log.exception("%s failed", self.name)

    async def stop(self) -> None:
        """End the loop after the run in progress, if any."""
        if self._task is None:
            return
        self._stop.set()
        await self._task
        self._task = None
