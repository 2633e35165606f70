"""Directory watches of envd's filesystem service: ``WatchDir`` (a server stream, the async SDK) and the polled trio
``CreateWatcher`` / ``GetWatcherEvents`` / ``RemoveWatcher`` (the sync SDK).

Both read the provider's :class:`~corral.providers.base.DirWatcher` stream (the guest agent's inotify) through one
:class:`Watcher`: a task pumps events into a queue of at most :data:`MAX_QUEUED_EVENTS` events and
:data:`MAX_QUEUED_BYTES` of names, dropping the oldest when the SDK reads too slowly (logged), so no workspace can
make the server buffer without bound. Watchers belong to their sandbox: a kill or pause ends them (a stream gets an
error, a polled watcher id is gone), as envd's die with the sandbox. A sandbox holds at most :data:`MAX_WATCHERS`
at once.

As envd: event names are relative to the watched directory; a missing path is ``not_found``, a file
``invalid_argument``; ``GetWatcherEvents`` returns what arrived since the last call; a watcher id that is not (or no
longer) there is ``not_found``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import secrets

from corral.api.e2b._connect import ConnectCode, ConnectError
from corral.errors import CorralError
from corral.providers.base import DirEvent, DirEventStream, DirWatcher, WorkspaceCalls

__all__ = ["EVENT_TYPES", "MAX_QUEUED_BYTES", "MAX_QUEUED_EVENTS", "MAX_WATCHERS", "WatchRegistry", "Watcher"]

log = logging.getLogger(__name__)

MAX_QUEUED_EVENTS = 10_000
"""Events a watcher keeps for a reader that has not taken them; past this the oldest are dropped."""
MAX_QUEUED_BYTES = 1024 * 1024
"""The names those events may hold together (the agent is untrusted: long names must not multiply the cap)."""
MAX_WATCHERS = 16
"""Watches (streamed and polled) one sandbox may have at once."""
EVENT_TYPES = {
    "create": "EVENT_TYPE_CREATE",
    "write": "EVENT_TYPE_WRITE",
    "remove": "EVENT_TYPE_REMOVE",
    "rename": "EVENT_TYPE_RENAME",
    "chmod": "EVENT_TYPE_CHMOD",
}
"""Corral's event types by envd's enum names (the Connect JSON encoding)."""
_GONE = "the sandbox was killed or paused; its watchers ended with it"


class Watcher:
    """One directory watch: its root, its pending events, and the error that ended it, if any."""

    def __init__(self, sandbox_id: str, watcher_id: str, root: str, events: DirEventStream) -> None:
        self.sandbox_id = sandbox_id
        self.id = watcher_id
        self.root = root
        self.pending: collections.deque[DirEvent] = collections.deque()
        self._bytes = 0  # the length of the pending events' names
        self.dropped = 0
        self.error: ConnectError | None = None
        self.ended = False
        self.include_entry = False
        """Events carry the entry's info (``include_entry`` of the request)."""
        self._changed = asyncio.Event()
        self._events = events
        self._task = asyncio.create_task(self._pump(), name=f"e2b-watch-{watcher_id}")

    async def _pump(self) -> None:
        try:
            async for event in self._events:
                self.pending.append(event)
                self._bytes += len(event.name)
                while len(self.pending) > MAX_QUEUED_EVENTS or self._bytes > MAX_QUEUED_BYTES:
                    self._bytes -= len(self.pending.popleft().name)
                    self.dropped += 1
                    if self.dropped == 1 or self.dropped % 1000 == 0:
                        log.warning(
                            "watcher %s of %s: reader too slow, %d dropped", self.id, self.sandbox_id, self.dropped
                        )
                self._changed.set()
            self.error = ConnectError(ConnectCode.INTERNAL, "watcher event channel closed")
        except CorralError as exc:
            self.error = ConnectError(ConnectCode.INTERNAL, f"watcher error: {exc.message}")
        except Exception as exc:  # whatever the agent's frames make of the stream, only this watch ends
            log.warning("watcher %s of %s ended: %s", self.id, self.sandbox_id, exc)
            self.error = ConnectError(ConnectCode.INTERNAL, "watcher error: the workspace sent a bad event")
        finally:
            self.ended = True
            self._changed.set()
            with contextlib.suppress(Exception):
                await self._events.aclose()

    def take(self) -> list[DirEvent]:
        """Every event since the last take (oldest first)."""
        events = list(self.pending)
        self.pending.clear()
        self._bytes = 0
        self._changed.clear()
        return events

    async def wait(self, timeout: float) -> None:
        """Until an event arrives, the watch ends, or ``timeout`` seconds pass."""
        if self.pending or self.ended:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    async def close(self, error: ConnectError | None = None) -> None:
        """Stop the watch (the agent's inotify with it); a reader still waiting sees ``error``."""
        if error is not None and self.error is None:
            self.error = error
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # closing must never fail a kill or a pause
            await self._task
        self.ended = True
        self._changed.set()


class WatchRegistry:
    """The watchers of every sandbox, by sandbox and watcher id."""

    def __init__(self) -> None:
        self._watchers: dict[tuple[str, str], Watcher] = {}
        self._serial = itertools.count(1)

    async def open(self, sandbox_id: str, provider: WorkspaceCalls, path: str, *, recursive: bool) -> Watcher:
        """Start watching ``path`` in the sandbox; the provider's errors (missing path, a file) propagate."""
        if not isinstance(provider, DirWatcher):
            raise ConnectError(ConnectCode.UNIMPLEMENTED, "this Corral provider cannot watch directories")
        if sum(1 for sid, _ in self._watchers if sid == sandbox_id) >= MAX_WATCHERS:
            message = f"the sandbox has {MAX_WATCHERS} directory watchers, the most it may have; remove one first"
            raise ConnectError(ConnectCode.RESOURCE_EXHAUSTED, message)
        events = await provider.watch_dir(sandbox_id, path, recursive=recursive)
        watcher_id = f"w{next(self._serial)}{secrets.token_hex(6)}"
        watcher = Watcher(sandbox_id, watcher_id, path, events)
        self._watchers[sandbox_id, watcher_id] = watcher
        return watcher

    def find(self, sandbox_id: str, watcher_id: object) -> Watcher:
        """The sandbox's watcher with this id; ``not_found`` as envd when there is none."""
        watcher = self._watchers.get((sandbox_id, str(watcher_id)))
        if watcher is None:
            raise ConnectError(ConnectCode.NOT_FOUND, f"watcher with id {watcher_id} not found")
        return watcher

    async def remove(self, watcher: Watcher) -> None:
        """Stop and forget one watcher."""
        self._watchers.pop((watcher.sandbox_id, watcher.id), None)
        await watcher.close()

    async def forget(self, sandbox_id: str) -> None:
        """End every watcher of a sandbox that is killed or paused."""
        ending = [w for (sid, _), w in list(self._watchers.items()) if sid == sandbox_id]
        for watcher in ending:
            self._watchers.pop((sandbox_id, watcher.id), None)
        await asyncio.gather(*(w.close(ConnectError(ConnectCode.UNAVAILABLE, _GONE)) for w in ending))

    async def aclose(self) -> None:
        """End every watcher (server shutdown)."""
        watchers = list(self._watchers.values())
        self._watchers.clear()
        await asyncio.gather(
            *(w.close(ConnectError(ConnectCode.UNAVAILABLE, "the server is shutting down")) for w in watchers)
        )
