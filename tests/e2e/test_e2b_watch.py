"""Directory watches through the unmodified E2B SDK against a real Corral server on gVisor: the sync SDK's polled
watcher and the async SDK's ``WatchDir`` stream, as a user's script drives them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, serving_e2b
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Corral server on gVisor for the module; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-watch") as server:
        yield server


def test_sync_watch_dir_events_recursion_stop_and_missing_path(e2b_server: Server, tmp_path: Path) -> None:
    """The sync SDK's watch_dir reports create, write, chmod, rename and remove by name; recursive sees a file in a
    new subdirectory and a plain watch does not; stop ends the watcher; a missing path raises NotFoundException."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json, time
        from e2b import Sandbox, NotFoundException, SandboxException

        def until(handle, want):
            seen, deadline = [], time.monotonic() + 20
            while time.monotonic() < deadline:
                seen += [(e.name, e.type.value) for e in handle.get_new_events()]
                if want in seen:
                    break
                time.sleep(0.1)
            return seen

        sandbox = Sandbox.create()
        try:
            sandbox.files.make_dir("/home/user/w")
            plain = sandbox.files.watch_dir("/home/user/w")
            deep = sandbox.files.watch_dir("/home/user/w", recursive=True)
            sandbox.commands.run(
                "cd /home/user/w && echo hi > a.txt && chmod 600 a.txt && mv a.txt b.txt && rm b.txt"
                " && mkdir -p sub/deeper && echo x > sub/deeper/f.txt && touch marker"
            )
            plain_seen = until(plain, ("marker", "create"))
            deep_seen = until(deep, ("sub/deeper/f.txt", "create"))
            plain.stop()
            try:
                plain.get_new_events()
                after_stop = "no error"
            except SandboxException as exc:
                after_stop = str(exc)
            deep.stop()
            try:
                sandbox.files.watch_dir("/home/user/missing")
                missing = "no error"
            except NotFoundException as exc:
                missing = "NotFoundException: " + str(exc)
        finally:
            sandbox.kill()
        print(json.dumps({"plain": plain_seen, "deep": deep_seen, "after_stop": after_stop, "missing": missing}))
        """,
    )
    plain = [tuple(event) for event in report["plain"]]
    for expected in [("a.txt", "create"), ("a.txt", "write"), ("a.txt", "chmod"), ("a.txt", "rename"),
                     ("b.txt", "create"), ("b.txt", "remove"), ("sub", "create")]:  # fmt: skip
        assert expected in plain, f"{expected} missing from {plain}"
    assert not [name for name, _ in plain if name.startswith("sub/")], "a plain watch saw inside a subdirectory"
    assert ("sub/deeper/f.txt", "create") in [tuple(event) for event in report["deep"]]
    assert "already stopped" in report["after_stop"]
    assert report["missing"].startswith("NotFoundException")


def test_async_watch_dir_streams_events_until_stopped(e2b_server: Server, tmp_path: Path) -> None:
    """The async SDK's watch_dir calls on_event for each change as it happens (recursive included), stop ends it
    with on_exit(None), and a missing path raises NotFoundException."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import asyncio, json
        from e2b import AsyncSandbox, NotFoundException

        async def main():
            sandbox = await AsyncSandbox.create()
            try:
                await sandbox.files.make_dir("/home/user/w")
                seen, exits, done = [], [], asyncio.Event()
                def on_event(event):
                    seen.append((event.name, event.type.value))
                    if event.name == "sub/f.txt" and event.type.value == "create":
                        done.set()
                handle = await sandbox.files.watch_dir(
                    "/home/user/w", on_event, on_exit=lambda error: exits.append(repr(error)), recursive=True
                )
                await sandbox.commands.run(
                    "cd /home/user/w && echo hi > a.txt && chmod 600 a.txt && mv a.txt b.txt && rm b.txt"
                    " && mkdir sub && echo x > sub/f.txt"
                )
                await asyncio.wait_for(done.wait(), 20)
                await handle.stop()
                count = len(seen)
                # A second watch sees the late write arrive, by then a live first watch would have seen it too.
                late = asyncio.Event()
                probe = await sandbox.files.watch_dir(
                    "/home/user/w", lambda e: late.set() if e.name == "late.txt" else None
                )
                await sandbox.files.write("/home/user/w/late.txt", "late")
                await asyncio.wait_for(late.wait(), 20)
                await probe.stop()
                try:
                    await sandbox.files.watch_dir("/home/user/missing", on_event)
                    missing = "no error"
                except NotFoundException as exc:
                    missing = "NotFoundException: " + str(exc)
                return {"seen": seen, "after_stop": seen[count:], "exits": exits, "missing": missing}
            finally:
                await sandbox.kill()

        print(json.dumps(asyncio.run(main())))
        """,
    )
    seen = [tuple(event) for event in report["seen"]]
    for expected in [("a.txt", "create"), ("a.txt", "write"), ("a.txt", "chmod"), ("a.txt", "rename"),
                     ("b.txt", "create"), ("b.txt", "remove"), ("sub", "create"), ("sub/f.txt", "create")]:  # fmt: skip
        assert expected in seen, f"{expected} missing from {seen}"
    assert report["after_stop"] == []
    assert report["exits"] == ["None"]
    assert report["missing"].startswith("NotFoundException")
