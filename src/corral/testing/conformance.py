"""The provider conformance suite: the behaviour of :mod:`corral.providers.base`, written once for every provider.

A provider joins by subclassing :class:`ProviderConformance` in a test module and defining two fixtures::

    import uuid

    import pytest

    from corral.providers.base import WorkspaceSpec
    from corral.providers.fake import FakeProvider
    from corral.testing import ProviderConformance, SpecFactory

    class TestFakeProvider(ProviderConformance):
        @pytest.fixture
        def provider(self) -> FakeProvider:
            return FakeProvider()

        @pytest.fixture
        def spec_factory(self) -> SpecFactory:
            return lambda: WorkspaceSpec(id=f"conf-{uuid.uuid4().hex[:12]}", image="debian:bookworm-slim")

``provider`` may be an async generator fixture (the suite never closes it); ``spec_factory`` returns a fresh
:class:`~corral.providers.base.WorkspaceSpec` with a unique id on every call, and decides image and network.
Every workspace a test creates goes through :class:`WorkspaceTracker`, which destroys it when the test ends, even
when the test fails. Commands are limited to what both the fake interpreter and ``dash`` in a minimal Debian image
understand: ``echo``, ``printf``, ``exit``, ``true``, ``false``, ``sleep``, ``cat``, ``touch``, ``pwd``,
``ln -s``, ``>&2``, ``;``, ``&&`` and ``$VAR``. Providers whose ``capabilities().isolation`` is not ``"none"`` must
also let ``cat /proc/[0-9]*/cmdline`` list the sandbox's processes: that is how the suite checks that a timed-out
command was killed (minimal images have no ``ps``).

Stateful behaviour is gated on capabilities: ``persistence: "full"`` (files outside /workspace survive stop),
``pause`` ("memory": a process keeps running across pause; "filesystem": pause is a stop) and ``snapshots`` (restore
into new workspaces, forks). Where they say "memory", the provider must also run a background counter with
``dash``'s ``setsid``, ``&``, ``while`` and ``$((...))`` (:data:`COUNTER`): memory was kept when the same pid counts
on after a resume or restore. The tests that need a :class:`~corral.providers.base.Snapshotter` fail when the
capabilities promise one and the provider is not. Snapshot ids start with :data:`SNAPSHOT_PREFIX`, and every
snapshot a test makes is deleted when it ends (:class:`SnapshotTracker`).

A test is skipped only when the provider's :class:`~corral.providers.base.Capabilities` say it lacks the feature,
or when the subclass lists the capability in :attr:`ProviderConformance.unexercised` (a test double that cannot
model it, with the reason). The skip names the flag and says :data:`DECLARED_GAP`, so ``pytest -ra`` shows every
gap (and ``CI=true`` lets such skips through; any other skip of an integration test fails there).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import ClassVar, Protocol

import pytest

from corral.errors import (
    ExecTimeoutError,
    FileOperationError,
    InvalidRequestError,
    SnapshotNotFoundError,
    WorkspaceDestroyedError,
    WorkspaceFileNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.providers.base import (
    WORKSPACE_ROOT,
    Capabilities,
    DirWatcher,
    ExecExit,
    ExecMode,
    ExecOutput,
    ExecRequest,
    Snapshotter,
    WorkspaceProvider,
    WorkspaceSpec,
    WorkspaceState,
)

__all__ = [
    "COUNTER",
    "DECLARED_GAP",
    "SNAPSHOT_PREFIX",
    "ProviderConformance",
    "SnapshotTracker",
    "SpecFactory",
    "WorkspaceTracker",
]

SpecFactory = Callable[[], WorkspaceSpec]
"""Returns a new :class:`WorkspaceSpec` with a unique id on every call."""

_GONE = (WorkspaceNotFoundError, WorkspaceDestroyedError)
"""What exec and file calls raise once a workspace is destroyed."""

_MIB = 1024 * 1024
_SANDBOX_TMP = "/tmp"  # noqa: S108 - a directory inside the sandbox, not on the host

DECLARED_GAP = "a declared gap"
"""Said by every skip of a test for a capability the provider's ``capabilities()`` declare missing, or that the
subclass declares it cannot exercise (tests/conftest.py lets these through under ``CI=true``)."""

SNAPSHOT_PREFIX = "conf-"
"""Every snapshot id the suite makes starts with this (ids are lowercase letters, digits and '-', valid for every
provider), so leftovers of an interrupted run can be found."""

COUNTER = (
    "setsid sh -c 'echo $$ > /tmp/counter.pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; "
    "sleep 0.05; done' >/dev/null 2>&1 </dev/null & while [ ! -s /tmp/counter.pid ]; do sleep 0.01; done"
)
"""Starts a background process that writes its pid to /tmp/counter.pid and an increasing count to /tmp/counter.

``setsid`` takes it out of the exec's process group (which providers kill when the exec ends), and the exec returns
once the pid is written. Memory was kept when, after a pause or a restore, the same pid still counts on."""
_READ_COUNTER = 'pid=$(cat /tmp/counter.pid) && kill -0 "$pid" && echo "$pid $(cat /tmp/counter)"'


class WorkspaceTracker:
    """Creates workspaces for one test and destroys every one of them at the end.

    Use it as the ``workspaces`` fixture of :class:`ProviderConformance`, or directly::

        async with WorkspaceTracker(provider, spec_factory) as workspaces:
            workspace_id = await workspaces.create()
    """

    def __init__(self, provider: WorkspaceProvider, spec_factory: SpecFactory) -> None:
        self.provider = provider
        self.spec_factory = spec_factory
        self.ids: list[str] = []

    async def create(self, spec: WorkspaceSpec | None = None) -> str:
        """Create a workspace from ``spec`` (default: a new one from the factory) and return its id."""
        spec = spec or self.spec_factory()
        self.ids.append(spec.id)  # before create: a create that fails half-way must be cleaned up too
        await self.provider.create(spec)
        return spec.id

    async def destroy_all(self) -> None:
        """Destroy every workspace created so far; raise the first failure after trying them all."""
        ids, self.ids = self.ids, []
        results = await asyncio.gather(*(self.provider.destroy(i) for i in ids), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def restore(self, provider: Snapshotter, snapshot_id: str, spec: WorkspaceSpec | None = None) -> str:
        """Restore a new workspace from ``spec`` (default: a new one from the factory) and return its id."""
        spec = spec or self.spec_factory()
        self.ids.append(spec.id)  # before restore: a restore that fails half-way must be cleaned up too
        await provider.restore(spec, snapshot_id)
        return spec.id

    async def __aenter__(self) -> WorkspaceTracker:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.destroy_all()


class SnapshotTracker:
    """Hands out snapshot ids for one test and deletes every snapshot under them at the end.

    The ids share a prefix of their own (under :data:`SNAPSHOT_PREFIX`); at the end none of them may be left in
    ``list_snapshots()``.
    """

    def __init__(self, provider: WorkspaceProvider) -> None:
        self.provider = provider
        self.prefix = f"{SNAPSHOT_PREFIX}{uuid.uuid4().hex[:8]}-"
        self.ids: list[str] = []

    def new_id(self) -> str:
        """A fresh snapshot id, remembered for deletion."""
        snapshot_id = f"{self.prefix}{len(self.ids)}"
        self.ids.append(snapshot_id)
        return snapshot_id

    async def delete_all(self) -> None:
        """Delete every snapshot handed out (deleting is idempotent), then check that none of them is listed."""
        provider, ids, self.ids = self.provider, self.ids, []
        if not ids or not isinstance(provider, Snapshotter):
            return
        for snapshot_id in {*ids, *(i for i in await provider.list_snapshots() if i.startswith(self.prefix))}:
            await provider.delete_snapshot(snapshot_id)
        left = [i for i in await provider.list_snapshots() if i.startswith(self.prefix)]
        assert left == [], f"snapshots left after delete_snapshot: {left}"


# --- helpers ------------------------------------------------------------------------------------------------------


async def _read_all(provider: WorkspaceProvider, workspace_id: str, path: str) -> bytes:
    """The whole content of a (small) file."""
    chunks = await provider.read_file(workspace_id, path)
    return b"".join([chunk async for chunk in chunks])


async def _read_all_beneath(provider: WorkspaceProvider, workspace_id: str, path: str) -> bytes:
    """The whole content of a (small) file, read with ``beneath=/workspace``."""
    chunks = await provider.read_file(workspace_id, path, beneath=WORKSPACE_ROOT)
    return b"".join([chunk async for chunk in chunks])


class _Digest(Protocol):
    def update(self, data: bytes, /) -> None: ...


async def _random_chunks(total: int, chunk_size: int, digest: _Digest) -> AsyncIterator[bytes]:
    """Yield ``total`` random bytes in chunks, feeding them to ``digest`` on the way."""
    sent = 0
    while sent < total:
        chunk = os.urandom(min(chunk_size, total - sent))
        digest.update(chunk)
        sent += len(chunk)
        yield chunk


async def _poll(condition: Callable[[], Awaitable[bool]], *, timeout_s: float, message: str) -> None:
    """Await ``condition()`` until it returns true, failing the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{message} (still not true after {timeout_s:g}s)")
        await asyncio.sleep(0.1)


def _require(capabilities: Capabilities, flag: str, provider: WorkspaceProvider, *allowed: str) -> None:
    """Skip the test, naming the flag, when the provider declares it lacks a feature (or, with ``allowed``, when
    the flag's value is not one of them)."""
    value = getattr(capabilities, flag)
    if value in (False, "none"):
        pytest.skip(f"{provider.name}: capabilities().{flag} is {value!r} ({DECLARED_GAP})")
    if allowed and value not in allowed:
        wanted = " or ".join(repr(a) for a in allowed)
        pytest.skip(f"{provider.name}: capabilities().{flag} is {value!r}, not {wanted} ({DECLARED_GAP})")


def _snapshotter(provider: WorkspaceProvider, capabilities: Capabilities) -> Snapshotter:
    """The provider as a Snapshotter; a test failure when its capabilities promise pause or snapshots without it."""
    assert isinstance(provider, Snapshotter), (
        f"{provider.name}: capabilities() say pause {capabilities.pause!r} and snapshots {capabilities.snapshots!r}, "
        "but the provider does not implement the Snapshotter protocol"
    )
    return provider


async def _sh(provider: WorkspaceProvider, workspace_id: str, command: str) -> bytes:
    """The stdout of a command that must succeed."""
    result = await provider.exec(workspace_id, ExecRequest(command, timeout_s=60))
    assert result.exit_code == 0, f"{command!r} exited {result.exit_code}: {result.stderr!r}"
    return result.stdout


async def _counter(provider: WorkspaceProvider, workspace_id: str) -> tuple[int, int]:
    """(pid, count) of the workspace's live :data:`COUNTER` process; fails the test when the process is gone."""
    deadline = time.monotonic() + 10
    while True:
        result = await provider.exec(workspace_id, ExecRequest(_READ_COUNTER, timeout_s=60))
        assert result.exit_code == 0, f"the counter process is gone: {result.stdout!r} {result.stderr!r}"
        words = result.stdout.split()
        if len(words) == 2:
            return int(words[0]), int(words[1])
        # Read between the counter's truncate and its write: read again at once.
        if time.monotonic() > deadline:
            pytest.fail(f"the counter never showed a count: {result.stdout!r}")


async def _counting_on(provider: WorkspaceProvider, workspace_id: str, pid: int, past: int) -> int:
    """Poll until the counter process ``pid`` has counted past ``past``; returns its count. Fails when another
    process writes the counter (memory was not kept) or the count stalls for 20 s."""
    deadline = time.monotonic() + 20
    while True:
        now_pid, count = await _counter(provider, workspace_id)
        assert now_pid == pid, f"the counter is process {now_pid}, not {pid}: its memory was not kept"
        if count > past:
            return count
        if time.monotonic() > deadline:
            pytest.fail(f"the counter (pid {pid}) stayed at {count}, never past {past}")
        await asyncio.sleep(0.05)


async def _start_counter(provider: WorkspaceProvider, workspace_id: str) -> tuple[int, int]:
    """Start :data:`COUNTER`, wait until it counts, and return its (pid, count)."""
    await _sh(provider, workspace_id, COUNTER)
    pid, count = await _counter(provider, workspace_id)
    return pid, await _counting_on(provider, workspace_id, pid, count)


def _outputs(events: Sequence[object], stream: str) -> bytes:
    """Concatenate the ``stream`` chunks of an ``exec_stream`` run."""
    return b"".join(e.data for e in events if isinstance(e, ExecOutput) and e.stream == stream)


# --- the suite ----------------------------------------------------------------------------------------------------


class ProviderConformance:
    """Behaviour every :class:`~corral.providers.base.WorkspaceProvider` must show.

    Subclasses (named ``Test...``) define the ``provider`` and ``spec_factory`` fixtures; see the module docstring.
    """

    unexercised: ClassVar[Mapping[str, str]] = {}
    """Capabilities the provider has but this run cannot exercise, as ``"flag=value"`` to the reason, e.g.
    ``{"pause=memory": "the double boots the guest from its disk on resume"}``: their tests skip (or, for
    ``snapshots=memory``, check files only) and say why."""

    def _skip_unexercised(self, provider: WorkspaceProvider, flag: str, value: str) -> None:
        """Skip the test, saying why, when the subclass lists ``flag=value`` in :attr:`unexercised`."""
        reason = self.unexercised.get(f"{flag}={value}")
        if reason is not None:
            pytest.skip(
                f"{provider.name}: capabilities().{flag} is {value!r}, not exercised: {reason} ({DECLARED_GAP})"
            )

    @pytest.fixture
    def provider(self) -> WorkspaceProvider:
        """The provider under test; every subclass must override this fixture."""
        raise NotImplementedError(f"{type(self).__name__} must define the `provider` fixture")

    @pytest.fixture
    def spec_factory(self) -> SpecFactory:
        """Fresh specs with unique ids; every subclass must override this fixture."""
        raise NotImplementedError(f"{type(self).__name__} must define the `spec_factory` fixture")

    @pytest.fixture
    async def workspaces(
        self, provider: WorkspaceProvider, spec_factory: SpecFactory
    ) -> AsyncIterator[WorkspaceTracker]:
        """A tracker that destroys, at the end of the test, every workspace created through it."""
        async with WorkspaceTracker(provider, spec_factory) as tracker:
            yield tracker

    @pytest.fixture
    async def workspace(self, workspaces: WorkspaceTracker) -> str:
        """The id of one running workspace, destroyed after the test."""
        return await workspaces.create()

    @pytest.fixture
    async def snapshots(
        self, provider: WorkspaceProvider, workspaces: WorkspaceTracker
    ) -> AsyncIterator[SnapshotTracker]:
        """Snapshot ids for the test; at the end its workspaces are destroyed, then its snapshots deleted."""
        tracker = SnapshotTracker(provider)
        yield tracker
        try:
            await workspaces.destroy_all()  # restored workspaces first: they may still use the snapshot's files
        finally:
            await tracker.delete_all()

    @pytest.fixture
    async def capabilities(self, provider: WorkspaceProvider) -> Capabilities:
        """What the provider says it offers; used to skip tests for features it declares missing."""
        return await provider.capabilities()

    # -- provider -------------------------------------------------------------------------------------------------

    async def test_satisfies_the_protocol(self, provider: WorkspaceProvider) -> None:
        """The provider has every method of the WorkspaceProvider protocol and a non-empty name."""
        assert isinstance(provider, WorkspaceProvider)
        assert provider.name

    async def test_health_and_capabilities(self, provider: WorkspaceProvider) -> None:
        """health() reports healthy without side effects and capabilities() returns a Capabilities value."""
        before = await provider.list_workspaces()
        health = await provider.health()
        assert health.healthy is True, health.error
        assert await provider.list_workspaces() == before
        assert isinstance(await provider.capabilities(), Capabilities)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def test_create_runs_and_lists_the_workspace(
        self, provider: WorkspaceProvider, workspaces: WorkspaceTracker
    ) -> None:
        """A created workspace is running, runs commands and appears in list_workspaces."""
        workspace_id = await workspaces.create()
        assert await provider.state(workspace_id) is WorkspaceState.RUNNING
        result = await provider.exec(workspace_id, ExecRequest("echo hello"))
        assert (result.exit_code, result.stdout) == (0, b"hello\n")
        assert workspace_id in await provider.list_workspaces()

    async def test_destroy_removes_the_workspace_and_is_idempotent(
        self, provider: WorkspaceProvider, workspaces: WorkspaceTracker
    ) -> None:
        """After destroy the workspace is missing and unlisted, and destroying it again is fine."""
        workspace_id = await workspaces.create()
        await provider.destroy(workspace_id)
        assert await provider.state(workspace_id) is WorkspaceState.MISSING
        assert workspace_id not in await provider.list_workspaces()
        await provider.destroy(workspace_id)

    async def test_destroy_of_an_unknown_workspace_is_fine(
        self, provider: WorkspaceProvider, spec_factory: SpecFactory
    ) -> None:
        """Destroying an id the provider never saw does not raise."""
        await provider.destroy(spec_factory().id)

    async def test_calls_after_destroy_raise_not_found(
        self, provider: WorkspaceProvider, workspaces: WorkspaceTracker
    ) -> None:
        """After destroy, exec and every file call raise WorkspaceNotFoundError or WorkspaceDestroyedError."""
        workspace_id = await workspaces.create()
        await provider.write_file(workspace_id, "/workspace/kept.txt", b"data")
        await provider.destroy(workspace_id)
        with pytest.raises(_GONE):
            await provider.exec(workspace_id, ExecRequest("true"))
        with pytest.raises(_GONE):
            async for _ in provider.exec_stream(workspace_id, ExecRequest("true")):
                pass
        with pytest.raises(_GONE):
            await provider.read_file(workspace_id, "/workspace/kept.txt")
        with pytest.raises(_GONE):
            await provider.write_file(workspace_id, "/workspace/new.txt", b"data")
        with pytest.raises(_GONE):
            await provider.stat(workspace_id, "/workspace/kept.txt")
        with pytest.raises(_GONE):
            await provider.list_dir(workspace_id, "/workspace")

    async def test_unknown_workspace_raises_not_found(
        self, provider: WorkspaceProvider, spec_factory: SpecFactory
    ) -> None:
        """Exec, read_file and stat on an id that was never created raise WorkspaceNotFoundError; state is missing."""
        unknown = spec_factory().id
        assert await provider.state(unknown) is WorkspaceState.MISSING
        with pytest.raises(WorkspaceNotFoundError):
            await provider.exec(unknown, ExecRequest("true"))
        with pytest.raises(WorkspaceNotFoundError):
            await provider.read_file(unknown, "/workspace/file.txt")
        with pytest.raises(WorkspaceNotFoundError):
            await provider.stat(unknown, "/workspace")

    async def test_concurrent_creates(self, provider: WorkspaceProvider, workspaces: WorkspaceTracker) -> None:
        """Ten concurrent creates all succeed with distinct ids, each runs commands, and all can be destroyed."""
        ids = await asyncio.gather(*(workspaces.create() for _ in range(10)))
        assert len(set(ids)) == 10
        results = await asyncio.gather(*(provider.exec(i, ExecRequest("echo", (i,))) for i in ids))
        assert [r.stdout for r in results] == [f"{i}\n".encode() for i in ids]
        await asyncio.gather(*(provider.destroy(i) for i in ids))
        assert set(await asyncio.gather(*(provider.state(i) for i in ids))) == {WorkspaceState.MISSING}

    # -- stop and resume ------------------------------------------------------------------------------------------

    async def test_stop_and_resume_keep_the_workspace_files(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """A file written under /workspace before stop has the same bytes after resume."""
        _require(capabilities, "persistence", provider)
        content = bytes(range(256)) * 16
        await provider.write_file(workspace, "/workspace/state/kept.bin", content)
        await provider.stop(workspace)
        assert await provider.state(workspace) is WorkspaceState.STOPPED
        assert workspace in await provider.list_workspaces()
        await provider.resume(workspace)
        assert await provider.state(workspace) is WorkspaceState.RUNNING
        assert await _read_all(provider, workspace, "/workspace/state/kept.bin") == content
        result = await provider.exec(workspace, ExecRequest("cat /workspace/state/kept.bin"))
        assert result.stdout == content

    async def test_exec_on_a_stopped_workspace_raises_state_error(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """Exec on a stopped workspace raises WorkspaceStateError."""
        _require(capabilities, "persistence", provider)
        await provider.stop(workspace)
        with pytest.raises(WorkspaceStateError):
            await provider.exec(workspace, ExecRequest("true"))

    async def test_resume_of_a_running_workspace_is_a_noop(self, provider: WorkspaceProvider, workspace: str) -> None:
        """Resuming a running workspace keeps it running with its files."""
        await provider.write_file(workspace, "/workspace/still-here.txt", b"yes")
        await provider.resume(workspace)
        assert await provider.state(workspace) is WorkspaceState.RUNNING
        assert await _read_all(provider, workspace, "/workspace/still-here.txt") == b"yes"
        assert (await provider.exec(workspace, ExecRequest("true"))).exit_code == 0

    # -- stateful: full disk, pause, snapshots, forks -----------------------------------------------------------

    async def test_stop_and_resume_keep_the_whole_disk(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """With persistence "full", files outside /workspace (in /root and /etc, written by the file API and by a
        command) have the same bytes after stop and resume."""
        _require(capabilities, "persistence", provider, "full")
        content = os.urandom(4096)
        await provider.write_file(workspace, "/root/kept.bin", content)
        await provider.write_file(workspace, "/etc/corral-conformance.conf", b"kept = true\n")
        await _sh(provider, workspace, "echo by-exec > /root/by-exec.txt")
        await provider.stop(workspace)
        assert await provider.state(workspace) is WorkspaceState.STOPPED
        await provider.resume(workspace)
        assert await _read_all(provider, workspace, "/root/kept.bin") == content
        assert await _read_all(provider, workspace, "/etc/corral-conformance.conf") == b"kept = true\n"
        assert await _sh(provider, workspace, "cat /root/by-exec.txt /etc/corral-conformance.conf") == (
            b"by-exec\nkept = true\n"
        )

    async def test_filesystem_pause_is_a_stop_that_keeps_the_disk(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """Where pause keeps no memory, it answers "filesystem", the workspace is stopped (exec refused), and its
        files are there after resume (outside /workspace too when persistence is "full")."""
        _require(capabilities, "pause", provider, "filesystem")
        snapshotter = _snapshotter(provider, capabilities)
        paths = ["/workspace/paused/kept.txt"] + (
            ["/root/paused-kept.txt"] if capabilities.persistence == "full" else []
        )
        for path in paths:
            await provider.write_file(workspace, path, path.encode())
        assert await snapshotter.pause(workspace) == "filesystem"
        assert await provider.state(workspace) is WorkspaceState.STOPPED
        with pytest.raises(WorkspaceStateError):
            await provider.exec(workspace, ExecRequest("true"))
        await provider.resume(workspace)
        assert await provider.state(workspace) is WorkspaceState.RUNNING
        for path in paths:
            assert await _read_all(provider, workspace, path) == path.encode()

    async def test_pause_keeps_processes_and_memory(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """With pause "memory", a process started before pause is, after resume, the same process counting on from
        where it was; while paused the workspace is PAUSED, refuses exec and answers "memory" to another pause."""
        _require(capabilities, "pause", provider, "memory")
        self._skip_unexercised(provider, "pause", "memory")
        snapshotter = _snapshotter(provider, capabilities)
        pid, before = await _start_counter(provider, workspace)
        await provider.write_file(workspace, "/workspace/paused.txt", b"kept")
        assert await snapshotter.pause(workspace) == "memory"
        assert await provider.state(workspace) is WorkspaceState.PAUSED
        assert workspace in await provider.list_workspaces()
        with pytest.raises(WorkspaceStateError):
            await provider.exec(workspace, ExecRequest("true"))
        assert await snapshotter.pause(workspace) == "memory"
        await provider.resume(workspace)
        assert await provider.state(workspace) is WorkspaceState.RUNNING
        now_pid, after = await _counter(provider, workspace)
        assert now_pid == pid, f"the counter is process {now_pid}, not {pid}: its memory was not kept"
        assert after >= before, f"the count went back from {before} to {after}"
        await _counting_on(provider, workspace, pid, after)
        assert await _read_all(provider, workspace, "/workspace/paused.txt") == b"kept"

    async def test_pause_of_a_stopped_workspace_is_refused(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """With pause "memory", pausing a stopped workspace raises WorkspaceStateError (there is no memory left)."""
        _require(capabilities, "pause", provider, "memory")
        snapshotter = _snapshotter(provider, capabilities)
        await provider.stop(workspace)
        with pytest.raises(WorkspaceStateError):
            await snapshotter.pause(workspace)
        assert await provider.state(workspace) is WorkspaceState.STOPPED

    async def test_ten_pause_cycles_keep_the_process(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """Ten pause/resume cycles in a row: after every one the same counter process counts on past its count."""
        _require(capabilities, "pause", provider, "memory")
        self._skip_unexercised(provider, "pause", "memory")
        snapshotter = _snapshotter(provider, capabilities)
        pid, count = await _start_counter(provider, workspace)
        for cycle in range(10):
            assert await snapshotter.pause(workspace) == "memory", f"cycle {cycle}"
            assert await provider.state(workspace) is WorkspaceState.PAUSED, f"cycle {cycle}"
            await provider.resume(workspace)
            count = await _counting_on(provider, workspace, pid, count)

    async def test_snapshot_restores_into_a_new_workspace(
        self,
        provider: WorkspaceProvider,
        workspace: str,
        workspaces: WorkspaceTracker,
        snapshots: SnapshotTracker,
        capabilities: Capabilities,
    ) -> None:
        """A snapshot restored into a new workspace has the source's files as they were (and with snapshots
        "memory" its counting process); the source runs on, and once deleted the snapshot cannot be restored."""
        _require(capabilities, "snapshots", provider)
        snapshotter = _snapshotter(provider, capabilities)
        await provider.write_file(workspace, "/workspace/snap/file.txt", b"before")
        await provider.write_file(workspace, "/root/snap.txt", b"root")
        memory = capabilities.snapshots == "memory" and "snapshots=memory" not in self.unexercised
        pid, count = await _start_counter(provider, workspace) if memory else (0, 0)
        snapshot_id = snapshots.new_id()
        info = await snapshotter.snapshot(workspace, snapshot_id)
        assert (info.kind, info.size_bytes > 0) == (capabilities.snapshots, True)
        assert snapshot_id in await snapshotter.list_snapshots()
        assert await provider.state(workspace) is WorkspaceState.RUNNING
        await provider.write_file(workspace, "/workspace/snap/file.txt", b"after")
        restored = await workspaces.restore(snapshotter, snapshot_id)
        assert await provider.state(restored) is WorkspaceState.RUNNING
        assert restored in await provider.list_workspaces()
        assert await _read_all(provider, restored, "/workspace/snap/file.txt") == b"before"
        assert await _sh(provider, restored, "cat /workspace/snap/file.txt /root/snap.txt") == b"beforeroot"
        assert await _read_all(provider, workspace, "/workspace/snap/file.txt") == b"after"
        if memory:
            await _counting_on(provider, restored, pid, count)
            await _counting_on(provider, workspace, pid, count)
        await snapshotter.delete_snapshot(snapshot_id)
        await snapshotter.delete_snapshot(snapshot_id)
        assert snapshot_id not in await snapshotter.list_snapshots()
        assert await _read_all(provider, restored, "/root/snap.txt") == b"root"
        with pytest.raises(SnapshotNotFoundError, match=snapshot_id):
            await workspaces.restore(snapshotter, snapshot_id)

    async def test_forks_are_independent(
        self,
        provider: WorkspaceProvider,
        workspace: str,
        workspaces: WorkspaceTracker,
        snapshots: SnapshotTracker,
        capabilities: Capabilities,
    ) -> None:
        """Three workspaces restored from one snapshot each see the source's file, and what one writes is seen by
        neither the others nor the source (nor what the source writes by them)."""
        _require(capabilities, "snapshots", provider)
        snapshotter = _snapshotter(provider, capabilities)
        await provider.write_file(workspace, "/workspace/fork/shared.txt", b"source")
        snapshot_id = snapshots.new_id()
        await snapshotter.snapshot(workspace, snapshot_id)
        forks = await asyncio.gather(*(workspaces.restore(snapshotter, snapshot_id) for _ in range(3)))
        assert len({workspace, *forks}) == 4
        for fork in forks:
            assert await _read_all(provider, fork, "/workspace/fork/shared.txt") == b"source"
        for i, fork in enumerate(forks):
            await provider.write_file(fork, "/workspace/fork/shared.txt", f"fork {i}".encode())
            await _sh(provider, fork, f"echo {i} > /workspace/fork/only-{i}.txt")
        await provider.write_file(workspace, "/workspace/fork/shared.txt", b"source again")
        for i, fork in enumerate(forks):
            assert await _sh(provider, fork, "cat /workspace/fork/shared.txt") == f"fork {i}".encode()
            listed = [e.name for e in await provider.list_dir(fork, "/workspace/fork")]
            assert listed == [f"only-{i}.txt", "shared.txt"], f"fork {i} sees {listed}"
        assert [e.name for e in await provider.list_dir(workspace, "/workspace/fork")] == ["shared.txt"]
        assert await _read_all(provider, workspace, "/workspace/fork/shared.txt") == b"source again"

    # -- exec -----------------------------------------------------------------------------------------------------

    async def test_exec_separates_stdout_and_stderr(self, provider: WorkspaceProvider, workspace: str) -> None:
        """Stdout and stderr come back separately."""
        result = await provider.exec(workspace, ExecRequest("echo out; echo err >&2"))
        assert (result.exit_code, result.stdout, result.stderr) == (0, b"out\n", b"err\n")

    async def test_exec_returns_exit_codes(self, provider: WorkspaceProvider, workspace: str) -> None:
        """A nonzero exit is a result, not an error: `exit 3` gives 3 and `false` gives 1."""
        assert (await provider.exec(workspace, ExecRequest("exit 3"))).exit_code == 3
        assert (await provider.exec(workspace, ExecRequest("false"))).exit_code == 1
        assert (await provider.exec(workspace, ExecRequest("true && exit 0"))).exit_code == 0

    async def test_exec_shell_mode_quotes_args(self, provider: WorkspaceProvider, workspace: str) -> None:
        """In shell mode args are shell-quoted, so spaces and `$HOME` reach the command literally."""
        result = await provider.exec(workspace, ExecRequest("echo", ("a b", "$HOME")))
        assert result.stdout == b"a b $HOME\n"

    async def test_exec_passes_env(self, provider: WorkspaceProvider, workspace: str) -> None:
        """Variables of the request env are visible to the command."""
        request = ExecRequest('echo "$GREETING"; printf "%s\\n" "${OTHER}"', env={"GREETING": "hi there", "OTHER": "x"})
        assert (await provider.exec(workspace, request)).stdout == b"hi there\nx\n"

    async def test_exec_sees_the_spec_env(
        self, provider: WorkspaceProvider, workspaces: WorkspaceTracker, spec_factory: SpecFactory
    ) -> None:
        """Variables of WorkspaceSpec.env reach every command, and the request env overrides them."""
        spec = spec_factory()
        spec = dataclasses.replace(spec, env={**spec.env, "FROM_SPEC": "spec", "BOTH": "spec"})
        workspace_id = await workspaces.create(spec)
        request = ExecRequest('echo "$FROM_SPEC $BOTH"', env={"BOTH": "request"})
        assert (await provider.exec(workspace_id, request)).stdout == b"spec request\n"

    async def test_exec_honours_cwd(self, provider: WorkspaceProvider, workspace: str) -> None:
        """The command runs in the requested working directory."""
        await provider.write_file(workspace, "/workspace/sub/here.txt", b"found\n")
        assert (await provider.exec(workspace, ExecRequest("pwd", cwd=_SANDBOX_TMP))).stdout == b"/tmp\n"
        result = await provider.exec(workspace, ExecRequest("pwd; cat here.txt", cwd="/workspace/sub"))
        assert result.stdout == b"/workspace/sub\nfound\n"

    async def test_exec_argv_mode_involves_no_shell(self, provider: WorkspaceProvider, workspace: str) -> None:
        """In argv mode `$(...)` is a literal argument: it is printed and nothing runs."""
        request = ExecRequest("echo", ("$(touch /tmp/pwned)",), mode=ExecMode.ARGV)
        result = await provider.exec(workspace, request)
        assert (result.exit_code, result.stdout) == (0, b"$(touch /tmp/pwned)\n")
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, f"{_SANDBOX_TMP}/pwned")

    async def test_exec_and_files_share_the_file_system(self, provider: WorkspaceProvider, workspace: str) -> None:
        """Files written through the file API are seen by commands and the other way round."""
        await provider.write_file(workspace, "/workspace/from-api.txt", b"api\n")
        assert (await provider.exec(workspace, ExecRequest("cat /workspace/from-api.txt"))).stdout == b"api\n"
        assert (await provider.exec(workspace, ExecRequest("touch /workspace/from-exec"))).exit_code == 0
        info = await provider.stat(workspace, "/workspace/from-exec")
        assert (info.type, info.size) == ("file", 0)

    # -- streaming ------------------------------------------------------------------------------------------------

    async def test_exec_stream_tags_streams_and_ends_with_exit(
        self, provider: WorkspaceProvider, workspace: str
    ) -> None:
        """exec_stream tags stdout and stderr chunks and ends with one ExecExit carrying the exit code."""
        events = [e async for e in provider.exec_stream(workspace, ExecRequest("echo out; echo err >&2; exit 4"))]
        assert isinstance(events[-1], ExecExit)
        assert events[-1].exit_code == 4
        assert all(isinstance(e, ExecOutput) for e in events[:-1])
        assert (_outputs(events, "stdout"), _outputs(events, "stderr")) == (b"out\n", b"err\n")

    async def test_exec_stream_yields_output_as_it_is_produced(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """Output written before a pause arrives before the pause ends, well ahead of the command's exit."""
        _require(capabilities, "streaming", provider)
        pause_s = 0.3
        seen = b""
        first_at = second_at = exit_at = None
        async for event in provider.exec_stream(workspace, ExecRequest(f"echo a; sleep {pause_s}; echo b")):
            now = time.monotonic()
            if isinstance(event, ExecExit):
                exit_at = now
                continue
            assert event.stream == "stdout"
            seen += event.data
            if first_at is None and b"a" in seen:
                first_at = now
            if second_at is None and b"b" in seen:
                second_at = now
        assert seen == b"a\nb\n"
        assert first_at is not None
        assert second_at is not None
        assert exit_at is not None
        # Relative to the command's own pause, not to the wall clock: "a" must not wait for the pause.
        assert second_at - first_at >= pause_s / 2, "the first line was held back until the command went on"
        assert exit_at - first_at >= pause_s / 2

    # -- timeouts -------------------------------------------------------------------------------------------------

    async def test_exec_timeout_raises_with_partial_output(self, provider: WorkspaceProvider, workspace: str) -> None:
        """A command past its deadline raises ExecTimeoutError soon after it, carrying the output so far."""
        started = time.monotonic()
        with pytest.raises(ExecTimeoutError) as caught:
            await provider.exec(workspace, ExecRequest("echo partial; sleep 30", timeout_s=1))
        assert time.monotonic() - started < 10, "the deadline was not enforced: the command ran on"
        assert b"partial" in caught.value.stdout
        assert (await provider.exec(workspace, ExecRequest("echo alive"))).stdout == b"alive\n"

    async def test_exec_timeout_kills_the_process(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """After a timeout no `sleep 30` process is left in the sandbox (checked through /proc, as minimal
        images have no ps)."""
        if capabilities.isolation == "none":
            pytest.skip(f"{provider.name}: capabilities().isolation is 'none': no process table to inspect")
        with pytest.raises(ExecTimeoutError):
            await provider.exec(workspace, ExecRequest("sleep 30", timeout_s=1))

        async def sleep_is_gone() -> bool:
            # Every process's argv, NUL-separated; a process that exits while cat runs only adds a stderr line.
            listing = await provider.exec(workspace, ExecRequest("cat /proc/[0-9]*/cmdline", timeout_s=30))
            assert listing.stdout, f"could not list processes: {listing.stderr!r}"
            return b"sleep\x0030" not in listing.stdout

        await _poll(sleep_is_gone, timeout_s=10, message="`sleep 30` survived the exec timeout")

    # -- files ----------------------------------------------------------------------------------------------------

    async def test_binary_roundtrip(self, provider: WorkspaceProvider, workspace: str) -> None:
        """All 256 byte values are written and read back unchanged."""
        content = bytes(range(256))
        assert await provider.write_file(workspace, "/workspace/all-bytes.bin", content) == 256
        assert await _read_all(provider, workspace, "/workspace/all-bytes.bin") == content

    async def test_large_file_streams_both_ways(self, provider: WorkspaceProvider, workspace: str) -> None:
        """A 10 MiB file written from an async iterable of chunks reads back, streamed, with the same sha256."""
        total = 10 * _MIB
        written = hashlib.sha256()
        size = await provider.write_file(workspace, "/workspace/big.bin", _random_chunks(total, _MIB + 7, written))
        assert size == total
        assert (await provider.stat(workspace, "/workspace/big.bin")).size == total
        read, count = hashlib.sha256(), 0
        async for chunk in await provider.read_file(workspace, "/workspace/big.bin"):
            read.update(chunk)
            count += len(chunk)
        assert count == total
        assert read.hexdigest() == written.hexdigest()

    async def test_unicode_file_names(self, provider: WorkspaceProvider, workspace: str) -> None:
        """Non-ASCII directory and file names work through the file API and in commands."""
        path = "/workspace/dossier-été/résumé ✓.txt"
        await provider.write_file(workspace, path, "contenu ✓\n".encode())
        assert await _read_all(provider, workspace, path) == "contenu ✓\n".encode()
        assert [e.name for e in await provider.list_dir(workspace, "/workspace/dossier-été")] == ["résumé ✓.txt"]
        assert (await provider.exec(workspace, ExecRequest("cat", (path,)))).stdout == "contenu ✓\n".encode()

    async def test_write_creates_missing_parents(self, provider: WorkspaceProvider, workspace: str) -> None:
        """write_file creates every missing parent directory."""
        await provider.write_file(workspace, "/workspace/a/b/c/leaf.txt", b"leaf")
        assert (await provider.stat(workspace, "/workspace/a/b")).type == "dir"
        assert await _read_all(provider, workspace, "/workspace/a/b/c/leaf.txt") == b"leaf"

    async def test_write_replaces_a_longer_file_whole(self, provider: WorkspaceProvider, workspace: str) -> None:
        """Writing over an existing, longer file leaves exactly the new content (the file is truncated)."""
        await provider.write_file(workspace, "/workspace/over.txt", b"a much longer first version\n")
        await provider.write_file(workspace, "/workspace/over.txt", b"short\n")
        assert await _read_all(provider, workspace, "/workspace/over.txt") == b"short\n"

    async def test_relative_paths_start_at_workspace(self, provider: WorkspaceProvider, workspace: str) -> None:
        """A relative path is taken from /workspace."""
        await provider.write_file(workspace, "relative/file.txt", b"rel")
        assert await _read_all(provider, workspace, "/workspace/relative/file.txt") == b"rel"

    async def test_read_of_a_missing_file_raises(self, provider: WorkspaceProvider, workspace: str) -> None:
        """read_file and stat of a missing path raise WorkspaceFileNotFoundError when awaited."""
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.read_file(workspace, "/workspace/missing.txt")
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, "/workspace/missing.txt")

    async def test_list_dir_is_sorted_with_types_and_sizes(self, provider: WorkspaceProvider, workspace: str) -> None:
        """list_dir returns the direct entries sorted by name, with absolute paths, types and file sizes."""
        await provider.write_file(workspace, "/workspace/listing/c.bin", b"12345")
        await provider.write_file(workspace, "/workspace/listing/a/inner.txt", b"not listed")
        await provider.write_file(workspace, "/workspace/listing/b.txt", b"123")
        entries = await provider.list_dir(workspace, "/workspace/listing")
        assert [(e.name, e.path, e.type) for e in entries] == [
            ("a", "/workspace/listing/a", "dir"),
            ("b.txt", "/workspace/listing/b.txt", "file"),
            ("c.bin", "/workspace/listing/c.bin", "file"),
        ]
        assert [e.size for e in entries[1:]] == [3, 5]

    async def test_stat_of_file_and_dir(self, provider: WorkspaceProvider, workspace: str) -> None:
        """stat reports name, absolute path, type, size and a modification time for files and directories."""
        await provider.write_file(workspace, "/workspace/stat/file.txt", b"hello")
        file_info = await provider.stat(workspace, "/workspace/stat/file.txt")
        assert (file_info.path, file_info.name, file_info.type, file_info.size) == (
            "/workspace/stat/file.txt",
            "file.txt",
            "file",
            5,
        )
        assert file_info.mtime > 0
        dir_info = await provider.stat(workspace, "/workspace/stat")
        assert (dir_info.path, dir_info.name, dir_info.type) == ("/workspace/stat", "stat", "dir")

    async def test_delete_file(self, provider: WorkspaceProvider, workspace: str) -> None:
        """A deleted file is gone."""
        await provider.write_file(workspace, "/workspace/doomed.txt", b"x")
        await provider.delete(workspace, "/workspace/doomed.txt")
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, "/workspace/doomed.txt")

    async def test_delete_directory_needs_recursive_when_not_empty(
        self, provider: WorkspaceProvider, workspace: str
    ) -> None:
        """A non-empty directory is deleted only with recursive; an empty one without."""
        await provider.write_file(workspace, "/workspace/full/sub/file.txt", b"x")
        with pytest.raises(FileOperationError):
            await provider.delete(workspace, "/workspace/full")
        assert await _read_all(provider, workspace, "/workspace/full/sub/file.txt") == b"x"
        await provider.delete(workspace, "/workspace/full", recursive=True)
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, "/workspace/full")

        await provider.write_file(workspace, "/workspace/empty/file.txt", b"x")
        await provider.delete(workspace, "/workspace/empty/file.txt")
        await provider.delete(workspace, "/workspace/empty")
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, "/workspace/empty")

    async def test_move_file_and_directory(self, provider: WorkspaceProvider, workspace: str) -> None:
        """move renames files and directories, creating the destination's missing parents."""
        await provider.write_file(workspace, "/workspace/mv/src.txt", b"file")
        await provider.move(workspace, "/workspace/mv/src.txt", "/workspace/mv/new/deeper/dst.txt")
        assert await _read_all(provider, workspace, "/workspace/mv/new/deeper/dst.txt") == b"file"
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, "/workspace/mv/src.txt")

        await provider.write_file(workspace, "/workspace/mv/dir/inner/f.txt", b"tree")
        await provider.move(workspace, "/workspace/mv/dir", "/workspace/mv/renamed")
        assert await _read_all(provider, workspace, "/workspace/mv/renamed/inner/f.txt") == b"tree"
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, "/workspace/mv/dir")

    async def test_chmod_and_write_mode(self, provider: WorkspaceProvider, workspace: str) -> None:
        """chmod sets the permission bits stat reports, and write_file(mode=...) sets them on creation."""
        await provider.write_file(workspace, "/workspace/perm.txt", b"x")
        await provider.chmod(workspace, "/workspace/perm.txt", 0o600)
        assert (await provider.stat(workspace, "/workspace/perm.txt")).mode == 0o600
        await provider.chmod(workspace, "/workspace/perm.txt", 0o755)
        assert (await provider.stat(workspace, "/workspace/perm.txt")).mode == 0o755
        await provider.write_file(workspace, "/workspace/with-mode.txt", b"x", mode=0o640)
        assert (await provider.stat(workspace, "/workspace/with-mode.txt")).mode == 0o640

    async def test_glob_matches_at_any_depth(self, provider: WorkspaceProvider, workspace: str) -> None:
        """`**/*.py` matches at every depth, including directly under root, and returns sorted absolute paths."""
        for path in ["g/top.py", "g/sub/b.py", "g/sub/deep/a.py", "g/sub/notes.txt", "elsewhere/x.py"]:
            await provider.write_file(workspace, f"/workspace/{path}", b"")
        found = await provider.glob(workspace, "**/*.py", root="/workspace/g")
        assert found == ["/workspace/g/sub/b.py", "/workspace/g/sub/deep/a.py", "/workspace/g/top.py"]
        limited = await provider.glob(workspace, "**/*.py", root="/workspace/g", limit=2)
        assert len(limited) == 2
        assert set(limited) <= set(found)

    async def test_realpath_normalises(self, provider: WorkspaceProvider, workspace: str) -> None:
        """realpath removes `.` and `..` and keeps a missing last component."""
        await provider.write_file(workspace, "/workspace/rp/sub/f.txt", b"")
        assert await provider.realpath(workspace, "/workspace/rp/./sub/../sub/f.txt") == "/workspace/rp/sub/f.txt"
        assert await provider.realpath(workspace, "/workspace/rp/missing.txt") == "/workspace/rp/missing.txt"

    async def test_dir_watch_reports_changes_by_relative_name(
        self, provider: WorkspaceProvider, workspace: str, capabilities: Capabilities
    ) -> None:
        """With capability dir_watch, a recursive watch reports a file, a new directory and a file inside it by their
        names relative to the watched directory; a missing directory raises WorkspaceFileNotFoundError."""
        _require(capabilities, "dir_watch", provider)
        assert isinstance(provider, DirWatcher), "capabilities().dir_watch is True but the provider has no watch_dir"
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.watch_dir(workspace, "/workspace/no-such-dir")
        await provider.write_file(workspace, "/workspace/watched/.keep", b"")
        events = await provider.watch_dir(workspace, "/workspace/watched", recursive=True)
        seen: list[tuple[str, str]] = []
        try:
            await provider.exec(
                workspace, ExecRequest("cd /workspace/watched && echo x > f.txt && mkdir d && echo y > d/g.txt")
            )

            async def until_nested() -> None:
                async for event in events:
                    seen.append((event.name, event.type))
                    if (event.name, event.type) == ("d/g.txt", "create"):
                        return

            await asyncio.wait_for(until_nested(), 30)
        finally:
            await events.aclose()
        assert ("f.txt", "create") in seen
        assert ("d", "create") in seen

    # -- confinement: beneath ---------------------------------------------------------------------------------------

    async def test_beneath_refuses_a_symlink_to_the_root_directory(
        self, provider: WorkspaceProvider, workspace: str
    ) -> None:
        """With beneath=/workspace, no file call follows a symlink to / out of /workspace, while the link itself can
        still be stat'ed and deleted."""
        await provider.write_file(workspace, f"{_SANDBOX_TMP}/outside.txt", b"outside")
        assert (await provider.exec(workspace, ExecRequest("ln -s / /workspace/rootlink"))).exit_code == 0
        outside = "/workspace/rootlink/tmp/outside.txt"
        refused = (
            provider.read_file(workspace, outside, beneath=WORKSPACE_ROOT),
            provider.write_file(workspace, "/workspace/rootlink/tmp/planted.txt", b"x", beneath=WORKSPACE_ROOT),
            provider.write_file(workspace, "/workspace/rootlink", b"x", beneath=WORKSPACE_ROOT),
            provider.list_dir(workspace, "/workspace/rootlink/tmp", beneath=WORKSPACE_ROOT),
            provider.stat(workspace, outside, beneath=WORKSPACE_ROOT),
            provider.chmod(workspace, outside, 0o600, beneath=WORKSPACE_ROOT),
            provider.delete(workspace, outside, beneath=WORKSPACE_ROOT),
            provider.move(workspace, outside, "/workspace/stolen.txt", beneath=WORKSPACE_ROOT),
            provider.move(workspace, "/workspace/rootlink", "/workspace/rootlink/tmp/moved", beneath=WORKSPACE_ROOT),
            provider.glob(workspace, "*", root="/workspace/rootlink/tmp", beneath=WORKSPACE_ROOT),
            provider.realpath(workspace, outside, beneath=WORKSPACE_ROOT),
            provider.read_file(workspace, f"{_SANDBOX_TMP}/outside.txt", beneath=WORKSPACE_ROOT),
        )
        for call in refused:
            with pytest.raises(InvalidRequestError, match="outside /workspace"):
                await call
        assert await _read_all(provider, workspace, f"{_SANDBOX_TMP}/outside.txt") == b"outside"
        assert (await provider.stat(workspace, f"{_SANDBOX_TMP}/outside.txt")).mode != 0o600
        for name in ("planted.txt", "moved"):
            with pytest.raises(WorkspaceFileNotFoundError):
                await provider.stat(workspace, f"{_SANDBOX_TMP}/{name}")
        link = await provider.stat(workspace, "/workspace/rootlink", beneath=WORKSPACE_ROOT)
        assert (link.type, link.symlink_target) == ("symlink", "/")
        assert "/workspace/rootlink" in await provider.glob(workspace, "*", beneath=WORKSPACE_ROOT)
        assert await provider.glob(workspace, "**/outside.txt", beneath=WORKSPACE_ROOT) == []
        await provider.delete(workspace, "/workspace/rootlink", beneath=WORKSPACE_ROOT)
        assert await _read_all(provider, workspace, f"{_SANDBOX_TMP}/outside.txt") == b"outside"

    async def test_beneath_follows_symlinks_that_stay_inside(self, provider: WorkspaceProvider, workspace: str) -> None:
        """With beneath=/workspace, relative and absolute symlinks that stay inside /workspace are followed."""
        await provider.write_file(workspace, "/workspace/real/data.txt", b"data", beneath=WORKSPACE_ROOT)
        script = "ln -s real /workspace/rel && ln -s /workspace/real /workspace/abs && ln -s rel/data.txt /workspace/f"
        assert (await provider.exec(workspace, ExecRequest(script))).exit_code == 0
        for path in ("/workspace/rel/data.txt", "/workspace/abs/data.txt", "/workspace/f", "rel/data.txt"):
            assert await _read_all_beneath(provider, workspace, path) == b"data"
        await provider.write_file(workspace, "/workspace/abs/new/written.txt", b"new", beneath=WORKSPACE_ROOT)
        assert await _read_all(provider, workspace, "/workspace/real/new/written.txt") == b"new"
        entries = await provider.list_dir(workspace, "/workspace/rel", beneath=WORKSPACE_ROOT)
        assert [(e.name, e.path) for e in entries] == [
            ("data.txt", "/workspace/rel/data.txt"),
            ("new", "/workspace/rel/new"),
        ]
        assert (
            await provider.realpath(workspace, "/workspace/abs/data.txt", beneath=WORKSPACE_ROOT)
            == "/workspace/real/data.txt"
        )
        assert (
            await provider.realpath(workspace, "/workspace/rel/missing", beneath=WORKSPACE_ROOT)
            == "/workspace/real/missing"
        )
        await provider.chmod(workspace, "/workspace/f", 0o600, beneath=WORKSPACE_ROOT)
        assert (await provider.stat(workspace, "/workspace/real/data.txt", beneath=WORKSPACE_ROOT)).mode == 0o600
        assert (await provider.stat(workspace, "/workspace/f", beneath=WORKSPACE_ROOT)).type == "symlink"
        await provider.move(
            workspace, "/workspace/rel/new/written.txt", "/workspace/abs/moved.txt", beneath=WORKSPACE_ROOT
        )
        assert await _read_all(provider, workspace, "/workspace/real/moved.txt") == b"new"
        found = await provider.glob(workspace, "*.txt", root="/workspace/rel", beneath=WORKSPACE_ROOT)
        assert found == ["/workspace/rel/data.txt", "/workspace/rel/moved.txt"]
        await provider.delete(workspace, "/workspace/abs/moved.txt", beneath=WORKSPACE_ROOT)
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, "/workspace/real/moved.txt")

    async def test_beneath_never_lets_dotdot_climb_above_the_root(
        self, provider: WorkspaceProvider, workspace: str
    ) -> None:
        """With beneath=/workspace, `..` (in the path or in a relative symlink) is refused above /workspace and
        works below it."""
        await provider.write_file(workspace, f"{_SANDBOX_TMP}/outside.txt", b"outside")
        await provider.write_file(workspace, "/workspace/sub/inner.txt", b"inner", beneath=WORKSPACE_ROOT)
        script = "ln -s ../../tmp /workspace/sub/up && ln -s ../sub /workspace/sub/sideways"
        assert (await provider.exec(workspace, ExecRequest(script))).exit_code == 0
        for path in ("/workspace/sub/up/outside.txt", "/workspace/../tmp/outside.txt", "../tmp/outside.txt"):
            with pytest.raises(InvalidRequestError, match="outside /workspace"):
                await provider.read_file(workspace, path, beneath=WORKSPACE_ROOT)
        with pytest.raises(InvalidRequestError, match="outside /workspace"):
            await provider.write_file(workspace, "/workspace/sub/up/planted.txt", b"x", beneath=WORKSPACE_ROOT)
        with pytest.raises(WorkspaceFileNotFoundError):
            await provider.stat(workspace, f"{_SANDBOX_TMP}/planted.txt")
        assert await _read_all_beneath(provider, workspace, "/workspace/sub/sideways/inner.txt") == b"inner"
        assert await _read_all_beneath(provider, workspace, "/workspace/sub/../sub/inner.txt") == b"inner"
