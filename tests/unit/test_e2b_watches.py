"""envd's watcher registry (:mod:`corral.api.e2b._watches`) over a provider stream the test feeds: events are taken
in order, a slow reader loses the oldest beyond the cap, watchers are per sandbox and end with it, and ids that are
gone answer not_found."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from corral.api.e2b import _watches
from corral.api.e2b._connect import ConnectCode, ConnectError
from corral.api.e2b._watches import WatchRegistry
from corral.errors import WorkspaceFileNotFoundError
from corral.providers.base import DirEvent, DirEventStream, DirWatcher

pytestmark = [pytest.mark.unit]

DEADLINE_S = 5.0


class FeedProvider:
    """A DirWatcher whose streams yield what the test puts in their queues; knows which streams were closed."""

    def __init__(self) -> None:
        self.feeds: list[asyncio.Queue[DirEvent | None]] = []
        self.closed = 0

    async def watch_dir(self, workspace_id: str, path: str, *, recursive: bool = False) -> DirEventStream:
        if path == "/missing":
            raise WorkspaceFileNotFoundError(f"{path}: No such file or directory")
        feed: asyncio.Queue[DirEvent | None] = asyncio.Queue()
        self.feeds.append(feed)
        return self._stream(feed)

    async def _stream(self, feed: asyncio.Queue[DirEvent | None]) -> DirEventStream:
        try:
            while (event := await feed.get()) is not None:
                yield event
        finally:
            self.closed += 1

    def __getattr__(self, name: str) -> Any:  # the rest of WorkspaceCalls is never called here
        raise AttributeError(name)


async def _until(condition: Any) -> None:
    """Yield to the watcher's pump until ``condition`` holds, failing the test past the deadline."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the condition never held"
        await asyncio.sleep(0)  # the pump runs in between


async def test_events_are_taken_in_order_and_only_once() -> None:
    """GetWatcherEvents semantics: each take returns what arrived since the last one, oldest first."""
    provider, registry = FeedProvider(), WatchRegistry()
    assert isinstance(provider, DirWatcher)
    watcher = await registry.open("sb1", provider, "/home/user", recursive=False)
    for name in ("a", "b"):
        provider.feeds[0].put_nowait(DirEvent(name, "create"))
    await _until(lambda: len(watcher.pending) == 2)
    assert [e.name for e in watcher.take()] == ["a", "b"]
    assert watcher.take() == []
    await registry.aclose()
    assert provider.closed == 1


async def test_a_slow_reader_loses_the_oldest_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the cap the queue keeps the newest events and counts what it dropped, so memory stays bounded."""
    monkeypatch.setattr(_watches, "MAX_QUEUED_EVENTS", 3)
    provider, registry = FeedProvider(), WatchRegistry()
    watcher = await registry.open("sb1", provider, "/w", recursive=False)
    for index in range(5):
        provider.feeds[0].put_nowait(DirEvent(f"f{index}", "write"))
    await _until(lambda: provider.feeds[0].empty() and watcher.dropped == 2)
    assert [e.name for e in watcher.take()] == ["f2", "f3", "f4"]
    await registry.aclose()


async def test_watchers_belong_to_their_sandbox_and_end_with_it() -> None:
    """Another sandbox cannot find a watcher; forgetting the sandbox stops its streams and its ids answer not_found."""
    provider, registry = FeedProvider(), WatchRegistry()
    watcher = await registry.open("sb1", provider, "/w", recursive=True)
    other = await registry.open("sb2", provider, "/w", recursive=True)
    with pytest.raises(ConnectError) as info:
        registry.find("sb2", watcher.id)
    assert info.value.code == ConnectCode.NOT_FOUND
    await registry.forget("sb1")
    assert watcher.ended
    assert watcher.error is not None
    assert watcher.error.code == ConnectCode.UNAVAILABLE
    assert provider.closed == 1
    with pytest.raises(ConnectError):
        registry.find("sb1", watcher.id)
    assert registry.find("sb2", other.id) is other
    await registry.remove(other)
    assert provider.closed == 2


async def test_provider_errors_propagate_and_the_count_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing path raises the provider's not-found error; past MAX_WATCHERS a sandbox gets resource_exhausted."""
    monkeypatch.setattr(_watches, "MAX_WATCHERS", 2)
    provider, registry = FeedProvider(), WatchRegistry()
    with pytest.raises(WorkspaceFileNotFoundError):
        await registry.open("sb1", provider, "/missing", recursive=False)
    for _ in range(2):
        await registry.open("sb1", provider, "/w", recursive=False)
    with pytest.raises(ConnectError) as info:
        await registry.open("sb1", provider, "/w", recursive=False)
    assert info.value.code == ConnectCode.RESOURCE_EXHAUSTED
    await registry.aclose()


async def test_an_ended_stream_is_reported_as_an_error() -> None:
    """When the provider's stream ends on its own, the watcher ends with an internal error, as envd's does."""
    provider, registry = FeedProvider(), WatchRegistry()
    watcher = await registry.open("sb1", provider, "/w", recursive=False)
    provider.feeds[0].put_nowait(None)
    await asyncio.wait_for(watcher.wait(DEADLINE_S), DEADLINE_S)
    await _until(lambda: watcher.ended)
    assert watcher.error is not None
    assert watcher.error.code == ConnectCode.INTERNAL
    await registry.aclose()


async def test_long_names_count_against_the_byte_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Events with long names are dropped (oldest first) once their names pass MAX_QUEUED_BYTES, whatever the count."""
    monkeypatch.setattr(_watches, "MAX_QUEUED_BYTES", 250)
    provider, registry = FeedProvider(), WatchRegistry()
    watcher = await registry.open("sb1", provider, "/w", recursive=False)
    for index in range(4):
        provider.feeds[0].put_nowait(DirEvent(f"{index}" * 100, "create"))
    await _until(lambda: provider.feeds[0].empty() and watcher.dropped == 2)
    assert [e.name[0] for e in watcher.take()] == ["2", "3"]
    await registry.aclose()
