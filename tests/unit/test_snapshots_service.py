"""SnapshotService and reconcile_snapshots over the fake provider and a real SQLite store.

The fake keeps a snapshot as a copy of the workspace's in-memory file system, so "the files" of a snapshot are what
``list_snapshots()`` holds; calls are wrapped where a test must look at the record while the provider works.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from corral.errors import (
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    SnapshotNotFoundError,
    WorkspaceStateError,
)
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.orchestrator.snapshots import MAX_FORKS, SnapshotService, reconcile_snapshots
from corral.providers.base import ExecRequest, SnapshotInfo, WorkspaceSpec, WorkspaceState
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import SnapshotRecord, Store

pytestmark = pytest.mark.unit

PROVIDER = "gvisor"
FILE = b"x" * 1000
"""What every source workspace holds (in /workspace/data.bin): its snapshots are 1000 bytes."""


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* / E2B_API_KEY variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture
def provider() -> FakeProvider:
    """The one backend: a gVisor stand-in that keeps snapshots in memory."""
    return FakeProvider(PROVIDER, isolation="gvisor")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    """A SQLite store in a temporary file."""
    store = await Store.open(Settings(data_dir=tmp_path, providers=PROVIDER).sqlalchemy_url())
    yield store
    await store.close()


@pytest.fixture
async def service(tmp_path: Path, store: Store, provider: FakeProvider) -> WorkspaceService:
    """A workspace service over the fake, health checked once."""
    settings = Settings(data_dir=tmp_path, providers=PROVIDER)
    monitor = HealthMonitor({PROVIDER: provider}, settings.health_interval_s)
    await monitor.check_all()
    return WorkspaceService(settings, store, {PROVIDER: provider}, monitor)


@pytest.fixture
def snapshots(service: WorkspaceService, store: Store) -> SnapshotService:
    """The snapshot service with room for ten 1000-byte snapshots."""
    return SnapshotService(service, store, storage_limit=10 * len(FILE))


@pytest.fixture
async def source(service: WorkspaceService) -> str:
    """A ready workspace holding /workspace/data.bin."""
    record = await service.create(CreateWorkspace(provider=PROVIDER))
    await service.write_file(record.id, "/workspace/data.bin", FILE)
    return record.id


async def _read(service: WorkspaceService, workspace_id: str, path: str) -> bytes:
    return b"".join([chunk async for chunk in await service.read_file(workspace_id, path)])


def _wrap(
    provider: FakeProvider, method: str, before: Callable[..., Awaitable[None]], *, after: bool = False
) -> list[tuple[object, ...]]:
    """Replace ``provider.<method>`` by one that awaits ``before(*args)`` first (or, with ``after``, once the real
    call returned); returns the list of the calls' arguments."""
    real = getattr(provider, method)
    seen: list[tuple[object, ...]] = []

    async def wrapped(*args: object) -> object:
        seen.append(args)
        if not after:
            await before(*args)
        result = await real(*args)
        if after:
            await before(*args)
        return result

    setattr(provider, method, wrapped)
    return seen


async def _nothing(*args: object) -> None:
    """A ``before`` hook that does nothing."""


# --- create -------------------------------------------------------------------------------------------------------


async def test_record_is_written_before_the_files_and_creating_meanwhile(
    snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str
) -> None:
    """While the provider writes the snapshot its record already exists as "creating" with no files yet; afterwards
    it is "ready" with the kind and size the provider reported."""
    during: list[tuple[list[SnapshotRecord], list[str]]] = []

    async def look(workspace_id: object, snapshot_id: object) -> None:
        during.append((await store.snapshots.list(workspace_id=source), await provider.list_snapshots()))

    _wrap(provider, "snapshot", look)
    record = await snapshots.create(source, name="first")
    [(records, files)] = during
    assert [(r.id, r.status, r.name) for r in records] == [(record.id, "creating", "first")]
    assert files == []
    assert (record.status, record.kind, record.size_bytes) == ("ready", "filesystem", len(FILE))
    assert await provider.list_snapshots() == [record.id]
    assert (await snapshots.get(record.id)).status == "ready"


async def test_a_bad_name_is_refused_before_anything_is_written(
    snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str
) -> None:
    """A name with a slash is refused with a message saying what names may hold; no record, no files."""
    with pytest.raises(InvalidRequestError, match="letters, digits"):
        await snapshots.create(source, name="a/b")
    assert (await store.snapshots.list(), await provider.list_snapshots()) == ([], [])


async def test_storage_limit_refuses_a_snapshot_once_the_total_is_at_the_limit(
    service: WorkspaceService, store: Store, provider: FakeProvider, source: str
) -> None:
    """With snapshots already holding exactly the limit, a new one is refused naming both sizes and the setting,
    before any record or file is written."""
    snapshots = SnapshotService(service, store, storage_limit=len(FILE))
    first = await snapshots.create(source)
    with pytest.raises(ResourceLimitError, match="snapshot storage is full") as caught:
        await snapshots.create(source)
    assert "hold 1000 B and this one would add about 1000 B, past the 1000 B limit" in caught.value.message
    assert "(CORRAL_SNAPSHOT_STORAGE_LIMIT); delete some first" in caught.value.message
    assert [r.id for r in await store.snapshots.list()] == [first.id]
    assert await provider.list_snapshots() == [first.id]


async def test_storage_limit_refuses_a_snapshot_whose_estimate_would_pass_it(
    service: WorkspaceService, store: Store, provider: FakeProvider, source: str
) -> None:
    """Below the limit, a snapshot the provider expects to take the total past it is refused up front, naming
    what is held, the estimate and the limit; nothing is written."""
    snapshots = SnapshotService(service, store, storage_limit=len(FILE) + 500)
    first = await snapshots.create(source)
    with pytest.raises(ResourceLimitError, match=r"would add about 1000 B, past the 1\.5 KiB limit"):
        await snapshots.create(source)
    assert [r.id for r in await store.snapshots.list()] == [first.id]
    assert await provider.list_snapshots() == [first.id]


async def test_a_snapshot_that_passes_the_limit_is_removed(
    service: WorkspaceService, store: Store, provider: FakeProvider, source: str
) -> None:
    """When the provider cannot tell the size beforehand (estimate 0), a snapshot whose size takes the total past
    the limit is removed again (files and record), with an error naming its size, the total and the limit."""
    snapshots = SnapshotService(service, store, storage_limit=len(FILE) + 500)
    first = await snapshots.create(source)

    async def unknown(workspace_id: str) -> int:
        return 0

    provider.snapshot_estimate = unknown  # type: ignore[method-assign]  # a provider that cannot estimate
    with pytest.raises(ResourceLimitError, match="limit passed") as caught:
        await snapshots.create(source)
    assert "holds 1000" in caught.value.message
    assert "to 2.0 KiB of the 1.5 KiB limit" in caught.value.message
    assert "it was removed" in caught.value.message
    assert [r.id for r in await store.snapshots.list()] == [first.id]
    assert await provider.list_snapshots() == [first.id]


async def test_a_failing_provider_snapshot_leaves_an_error_record_and_no_files(
    snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str
) -> None:
    """When the provider fails after writing part of the snapshot, its files are removed and the record stays as
    "error" with the provider's reason; the error is raised to the caller."""

    async def fail(workspace_id: object, snapshot_id: object) -> None:
        raise ProviderUnavailableError(PROVIDER, "checkpoint failed: disk full")

    _wrap(provider, "snapshot", fail, after=True)  # the fake wrote the copy; then the "provider" fails
    with pytest.raises(ProviderUnavailableError, match="disk full"):
        await snapshots.create(source)
    [record] = await store.snapshots.list()
    assert record.status == "error"
    assert record.error is not None
    assert "disk full" in record.error
    assert await provider.list_snapshots() == []
    assert await store.snapshots.total_size() == 0


async def test_a_snapshot_of_a_stopped_workspace_is_refused(
    service: WorkspaceService, snapshots: SnapshotService, store: Store, source: str
) -> None:
    """Only a ready workspace can be snapshotted: a stopped one is refused and no record is written."""
    await service.stop(source)
    with pytest.raises(WorkspaceStateError, match="stopped"):
        await snapshots.create(source)
    assert await store.snapshots.list() == []


# --- delete and restore -------------------------------------------------------------------------------------------


async def test_delete_removes_the_files_then_the_record(
    snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str
) -> None:
    """Delete removes the provider's files while the record still exists, then the record; a second delete is a
    SnapshotNotFoundError naming the id."""
    record = await snapshots.create(source)
    seen: list[SnapshotRecord | None] = []

    async def look(snapshot_id: object) -> None:
        seen.append(await store.snapshots.get(record.id))

    _wrap(provider, "delete_snapshot", look)
    await snapshots.delete(record.id)
    assert [s.id if s else None for s in seen] == [record.id]
    assert await store.snapshots.get(record.id) is None
    assert await provider.list_snapshots() == []
    with pytest.raises(SnapshotNotFoundError, match=record.id):
        await snapshots.delete(record.id)


async def test_restore_makes_a_new_ready_workspace_with_the_files(
    service: WorkspaceService, snapshots: SnapshotService, provider: FakeProvider, source: str
) -> None:
    """A restore gives a new ready workspace on the same provider with the snapshot's files, marked with the
    snapshot it came from; later writes in the source do not reach it."""
    snapshot = await snapshots.create(source)
    await service.write_file(source, "/workspace/data.bin", b"changed")
    restored = await snapshots.restore(snapshot.id, metadata={"purpose": "test"})
    assert restored.id != source
    assert (restored.status, restored.provider) == ("ready", PROVIDER)
    assert restored.metadata == {"purpose": "test", "from_snapshot": snapshot.id}
    assert await provider.state(restored.id) is WorkspaceState.RUNNING
    assert await _read(service, restored.id, "/workspace/data.bin") == FILE


@pytest.mark.parametrize("status", ["creating", "error"])
async def test_restore_of_a_snapshot_that_is_not_ready_is_refused(
    snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str, status: str
) -> None:
    """A snapshot still being taken, or one that failed, cannot be restored: the error names its status (and its
    error) and no workspace is made."""
    record = await store.snapshots.create(
        workspace_id=source,
        provider=PROVIDER,
        base_image="img",
        container_type="agent_workspace",
        network="isolated",
        resource_limits={},
        status=status,  # type: ignore[arg-type]  # one of the two parametrized statuses
    )
    if status == "error":
        await store.snapshots.update(record.id, error="checkpoint failed")
    before = await provider.list_workspaces()
    with pytest.raises(WorkspaceStateError, match=f"is {status}") as caught:
        await snapshots.restore(record.id)
    assert "only a ready snapshot can be restored" in caught.value.message
    assert ("checkpoint failed" in caught.value.message) == (status == "error")
    assert await provider.list_workspaces() == before


async def test_restore_of_an_unknown_snapshot_is_not_found(snapshots: SnapshotService) -> None:
    """Restoring an id that has no record raises SnapshotNotFoundError naming it."""
    with pytest.raises(SnapshotNotFoundError, match="nosuchsnapshot"):
        await snapshots.restore("nosuchsnapshot")


# --- fork ---------------------------------------------------------------------------------------------------------


async def test_fork_makes_independent_workspaces_and_drops_its_snapshot(
    service: WorkspaceService, snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str
) -> None:
    """A fork of three gives three ready workspaces with the source's file whose writes stay their own; the source
    keeps running and the fork's snapshot is gone afterwards (record and files)."""
    forks = await snapshots.fork(source, 3)
    assert len({source, *(f.id for f in forks)}) == 4
    assert all(f.status == "ready" and f.metadata["forked_from"] == source for f in forks)
    for i, fork in enumerate(forks):
        assert await _read(service, fork.id, "/workspace/data.bin") == FILE
        await service.write_file(fork.id, "/workspace/data.bin", f"fork {i}".encode())
    assert [await _read(service, f.id, "/workspace/data.bin") for f in forks] == [b"fork 0", b"fork 1", b"fork 2"]
    assert await _read(service, source, "/workspace/data.bin") == FILE
    assert (await service.exec(source, ExecRequest("true"))).exit_code == 0
    assert (await store.snapshots.list(), await provider.list_snapshots()) == ([], [])


async def test_fork_is_all_or_nothing(
    service: WorkspaceService, snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str
) -> None:
    """When one of three restores fails, the fork raises that failure and leaves no fork behind: the restored
    workspaces are destroyed, the failed one is in error, and the snapshot is deleted."""
    calls = 0

    async def second_fails(spec: object, snapshot_id: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ProviderUnavailableError(PROVIDER, "restore failed: out of memory")

    _wrap(provider, "restore", second_fails)
    with pytest.raises(ProviderUnavailableError, match="out of memory"):
        await snapshots.fork(source, 3)
    assert await provider.list_workspaces() == [source]
    forks = [r for r in await store.workspaces.list(include_destroyed=True) if r.id != source]
    assert sorted(r.status for r in forks) == ["destroyed", "destroyed", "error"]
    assert (await store.snapshots.list(), await provider.list_snapshots()) == ([], [])


@pytest.mark.parametrize("count", [0, MAX_FORKS + 1, True, -1])
async def test_fork_count_outside_1_to_16_is_refused(
    snapshots: SnapshotService, store: Store, provider: FakeProvider, source: str, count: int
) -> None:
    """A fork count of 0, 17, a bool or a negative number is refused naming the field and the allowed range,
    before any snapshot is taken."""
    with pytest.raises(InvalidRequestError, match=r"count: .* fork makes 1 to 16 workspaces") as caught:
        await snapshots.fork(source, count)
    assert caught.value.details == {"field": "count"}
    assert ("snapshot", source) not in provider.calls
    assert await store.snapshots.list() == []


# --- reconcile ----------------------------------------------------------------------------------------------------


async def _record(store: Store, snapshot_id: str, *, provider: str = PROVIDER, status: str = "ready") -> None:
    await store.snapshots.create(
        id=snapshot_id,
        workspace_id="source",
        provider=provider,
        base_image="img",
        container_type="agent_workspace",
        network="isolated",
        resource_limits={},
        status=status,  # type: ignore[arg-type]  # the statuses the tests pass are valid
    )


async def _files(provider: FakeProvider, source: str, snapshot_id: str) -> SnapshotInfo:
    return await provider.snapshot(source, snapshot_id)


async def test_reconcile_matches_records_and_host_snapshots(
    service: WorkspaceService, store: Store, provider: FakeProvider, source: str
) -> None:
    """After a restart: host snapshots without a record are deleted, "creating" records are failed and their files
    deleted, "ready" records whose files vanished are marked error, and a ready snapshot with its files is kept."""
    await _files(provider, source, "orphan")
    await _record(store, "interrupted", status="creating")
    await _files(provider, source, "interrupted")
    await _record(store, "vanished")
    await _record(store, "healthy")
    await _files(provider, source, "healthy")

    report = await reconcile_snapshots(service, store)

    assert (report.orphans_deleted, report.interrupted, report.vanished) == (["orphan"], ["interrupted"], ["vanished"])
    assert await provider.list_snapshots() == ["healthy"]
    interrupted, vanished, healthy = [await store.snapshots.get(i) for i in ("interrupted", "vanished", "healthy")]
    assert interrupted is not None
    assert (interrupted.status, interrupted.error) == (
        "error",
        "the server stopped while this snapshot was being taken",
    )
    assert vanished is not None
    assert (vanished.status, vanished.error) == ("error", "its files vanished from the host")
    assert healthy is not None
    assert healthy.status == "ready"
    again = await reconcile_snapshots(service, store)
    assert (again.orphans_deleted, again.interrupted, again.vanished) == ([], [], [])


async def test_reconcile_deletes_what_a_failed_snapshot_left(
    service: WorkspaceService, store: Store, provider: FakeProvider, source: str
) -> None:
    """Files still held for an "error" record (its cleanup failed) are deleted; the record stays to say why."""
    await _record(store, "failed", status="error")
    await _files(provider, source, "failed")
    report = await reconcile_snapshots(service, store)
    assert report.leftovers_deleted == ["failed"]
    assert await provider.list_snapshots() == []
    record = await store.snapshots.get("failed")
    assert record is not None
    assert record.status == "error"


async def test_reconcile_leaves_snapshots_of_providers_not_configured_alone(
    service: WorkspaceService, store: Store, provider: FakeProvider
) -> None:
    """Records of a provider this server does not run keep their status, whatever it is."""
    await _record(store, "elsewhere-ready", provider="firecracker")
    await _record(store, "elsewhere-creating", provider="firecracker", status="creating")
    report = await reconcile_snapshots(service, store)
    assert (report.orphans_deleted, report.interrupted, report.vanished) == ([], [], [])
    assert [(r.id, r.status) for r in await store.snapshots.list()] == [
        ("elsewhere-creating", "creating"),
        ("elsewhere-ready", "ready"),
    ]


async def test_reconcile_deletes_host_snapshots_recorded_for_another_provider(
    service: WorkspaceService, store: Store, provider: FakeProvider, source: str
) -> None:
    """A host snapshot whose id is recorded for a different provider is an orphan here: it is deleted, and the
    other provider's record is left as it is."""
    await _record(store, "shared-id", provider="firecracker")
    await _files(provider, source, "shared-id")
    report = await reconcile_snapshots(service, store)
    assert report.orphans_deleted == ["shared-id"]
    assert await provider.list_snapshots() == []
    record = await store.snapshots.get("shared-id")
    assert record is not None
    assert (record.provider, record.status) == ("firecracker", "ready")


async def test_restored_spec_carries_the_snapshot_image(
    snapshots: SnapshotService, provider: FakeProvider, source: str
) -> None:
    """The provider is asked to restore with a spec built from the snapshot's record (its image and limits)."""
    snapshot = await snapshots.create(source)
    specs = _wrap(provider, "restore", _nothing)
    restored = await snapshots.restore(snapshot.id)
    [(spec, snapshot_id)] = specs
    assert isinstance(spec, WorkspaceSpec)
    assert (spec.id, spec.image, snapshot_id) == (restored.id, snapshot.base_image, snapshot.id)
