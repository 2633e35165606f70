"""FakeProvider's failure-injection knobs and the corners of its interpreter the conformance suite leaves out."""

import asyncio

import pytest

from corral.errors import (
    FileOperationError,
    InvalidRequestError,
    ProviderUnavailableError,
    SnapshotNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.providers.base import ExecExit, ExecMode, ExecRequest, Snapshotter, WorkspaceSpec, WorkspaceState
from corral.providers.fake import FakeProvider

pytestmark = pytest.mark.unit


def spec(workspace_id: str = "ws-1") -> WorkspaceSpec:
    return WorkspaceSpec(id=workspace_id, image="fake")


@pytest.fixture
async def fake() -> FakeProvider:
    provider = FakeProvider()
    await provider.create(spec())
    return provider


async def test_fail_create_raises_provider_unavailable() -> None:
    """With fail_create set, create raises ProviderUnavailableError naming the provider and creates nothing."""
    provider = FakeProvider("flaky")
    provider.fail_create = "daemon down"
    with pytest.raises(ProviderUnavailableError) as caught:
        await provider.create(spec())
    assert (caught.value.provider, caught.value.reason) == ("flaky", "daemon down")
    assert await provider.list_workspaces() == []
    provider.fail_create = None
    await provider.create(spec())
    assert await provider.state("ws-1") is WorkspaceState.RUNNING


async def test_unhealthy_provider_reports_its_error() -> None:
    """health() reports healthy=False with health_error when the provider is marked unhealthy."""
    provider = FakeProvider()
    provider.healthy = False
    provider.health_error = "runtime missing"
    health = await provider.health()
    assert (health.healthy, health.error) == (False, "runtime missing")


async def test_create_delay_can_be_cancelled() -> None:
    """A slow create (create_delay_s) can be timed out, and then leaves no workspace behind."""
    provider = FakeProvider()
    provider.create_delay_s = 30
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await provider.create(spec())
    assert await provider.state("ws-1") is WorkspaceState.MISSING


async def test_calls_are_recorded(fake: FakeProvider) -> None:
    """Every call is recorded as (method, workspace id)."""
    await fake.exec("ws-1", ExecRequest("true"))
    await fake.destroy("ws-1")
    assert fake.calls == [("create", "ws-1"), ("exec", "ws-1"), ("destroy", "ws-1")]


async def test_duplicate_id_is_refused(fake: FakeProvider) -> None:
    """Creating a workspace with an id already in use raises WorkspaceStateError."""
    with pytest.raises(WorkspaceStateError):
        await fake.create(spec())


async def test_file_calls_on_a_stopped_workspace_raise_state_error(fake: FakeProvider) -> None:
    """File calls on a stopped workspace raise WorkspaceStateError, and stop of a missing one WorkspaceNotFoundError."""
    await fake.stop("ws-1")
    with pytest.raises(WorkspaceStateError):
        await fake.read_file("ws-1", "/workspace/x")
    with pytest.raises(WorkspaceNotFoundError):
        await fake.stop("nope")


async def test_stop_kills_a_running_command(fake: FakeProvider) -> None:
    """Stopping the workspace ends a running command with exit code 137."""
    task = asyncio.create_task(fake.exec("ws-1", ExecRequest("sleep 30; echo never")))
    await asyncio.sleep(0)  # one turn: the task runs until it blocks inside `sleep 30`
    assert ("exec", "ws-1") in fake.calls
    await fake.stop("ws-1")
    result = await asyncio.wait_for(task, 5)
    assert (result.exit_code, result.stdout) == (137, b"")


async def test_closing_a_stream_early_stops_the_command(fake: FakeProvider) -> None:
    """Closing exec_stream after the first chunk means the rest of the script never runs."""
    stream = fake.exec_stream("ws-1", ExecRequest("echo first; sleep 0.01; touch /workspace/late"))
    first = await anext(aiter(stream))
    assert not isinstance(first, ExecExit)
    await stream.aclose()
    assert await fake.glob("ws-1", "late") == []


async def test_aclose_marks_the_provider_closed(fake: FakeProvider) -> None:
    """aclose sets closed and keeps the workspaces."""
    await fake.aclose()
    assert fake.closed
    assert await fake.list_workspaces() == ["ws-1"]


@pytest.mark.parametrize(
    ("script", "exit_code", "stdout", "stderr"),
    [
        ("false || echo $?", 0, b"1\n", b""),
        ("printf '%s=%d\\n' a 1 b 2", 0, b"a=1\nb=2\n", b""),
        ("echo -n x; echo y", 0, b"xy\n", b""),
        ("echo hi > f.txt && echo more >> f.txt; cat f.txt", 0, b"hi\nmore\n", b""),
        ("echo quiet 1>&2 2>/dev/null", 0, b"", b"quiet\n"),
        ("echo err >&2 2>/dev/null; echo gone 2>/dev/null >&2", 0, b"", b"err\n"),
        ("cd /tmp && pwd", 0, b"/tmp\n", b""),
        ("no-such-tool --flag", 127, b"", b"sh: 1: no-such-tool: not found\n"),
        ("cat /missing", 1, b"", b"cat: /missing: No such file or directory\n"),
        ("echo a | cat", 2, b"", b'sh: 1: Syntax error: "|" is not supported by the fake shell\n'),
        ("sh -c 'echo inner; exit 5'", 5, b"inner\n", b""),
    ],
)
async def test_interpreter(fake: FakeProvider, script: str, exit_code: int, stdout: bytes, stderr: bytes) -> None:
    """The fake shell understands the documented subset and fails loudly on the rest."""
    result = await fake.exec("ws-1", ExecRequest(script))
    assert (result.exit_code, result.stdout, result.stderr) == (exit_code, stdout, stderr)


async def test_argv_mode_is_not_parsed(fake: FakeProvider) -> None:
    """In argv mode quotes, variables and operators are literal arguments."""
    request = ExecRequest("echo", ("$HOME", "'q'", "a;", "&&", "b"), mode=ExecMode.ARGV)
    assert (await fake.exec("ws-1", request)).stdout == b"$HOME 'q' a; && b\n"


async def test_delete_refuses_the_workspace_root(fake: FakeProvider) -> None:
    """/workspace itself cannot be deleted, as with a real mount point."""
    with pytest.raises(FileOperationError):
        await fake.delete("ws-1", "/workspace", recursive=True)


# --- pause and snapshots ------------------------------------------------------------------------------------------


async def test_capabilities_say_what_the_fake_keeps() -> None:
    """Stop keeps every file ("full"); pause and snapshots say "filesystem" by default and "memory" when asked."""
    default = await FakeProvider().capabilities()
    assert (default.persistence, default.pause, default.snapshots) == ("full", "filesystem", "filesystem")
    memory = await FakeProvider(retention="memory").capabilities()
    assert (memory.persistence, memory.pause, memory.snapshots) == ("full", "memory", "memory")
    assert isinstance(FakeProvider(), Snapshotter)


async def test_an_unknown_retention_is_refused() -> None:
    """A retention other than "memory" or "filesystem" is refused, naming the allowed values."""
    with pytest.raises(InvalidRequestError, match="'memory' or 'filesystem'"):
        FakeProvider(retention="none")  # type: ignore[arg-type]  # the mistake under test


async def test_filesystem_pause_is_a_stop(fake: FakeProvider) -> None:
    """By default pause ends a running command like stop, answers "filesystem" (again when paused twice) and leaves
    the workspace STOPPED with its files."""
    await fake.write_file("ws-1", "/root/kept", b"kept")
    task = asyncio.create_task(fake.exec("ws-1", ExecRequest("sleep 30")))
    await asyncio.sleep(0)  # one turn: the task runs until it blocks inside `sleep 30`
    assert await fake.pause("ws-1") == "filesystem"
    assert (await asyncio.wait_for(task, 5)).exit_code == 137
    assert await fake.state("ws-1") is WorkspaceState.STOPPED
    assert await fake.pause("ws-1") == "filesystem"
    await fake.resume("ws-1")
    assert b"".join([c async for c in await fake.read_file("ws-1", "/root/kept")]) == b"kept"


async def test_memory_pause_reports_paused_until_resume() -> None:
    """With retention="memory" a pause leaves the workspace PAUSED (exec refused), a second pause answers "memory",
    a stop turns it STOPPED, and pausing a stopped workspace is refused."""
    provider = FakeProvider(retention="memory")
    await provider.create(spec())
    assert await provider.pause("ws-1") == "memory"
    assert await provider.state("ws-1") is WorkspaceState.PAUSED
    assert provider.known_dead("ws-1")
    with pytest.raises(WorkspaceStateError):
        await provider.exec("ws-1", ExecRequest("true"))
    assert await provider.pause("ws-1") == "memory"
    await provider.resume("ws-1")
    assert await provider.state("ws-1") is WorkspaceState.RUNNING
    await provider.pause("ws-1")
    await provider.stop("ws-1")
    assert await provider.state("ws-1") is WorkspaceState.STOPPED
    with pytest.raises(WorkspaceStateError, match="only a running workspace can be paused"):
        await provider.pause("ws-1")


async def test_snapshot_and_restore_copy_the_file_system(fake: FakeProvider) -> None:
    """A snapshot reports the bytes of its files (as estimated before) and keeps them as they were; a restore runs
    on its own copy; a taken id and a stopped source are refused."""
    await fake.write_file("ws-1", "/workspace/a.txt", b"12345")
    await fake.exec("ws-1", ExecRequest("ln -s /workspace/a.txt /workspace/link"))
    estimate = await fake.snapshot_estimate("ws-1")
    info = await fake.snapshot("ws-1", "snap")
    assert (info.kind, info.size_bytes, estimate) == ("filesystem", 5 + len("/workspace/a.txt"), info.size_bytes)
    await fake.write_file("ws-1", "/workspace/a.txt", b"changed")
    await fake.restore(WorkspaceSpec(id="copy", image="other"), "snap")
    assert (await fake.exec("copy", ExecRequest("cat /workspace/link"))).stdout == b"12345"
    await fake.chmod("copy", "/workspace/a.txt", 0o600)
    await fake.restore(WorkspaceSpec(id="copy-2", image="other"), "snap")
    assert (await fake.stat("copy-2", "/workspace/a.txt")).mode == 0o644
    with pytest.raises(WorkspaceStateError, match="already exists"):
        await fake.snapshot("ws-1", "snap")
    with pytest.raises(WorkspaceStateError, match="already exists"):
        await fake.restore(WorkspaceSpec(id="copy", image="fake"), "snap")
    await fake.stop("ws-1")
    with pytest.raises(WorkspaceStateError, match="not running"):
        await fake.snapshot("ws-1", "other")
    assert await fake.list_snapshots() == ["snap"]


async def test_restore_of_a_missing_snapshot_names_it(fake: FakeProvider) -> None:
    """Restoring an unknown or deleted snapshot raises SnapshotNotFoundError naming it; deleting twice is fine."""
    with pytest.raises(SnapshotNotFoundError, match="never-taken"):
        await fake.restore(spec("new"), "never-taken")
    await fake.snapshot("ws-1", "gone")
    await fake.delete_snapshot("gone")
    await fake.delete_snapshot("gone")
    with pytest.raises(SnapshotNotFoundError, match="gone"):
        await fake.restore(spec("new"), "gone")
    assert await fake.state("new") is WorkspaceState.MISSING


async def test_fail_snapshot_and_fail_restore_inject_provider_errors(fake: FakeProvider) -> None:
    """fail_snapshot and fail_restore raise ProviderUnavailableError with their reason and store or create nothing."""
    fake.fail_snapshot = "checkpoint failed"
    with pytest.raises(ProviderUnavailableError, match="checkpoint failed"):
        await fake.snapshot("ws-1", "snap")
    assert await fake.list_snapshots() == []
    fake.fail_snapshot = None
    await fake.snapshot("ws-1", "snap")
    fake.fail_restore = "restore failed"
    with pytest.raises(ProviderUnavailableError, match="restore failed"):
        await fake.restore(spec("new"), "snap")
    assert await fake.list_workspaces() == ["ws-1"]
