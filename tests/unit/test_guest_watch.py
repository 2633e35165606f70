"""The agent's ``watch`` operation, with the agent run on the host: inotify events arrive with names relative to the
watched directory, recursion follows new directories, kill stops the watch, and a slow reader loses the oldest events
(counted) instead of growing anyone's memory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path

import pytest

import corral.guest.agent as agent_module
from corral.errors import FileOperationError, WorkspaceFileNotFoundError
from corral.guest.agent import DirWatch
from corral.guest.client import GuestConnection, GuestProtocolError, WatchBatch, _watch_batch
from corral.providers.agent_backed import file_info_from_json

pytestmark = [pytest.mark.unit]

DEADLINE_S = 10.0


@pytest.fixture
async def conn() -> AsyncIterator[GuestConnection]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, agent_module.__file__, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    connection = GuestConnection(proc.stdout, proc.stdin, label="host agent")
    await connection.wait_ready(DEADLINE_S)
    try:
        yield connection
    finally:
        await connection.aclose()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def _collect_until(
    batches: AsyncGenerator[WatchBatch], done: Callable[[list[tuple[str, str]]], bool]
) -> list[tuple[str, str]]:
    """Events of ``batches`` until ``done`` says they are enough (or the deadline fails the test)."""
    seen: list[tuple[str, str]] = []

    async def read() -> None:
        async for events, _ in batches:
            seen.extend(events)
            if done(seen):
                return

    await asyncio.wait_for(read(), DEADLINE_S)
    return seen


async def test_watch_reports_create_write_chmod_rename_remove(conn: GuestConnection, tmp_path: Path) -> None:
    """Each kind of change in the watched directory arrives with the entry's name and envd's event type."""
    batches = await conn.open_watch(str(tmp_path), recursive=False)
    try:
        target = tmp_path / "a.txt"
        target.write_text("hello")
        os.chmod(target, 0o600)
        target.rename(tmp_path / "b.txt")
        (tmp_path / "b.txt").unlink()
        seen = await _collect_until(batches, lambda s: ("b.txt", "remove") in s)
    finally:
        await batches.aclose()
    for expected in [("a.txt", "create"), ("a.txt", "write"), ("a.txt", "chmod"), ("a.txt", "rename"),
                     ("b.txt", "create"), ("b.txt", "remove")]:  # fmt: skip
        assert expected in seen
    assert seen.index(("a.txt", "create")) < seen.index(("a.txt", "rename")) < seen.index(("b.txt", "remove"))


async def test_recursive_watch_sees_files_in_new_subdirectories(conn: GuestConnection, tmp_path: Path) -> None:
    """A recursive watch reports a file created in a directory made after the watch began, by its relative path."""
    (tmp_path / "old").mkdir()
    batches = await conn.open_watch(str(tmp_path), recursive=True)
    try:
        (tmp_path / "old" / "x").write_text("1")
        (tmp_path / "new" / "deep").mkdir(parents=True)
        (tmp_path / "new" / "deep" / "f.txt").write_text("2")
        seen = await _collect_until(batches, lambda s: ("new/deep/f.txt", "create") in s)
    finally:
        await batches.aclose()
    assert ("old/x", "create") in seen
    assert ("new", "create") in seen


async def test_plain_watch_ignores_subdirectories(conn: GuestConnection, tmp_path: Path) -> None:
    """A non-recursive watch reports a new subdirectory but nothing that happens inside it."""
    batches = await conn.open_watch(str(tmp_path), recursive=False)
    try:
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "inner.txt").write_text("x")
        (tmp_path / "marker").write_text("m")
        seen = await _collect_until(batches, lambda s: ("marker", "create") in s)
    finally:
        await batches.aclose()
    assert ("sub", "create") in seen
    assert not [name for name, _ in seen if name.startswith("sub/")]


async def test_watch_errors_name_the_path(conn: GuestConnection, tmp_path: Path) -> None:
    """A missing path raises not found and a file raises not_a_directory, before any stream begins."""
    with pytest.raises(WorkspaceFileNotFoundError):
        await conn.open_watch(str(tmp_path / "missing"), recursive=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileOperationError) as info:
        await conn.open_watch(str(tmp_path / "file"), recursive=False)
    assert info.value.details["kind"] == "not_a_directory"


async def test_closing_the_watch_stops_it_and_the_agent_keeps_serving(conn: GuestConnection, tmp_path: Path) -> None:
    """Closing the stream kills the agent's watch (its window is gone) and later requests still work."""
    batches = await conn.open_watch(str(tmp_path), recursive=False)
    (tmp_path / "one").write_text("1")
    await _collect_until(batches, lambda s: ("one", "create") in s)
    await batches.aclose()
    (tmp_path / "two").write_text("2")  # a frame for the killed watch would break the connection
    assert (await conn.call("stat", path=str(tmp_path / "two"), timeout=DEADLINE_S))["type"] == "file"
    assert (await conn.call("ping", timeout=DEADLINE_S))["pid"] > 0
    assert not conn.closed


def test_pending_events_are_capped_dropping_the_oldest(tmp_path: Path) -> None:
    """Past its cap a watch keeps the newest events and counts the dropped ones in its next batch."""
    with DirWatch(str(tmp_path), recursive=False) as watch:
        cap = watch.pending.maxlen
        assert cap is not None
        for index in range(cap + 10):
            watch._push(f"f{index}", "create")
        assert len(watch.pending) == cap
        assert watch.pending[0] == ("f10", "create")
        payload = watch.take(64 * 1024)
    assert b'"dropped":10' in payload
    assert len(payload) <= 64 * 1024


@pytest.mark.parametrize(
    "payload",
    [
        b'{"events": [], "dropped": Infinity}',
        b'{"events": [], "dropped": 1e309}',
        b'{"events": [], "dropped": "3"}',
        b"[" * 100_000,
        b'{"events": [["a", "create"]], "dropped": NaN}',
    ],
)
def test_a_hostile_watch_frame_is_a_protocol_error_and_nothing_else(payload: bytes) -> None:
    """Frames a hostile agent can send (non-finite or non-integer counts, nesting deep enough for RecursionError)
    raise GuestProtocolError, which ends that watch only; OverflowError and RecursionError used to escape and fail
    the sandbox's next kill or pause."""
    with pytest.raises(GuestProtocolError):
        _watch_batch(payload)


@pytest.mark.parametrize("field", ["size", "mode", "mtime"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e300, -1, "7", True])
def test_a_hostile_file_entry_is_refused(field: str, value: object) -> None:
    """Non-finite, huge, negative or non-numeric sizes, modes and times from the agent are refused as bad entries
    (ValueError, which the provider turns into a protocol error), never an OverflowError deeper in."""
    raw: dict[str, object] = {"path": "/a", "name": "a", "type": "file", "size": 1, "mode": 0o644, "mtime": 1.5}
    raw[field] = value
    if field == "mtime" and value == -1:
        assert file_info_from_json(raw).mtime == -1.0  # before 1970 is a time
        return
    with pytest.raises(ValueError, match="expected a"):
        file_info_from_json(raw)
