"""The store's behaviour, run on SQLite always and on PostgreSQL when ``CORRAL_TEST_POSTGRES_URL`` is set.

``bash scripts/postgres.sh`` starts a local PostgreSQL and prints the URL to export. Every PostgreSQL test gets a
database of its own, created from that URL's connection and dropped afterwards.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, make_url, text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import corral.store
from corral.errors import CorralError, InvalidRequestError, SnapshotNotFoundError, WorkspaceNotFoundError
from corral.store import (
    ProviderAttempt,
    SnapshotRecord,
    Store,
    ToolCall,
    WorkspaceRecord,
    alembic_config,
    async_url,
    migrate,
)
from corral.store.models import Base

POSTGRES_URL_ENV = "CORRAL_TEST_POSTGRES_URL"
TABLES = {"workspaces", "agent_types", "sessions", "audit_entries", "snapshots"}


@pytest.fixture(
    params=[
        pytest.param("sqlite", marks=pytest.mark.unit, id="sqlite"),
        pytest.param("postgresql", marks=pytest.mark.integration, id="postgresql"),
    ]
)
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A URL to an empty database of the parametrized kind, removed after the test."""
    if request.param == "sqlite":
        # A directory that does not exist yet: opening the store must create it.
        yield f"sqlite:///{tmp_path / 'data' / 'corral.db'}"
        return
    admin_url = os.environ.get(POSTGRES_URL_ENV)
    if not admin_url:
        pytest.skip(f"{POSTGRES_URL_ENV} is not set; run `bash scripts/postgres.sh` and export the URL it prints")
    name = f"corral_test_{uuid.uuid4().hex[:16]}"
    admin = create_async_engine(async_url(admin_url), isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        try:
            async with admin.connect() as connection:
                await connection.execute(text(f'CREATE DATABASE "{name}"'))
        except ProgrammingError as exc:
            pytest.fail(f"cannot create a test database with {POSTGRES_URL_ENV} (the role needs CREATEDB): {exc}")
        try:
            yield async_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            async with admin.connect() as connection:
                await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    """An open, migrated store on the parametrized database."""
    opened = await Store.open(database_url)
    async with opened:
        yield opened


async def _workspace(store: Store, **overrides: Any) -> WorkspaceRecord:
    fields: dict[str, Any] = {
        "requested_provider": "auto",
        "container_type": "agent_workspace",
        "resource_limits": {"cpu": "2", "memory": "4G", "disk": "10G"},
        "network": "isolated",
        "base_image": "corral/workspace:base",
    }
    fields.update(overrides)
    return await store.workspaces.create(**fields)


def _table_names(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _schema_diff(connection: Connection) -> list[Any]:
    return list(compare_metadata(MigrationContext.configure(connection), Base.metadata))


# --- migrations ------------------------------------------------------------------------------------------------------


async def test_migrations_create_the_tables_and_a_second_run_changes_nothing(store: Store) -> None:
    """Opening the store creates every table at the newest revision, and migrating again keeps schema and data."""
    async with store.engine.connect() as connection:
        assert TABLES | {"alembic_version"} <= await connection.run_sync(_table_names)
    created = await _workspace(store)

    await migrate(store.engine)

    async with store.engine.connect() as connection:
        versions = (await connection.execute(text("SELECT version_num FROM alembic_version"))).scalars().all()
    assert versions == ["0002"]
    assert await store.workspaces.get(created.id) == created


async def test_migrations_match_the_models(store: Store) -> None:
    """Alembic finds no difference between the migrated schema and the models, so no migration is missing."""
    async with store.engine.connect() as connection:
        assert await connection.run_sync(_schema_diff) == []


# --- workspaces ------------------------------------------------------------------------------------------------------


async def test_workspace_create_and_get_round_trip_every_field(store: Store) -> None:
    """A created workspace reads back equal, with JSON columns intact and timestamps timezone-aware UTC."""
    metadata = {"owner": "zoë", "nested": {"list": [1, 2.5, None, True], "empty": {}}, "n": 3}
    attempts = (ProviderAttempt("firecracker", "KVM is not available"), ProviderAttempt("gvisor", "runsc missing"))
    created = await _workspace(
        store,
        provider="docker",
        metadata=metadata,
        warnings=["reduced isolation: plain Docker (runc)"],
        provider_attempts=attempts,
        status="ready",
    )

    fetched = await store.workspaces.get(created.id)

    assert fetched == created
    assert fetched is not None
    assert len(fetched.id) == 32
    assert fetched.metadata == metadata
    assert fetched.resource_limits == {"cpu": "2", "memory": "4G", "disk": "10G"}
    assert fetched.provider_attempts == attempts
    assert fetched.warnings == ("reduced isolation: plain Docker (runc)",)
    assert fetched.from_warm_pool is False
    assert fetched.created_at.tzinfo == UTC
    assert abs(datetime.now(UTC) - fetched.created_at) < timedelta(minutes=1)
    assert fetched.last_used_at is None
    assert fetched.destroyed_at is None


async def test_workspace_get_of_an_unknown_id_is_none_and_update_raises_not_found(store: Store) -> None:
    """Reading a missing workspace gives None; changing one raises WorkspaceNotFoundError."""
    assert await store.workspaces.get("0" * 32) is None
    with pytest.raises(WorkspaceNotFoundError, match=r"0{32}"):
        await store.workspaces.update("0" * 32, error="x")
    with pytest.raises(WorkspaceNotFoundError):
        await store.workspaces.mark_status("0" * 32, "ready")
    with pytest.raises(WorkspaceNotFoundError):
        await store.workspaces.add_warnings("0" * 32, "w")


async def test_workspace_delete_removes_only_that_record(store: Store) -> None:
    """delete() removes the record for good (a failed create nobody kept); a second delete finds nothing."""
    gone, kept = await _workspace(store, id="d" * 16), await _workspace(store, id="e" * 16)
    assert await store.workspaces.delete(gone.id) is True
    assert await store.workspaces.get(gone.id) is None
    assert await store.workspaces.delete(gone.id) is False
    assert [r.id for r in await store.workspaces.list(include_destroyed=True)] == [kept.id]


async def test_workspace_duplicate_id_is_an_invalid_request(store: Store) -> None:
    """Creating a workspace with an id already in use raises InvalidRequestError naming the id."""
    await _workspace(store, id="a" * 32)
    with pytest.raises(InvalidRequestError, match=r"a{32}"):
        await _workspace(store, id="a" * 32)


async def test_workspace_list_filters_by_status_and_hides_destroyed(store: Store) -> None:
    """Listing skips destroyed workspaces unless asked, filters by one or several statuses, and keeps creation order."""
    ready = await _workspace(store, status="ready")
    stopped = await _workspace(store, status="stopped")
    gone = await _workspace(store, status="ready")
    await store.workspaces.mark_status(gone.id, "destroyed")

    assert [w.id for w in await store.workspaces.list()] == [ready.id, stopped.id]
    assert [w.id for w in await store.workspaces.list(status="ready")] == [ready.id]
    assert [w.id for w in await store.workspaces.list(status=["ready", "stopped"])] == [ready.id, stopped.id]
    assert [w.id for w in await store.workspaces.list(status="destroyed")] == [gone.id]
    assert [w.id for w in await store.workspaces.list(include_destroyed=True)] == [ready.id, stopped.id, gone.id]


async def test_workspace_update_changes_only_the_given_fields(store: Store) -> None:
    """An update writes the fields it names, refreshes updated_at, and leaves every other field as it was."""
    created = await _workspace(store, metadata={"keep": "me"})
    used_at = datetime(2030, 1, 2, 3, 4, 5, 600_000, tzinfo=UTC)

    updated = await store.workspaces.update(
        created.id, status="ready", provider="gvisor", last_used_at=used_at, error=None
    )

    assert (updated.status, updated.provider, updated.last_used_at) == ("ready", "gvisor", used_at)
    assert updated.metadata == {"keep": "me"}
    assert updated.resource_limits == created.resource_limits
    assert updated.created_at == created.created_at
    assert updated.updated_at >= created.updated_at
    assert await store.workspaces.get(created.id) == updated


async def test_workspace_timestamps_in_other_zones_come_back_as_utc(store: Store) -> None:
    """A timezone-aware time in another zone is stored as the same instant and read back in UTC."""
    created = await _workspace(store)
    eastern = datetime(2030, 6, 1, 12, 0, tzinfo=UTC).astimezone(timezone(timedelta(hours=-5)))

    updated = await store.workspaces.update(created.id, last_used_at=eastern)

    assert updated.last_used_at == eastern
    assert updated.last_used_at is not None
    assert updated.last_used_at.tzinfo == UTC


async def test_mark_destroyed_records_the_time_and_leaves_the_pool(store: Store) -> None:
    """Marking a pooled workspace destroyed sets destroyed_at and clears its pool key."""
    created = await _workspace(store, status="ready", pool_key="docker:base")

    destroyed = await store.workspaces.mark_status(created.id, "destroyed", error="gone from the runtime")

    assert destroyed.status == "destroyed"
    assert destroyed.destroyed_at is not None
    assert destroyed.pool_key is None
    assert destroyed.error == "gone from the runtime"


async def test_concurrent_updates_of_different_fields_on_one_workspace_all_survive(store: Store) -> None:
    """Twenty concurrent updates, each setting one of five fields, leave every field with a value one of them wrote."""
    created = await _workspace(store, metadata={"initial": True})
    base_time = datetime(2030, 1, 1, tzinfo=UTC)
    writers: dict[str, Any] = {
        "provider": lambda i: f"provider-{i}",
        "error": lambda i: f"error-{i}",
        "pool_key": lambda i: f"pool-{i}",
        "metadata": lambda i: {"writer": i},
        "last_used_at": lambda i: base_time + timedelta(seconds=i),
    }
    names = list(writers)
    written: dict[str, list[Any]] = {name: [] for name in names}
    updates = []
    for i in range(20):
        name = names[i % len(names)]
        value = writers[name](i)
        written[name].append(value)
        updates.append(store.workspaces.update(created.id, **{name: value}))

    await asyncio.gather(*updates)

    final = await store.workspaces.get(created.id)
    assert final is not None
    for name in names:
        assert getattr(final, name) in written[name], name
    assert (final.status, final.requested_provider, final.warnings) == ("creating", "auto", ())


async def test_concurrent_warning_appends_keep_every_warning(store: Store) -> None:
    """Twenty concurrent add_warnings calls on one workspace lose none, and a repeated warning is stored once."""
    created = await _workspace(store, warnings=["first"])

    await asyncio.gather(*(store.workspaces.add_warnings(created.id, f"warning {i}", "first") for i in range(20)))

    final = await store.workspaces.get(created.id)
    assert final is not None
    assert final.warnings[0] == "first"
    assert sorted(final.warnings[1:]) == sorted(f"warning {i}" for i in range(20))


async def test_claims_from_a_warm_pool_never_hand_out_a_workspace_twice(store: Store) -> None:
    """Ten concurrent claims on a pool of five ready workspaces get the five exactly once, then nothing."""
    pooled = {(await _workspace(store, status="ready", pool_key="docker:base")).id for _ in range(5)}
    await _workspace(store, status="creating", pool_key="docker:base")  # not ready: never claimed
    await _workspace(store, status="ready", pool_key="gvisor:base")  # another pool

    claims = await asyncio.gather(*(store.workspaces.claim_from_pool("docker:base") for _ in range(10)))

    claimed = [c for c in claims if c is not None]
    assert sorted(c.id for c in claimed) == sorted(pooled)
    assert all(c.pool_key is None and c.from_warm_pool and c.last_used_at is not None for c in claimed)
    assert await store.workspaces.claim_from_pool("docker:base") is None
    assert len(await store.workspaces.list(pool_key="gvisor:base")) == 1


async def test_a_claim_writes_the_fields_it_is_given_and_keeps_the_others(store: Store) -> None:
    """Claims with different sets of fields (each its own prepared statement) write exactly those fields."""
    kept = {"image": "corral/workspace:base", "size": "small"}
    for _ in range(2):
        await _workspace(store, status="ready", pool_key="docker:base", metadata=kept, warnings=["pool warning"])

    given = await store.workspaces.claim_from_pool(
        "docker:base",
        requested_provider="docker",
        container_type="agent_workspace",
        metadata={"session_id": "s1"},
        warnings=["claimed"],
        provider_attempts=[ProviderAttempt("gvisor", "runsc is missing")],
    )
    bare = await store.workspaces.claim_from_pool("docker:base")

    assert given is not None and bare is not None and given.id != bare.id
    assert given.metadata == {"session_id": "s1"} and list(given.warnings) == ["claimed"]
    assert (given.requested_provider, given.container_type) == ("docker", "agent_workspace")
    assert list(given.provider_attempts) == [ProviderAttempt("gvisor", "runsc is missing")]
    assert bare.metadata == kept and list(bare.warnings) == ["pool warning"]
    assert await store.workspaces.get(given.id) == given
    assert await store.workspaces.get(bare.id) == bare


async def test_short_transactions_run_in_one_call_on_a_sqlite_file(store: Store, database_url: str) -> None:
    """On a SQLite file the whole transaction runs on the store's worker thread (one wake-up of the event loop, not
    one per statement); on PostgreSQL it runs through the async engine."""
    sqlite = database_url.startswith("sqlite")
    seen: list[str] = []

    def work(connection: Any) -> int:
        seen.append(threading.current_thread().name)
        return int(connection.execute(text("SELECT 41 + 1")).scalar_one())

    assert store.transactions.one_call is sqlite
    assert await store.transactions.run(work) == 42
    assert seen[0].startswith("corral-db") if sqlite else seen[0] == threading.main_thread().name, seen


async def test_a_short_transaction_that_raises_leaves_nothing_behind(store: Store) -> None:
    """A failure inside the work rolls back what it wrote before failing."""
    created = await _workspace(store)

    def work(connection: Any) -> None:
        connection.execute(text("UPDATE workspaces SET status = 'error' WHERE id = :id"), {"id": created.id})
        raise RuntimeError("half way")

    with pytest.raises(RuntimeError, match="half way"):
        await store.transactions.run(work)
    assert await store.workspaces.get(created.id) == created


async def test_a_store_used_after_close_still_answers(database_url: str) -> None:
    """A shutdown's late writer (a provisioning task finishing) still gets its claim: the store reconnects as the
    async engine always did, instead of failing on a stopped worker thread."""
    store = await Store.open(database_url)
    pooled = await _workspace(store, status="ready", pool_key="docker:base")
    await store.close()
    try:
        claimed = await store.workspaces.claim_from_pool("docker:base")
        assert claimed is not None and claimed.id == pooled.id
    finally:
        await store.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_claim_waiting_for_the_sqlite_write_lock_leaves_the_event_loop_free(
    store: Store, database_url: str
) -> None:
    """Another writer holds SQLite's lock: the claim waits for it on the worker thread while the event loop keeps
    running, and succeeds once the lock is released."""
    pooled = await _workspace(store, status="ready", pool_key="docker:base")
    holder = sqlite3.connect(make_url(database_url).database or "", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # the database's write lock, until the rollback below
        claim = asyncio.create_task(store.workspaces.claim_from_pool("docker:base"))
        # A claim run on the event loop's thread would hold it here until SQLite's busy timeout failed the claim.
        await asyncio.sleep(0.2)
        assert not claim.done()
        holder.execute("ROLLBACK")
        claimed = await asyncio.wait_for(claim, 10)
    finally:
        holder.close()
    assert claimed is not None and claimed.id == pooled.id


# --- snapshots -------------------------------------------------------------------------------------------------------


async def _snapshot(store: Store, **overrides: Any) -> SnapshotRecord:
    fields: dict[str, Any] = {
        "workspace_id": "w" * 32,
        "provider": "gvisor",
        "base_image": "corral/workspace:base",
        "container_type": "agent_workspace",
        "network": "isolated",
        "resource_limits": {"cpu": "2", "memory": "4G", "disk": "10G"},
    }
    fields.update(overrides)
    return await store.snapshots.create(**fields)


async def test_workspace_paused_status_is_stored_and_filtered(store: Store) -> None:
    """A workspace moved to "paused" reads back paused and is found by a status filter naming it, and only by that."""
    paused = await store.workspaces.mark_status((await _workspace(store, status="ready")).id, "paused")
    ready = await _workspace(store, status="ready")

    assert paused.status == "paused"
    assert [w.id for w in await store.workspaces.list(status="paused")] == [paused.id]
    assert [w.id for w in await store.workspaces.list(status="ready")] == [ready.id]
    assert [w.id for w in await store.workspaces.list()] == [paused.id, ready.id]


async def test_snapshot_create_and_get_round_trip_every_field(store: Store) -> None:
    """A created snapshot reads back equal: defaults filled in (filesystem, creating, 0 bytes), JSON intact, UTC."""
    metadata = {"label": "zoë", "nested": {"list": [1, 2.5, None, True]}}

    created = await _snapshot(store, name="after-setup", metadata=metadata, setup_key="k" * 64)
    fetched = await store.snapshots.get(created.id)

    assert fetched == created
    assert fetched is not None
    assert len(fetched.id) == 32 and int(fetched.id, 16) >= 0
    assert (fetched.name, fetched.workspace_id, fetched.provider) == ("after-setup", "w" * 32, "gvisor")
    assert (fetched.kind, fetched.status, fetched.size_bytes, fetched.error) == ("filesystem", "creating", 0, None)
    assert (fetched.base_image, fetched.container_type, fetched.network) == (
        "corral/workspace:base",
        "agent_workspace",
        "isolated",
    )
    assert fetched.resource_limits == {"cpu": "2", "memory": "4G", "disk": "10G"}
    assert fetched.metadata == metadata
    assert fetched.setup_key == "k" * 64
    assert fetched.created_at.tzinfo == UTC and fetched.updated_at.tzinfo == UTC
    assert abs(datetime.now(UTC) - fetched.created_at) < timedelta(minutes=1)

    chosen = await _snapshot(store, id="c" * 32, kind="memory", status="ready")
    assert (chosen.id, chosen.kind, chosen.status, chosen.name, chosen.metadata, chosen.setup_key) == (
        "c" * 32,
        "memory",
        "ready",
        None,
        {},
        None,
    )
    assert await store.snapshots.get("c" * 32) == chosen


async def test_snapshot_unknown_id_reads_none_deletes_false_and_update_raises(store: Store) -> None:
    """A missing snapshot: get gives None, delete gives False, update raises SnapshotNotFoundError (a LookupError)."""
    assert await store.snapshots.get("0" * 32) is None
    assert await store.snapshots.delete("0" * 32) is False
    with pytest.raises(SnapshotNotFoundError, match=r"snapshot '0{32}' does not exist") as caught:
        await store.snapshots.update("0" * 32, status="ready")
    assert isinstance(caught.value, LookupError)
    assert (caught.value.code, caught.value.http_status, caught.value.details) == (
        "snapshot_not_found",
        404,
        {"id": "0" * 32},
    )


async def test_snapshot_duplicate_id_is_an_invalid_request(store: Store) -> None:
    """Creating a snapshot with an id already in use raises InvalidRequestError naming the id."""
    await _snapshot(store, id="d" * 32)
    with pytest.raises(InvalidRequestError, match=r"snapshot id 'd{32}' already exists"):
        await _snapshot(store, id="d" * 32)


async def test_snapshot_list_is_newest_first_and_filters_combine(store: Store) -> None:
    """Listing returns newest first; workspace, name, status, setup key and provider filters each narrow it, and
    given together they must all match."""
    a1 = await _snapshot(store, workspace_id="a" * 32, name="base", status="ready", setup_key="s1")
    a2 = await _snapshot(store, workspace_id="a" * 32, name="later", status="creating")
    b1 = await _snapshot(store, workspace_id="b" * 32, name="base", status="error", provider="docker")
    a3 = await _snapshot(store, workspace_id="a" * 32, name="base", status="ready", provider="docker", setup_key="s1")

    def ids(records: list[SnapshotRecord]) -> list[str]:
        return [r.id for r in records]

    assert ids(await store.snapshots.list()) == [a3.id, b1.id, a2.id, a1.id]
    assert ids(await store.snapshots.list(workspace_id="a" * 32)) == [a3.id, a2.id, a1.id]
    assert ids(await store.snapshots.list(name="base")) == [a3.id, b1.id, a1.id]
    assert ids(await store.snapshots.list(statuses="ready")) == [a3.id, a1.id]
    assert ids(await store.snapshots.list(statuses=["creating", "error"])) == [b1.id, a2.id]
    assert ids(await store.snapshots.list(setup_key="s1")) == [a3.id, a1.id]
    assert ids(await store.snapshots.list(provider="docker")) == [a3.id, b1.id]
    assert ids(await store.snapshots.list(workspace_id="a" * 32, name="base")) == [a3.id, a1.id]
    assert ids(await store.snapshots.list(workspace_id="a" * 32, name="base", provider="gvisor")) == [a1.id]
    assert ids(await store.snapshots.list(name="base", statuses=["ready", "error"], provider="docker")) == [
        a3.id,
        b1.id,
    ]
    assert await store.snapshots.list(workspace_id="b" * 32, statuses="ready") == []
    assert await store.snapshots.list(name="nope") == []


async def test_snapshot_update_changes_only_the_given_fields(store: Store) -> None:
    """Each update writes only the columns it names and refreshes updated_at; the rest stays as it was."""
    created = await _snapshot(store, name="n", metadata={"keep": "me"}, setup_key="key")

    sized = await store.snapshots.update(created.id, size_bytes=123)
    assert sized.size_bytes == 123
    assert (sized.status, sized.kind, sized.error, sized.metadata) == ("creating", "filesystem", None, {"keep": "me"})
    assert (sized.name, sized.setup_key, sized.resource_limits) == ("n", "key", created.resource_limits)
    assert sized.created_at == created.created_at
    assert sized.updated_at >= created.updated_at

    done = await store.snapshots.update(created.id, status="ready", kind="memory")
    assert (done.status, done.kind, done.size_bytes, done.metadata) == ("ready", "memory", 123, {"keep": "me"})

    failed = await store.snapshots.update(created.id, status="error", error="checkpoint failed", metadata={"n": 1})
    assert (failed.status, failed.error, failed.metadata, failed.size_bytes) == (
        "error",
        "checkpoint failed",
        {"n": 1},
        123,
    )

    cleared = await store.snapshots.update(created.id, error=None)
    assert (cleared.error, cleared.status) == (None, "error")
    assert await store.snapshots.get(created.id) == cleared


async def test_snapshot_delete_removes_only_that_record(store: Store) -> None:
    """Deleting a snapshot removes its row (a second delete finds nothing) and leaves the others."""
    gone = await _snapshot(store)
    kept = await _snapshot(store)

    assert await store.snapshots.delete(gone.id) is True

    assert await store.snapshots.get(gone.id) is None
    assert await store.snapshots.delete(gone.id) is False
    assert [r.id for r in await store.snapshots.list()] == [kept.id]


async def test_snapshot_total_size_counts_creating_and_ready_but_not_error(store: Store) -> None:
    """total_size sums creating and ready snapshots (beyond 32 bits), leaves out error ones, and filters by
    provider."""
    assert await store.snapshots.total_size() == 0
    gib = 1 << 30
    for size, status, provider in (
        (5 * gib, "ready", "gvisor"),
        (3 * gib, "creating", "gvisor"),
        (7 * gib, "error", "gvisor"),
        (11, "ready", "docker"),
    ):
        record = await _snapshot(store, provider=provider)
        await store.snapshots.update(record.id, size_bytes=size, status=status)

    total = await store.snapshots.total_size()

    assert total == 8 * gib + 11 and type(total) is int
    assert await store.snapshots.total_size(provider="gvisor") == 8 * gib
    assert await store.snapshots.total_size(provider="docker") == 11
    assert await store.snapshots.total_size(provider="firecracker") == 0


async def test_snapshot_find_setup_gives_the_newest_ready_one_with_the_key(store: Store) -> None:
    """find_setup skips creating and error snapshots and other keys, and picks the newest ready one."""
    assert await store.snapshots.find_setup("repo@abc") is None
    await _snapshot(store, setup_key="repo@abc", status="creating")
    await _snapshot(store, setup_key="repo@abc", status="error")
    await _snapshot(store, setup_key="repo@def", status="ready")
    assert await store.snapshots.find_setup("repo@abc") is None

    older = await _snapshot(store, setup_key="repo@abc", status="ready")
    assert await store.snapshots.find_setup("repo@abc") == older
    newer = await _snapshot(store, setup_key="repo@abc", status="ready")
    await _snapshot(store, setup_key="repo@abc", status="creating")  # newest, but not restorable yet

    assert await store.snapshots.find_setup("repo@abc") == newer
    await store.snapshots.update(newer.id, status="error", error="files lost")
    found = await store.snapshots.find_setup("repo@abc")
    assert found is not None and found.id == older.id


async def test_snapshot_outlives_its_destroyed_source_workspace(store: Store) -> None:
    """A snapshot keeps its record, and stays listed by its source, after that workspace is destroyed."""
    source = await _workspace(store, status="ready", provider="gvisor")
    taken = await _snapshot(store, workspace_id=source.id, status="ready")

    await store.workspaces.mark_status(source.id, "destroyed")

    assert await store.snapshots.list(workspace_id=source.id) == [taken]


async def test_snapshot_records_survive_closing_and_reopening_the_store(database_url: str) -> None:
    """Snapshot records written through one Store are read back unchanged through a new Store on the same database."""
    async with await Store.open(database_url) as first:
        ready = await _snapshot(first, name="keep", setup_key="key", status="ready")
        ready = await first.snapshots.update(ready.id, size_bytes=42, kind="memory")
        creating = await _snapshot(first)

    async with await Store.open(database_url) as second:
        assert await second.snapshots.list() == [creating, ready]
        assert await second.snapshots.find_setup("key") == ready
        assert await second.snapshots.total_size() == 42


def _upgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


def _downgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


async def test_migration_0002_adds_snapshots_to_a_0001_database_and_reverts(database_url: str) -> None:
    """A database at 0001 with a workspace upgrades to 0002 keeping the workspace; downgrading drops only the
    snapshots table."""
    engine = corral.store.create_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_upgrade, "0001")
            assert "snapshots" not in await connection.run_sync(_table_names)
        old = await _workspace(Store(engine))

        await migrate(engine)

        store = Store(engine)
        async with engine.connect() as connection:
            assert await connection.run_sync(_current) == "0002"
            assert "snapshots" in await connection.run_sync(_table_names)
        assert await store.workspaces.get(old.id) == old
        await _snapshot(store, workspace_id=old.id)

        async with engine.begin() as connection:
            await connection.run_sync(_downgrade, "0001")
            assert await connection.run_sync(_current) == "0001"
            assert TABLES - {"snapshots"} <= await connection.run_sync(_table_names)
            assert "snapshots" not in await connection.run_sync(_table_names)
        assert await store.workspaces.get(old.id) == old
    finally:
        await engine.dispose()


# --- agent types -----------------------------------------------------------------------------------------------------


async def test_agent_types_create_get_list_and_update_config(store: Store) -> None:
    """Agent types are found by id and by name, listed in creation order, and their config can be replaced."""
    config = {"enabled": True, "tools": ["bash", "read"], "resource_limits": {"cpu": "1"}}
    reviewer = await store.agent_types.create("reviewer", config)
    coder = await store.agent_types.create("coder", {})

    assert await store.agent_types.get(reviewer.id) == reviewer
    assert await store.agent_types.get_by_name("coder") == coder
    assert await store.agent_types.get_by_name("nobody") is None
    assert await store.agent_types.get("missing") is None
    assert [t.name for t in await store.agent_types.list()] == ["reviewer", "coder"]

    updated = await store.agent_types.update_config(reviewer.id, {"enabled": False})

    assert updated is not None
    assert updated.workspace_config == {"enabled": False}
    assert await store.agent_types.get(reviewer.id) == updated
    assert await store.agent_types.update_config("missing", {}) is None


async def test_agent_type_duplicate_name_is_an_invalid_request_naming_it(store: Store) -> None:
    """A second agent type with a taken name (or id) raises InvalidRequestError whose message names the duplicate."""
    first = await store.agent_types.create("reviewer", {})
    with pytest.raises(InvalidRequestError, match="agent type named 'reviewer' already exists"):
        await store.agent_types.create("reviewer", {"enabled": True})
    with pytest.raises(InvalidRequestError, match=f"agent type id '{first.id}' already exists"):
        await store.agent_types.create("other", {}, id=first.id)
    assert await store.agent_types.list() == [first]


# --- sessions --------------------------------------------------------------------------------------------------------


async def test_session_keeps_the_config_snapshot_taken_at_start(store: Store) -> None:
    """A session keeps the agent type's config as it was at creation, whatever happens to the agent type later."""
    agent_type = await store.agent_types.create("coder", {"tools": ["bash"], "network": "isolated"})
    task = {"context": {"repository_url": "https://example.test/r.git", "branch": "main", "pull_request_number": 7}}
    snapshotted = await store.sessions.create(agent_type.id, task_context=task)
    explicit = await store.sessions.create(agent_type.id, workspace_config={"tools": ["read"]})

    await store.agent_types.update_config(agent_type.id, {"tools": ["bash", "git"], "network": "default"})

    fetched = await store.sessions.get(snapshotted.id)
    assert fetched is not None
    assert fetched.workspace_config == {"tools": ["bash"], "network": "isolated"}
    assert fetched.task_context == task
    assert (fetched.status, fetched.degraded, fetched.workspace_id, fetched.ended_at) == (
        "provisioning",
        False,
        None,
        None,
    )
    assert (await store.sessions.get(explicit.id)) == explicit
    assert explicit.workspace_config == {"tools": ["read"]}


async def test_session_for_an_unknown_agent_type_or_a_taken_id_is_an_invalid_request(store: Store) -> None:
    """A session for a missing agent type (with or without an explicit config) or with a taken id is refused."""
    with pytest.raises(InvalidRequestError, match="agent type 'ghost' does not exist"):
        await store.sessions.create("ghost")
    with pytest.raises(InvalidRequestError, match="agent type 'ghost' does not exist"):
        await store.sessions.create("ghost", workspace_config={})
    agent_type = await store.agent_types.create("coder", {})
    session = await store.sessions.create(agent_type.id)
    with pytest.raises(InvalidRequestError, match=f"session '{session.id}' already exists"):
        await store.sessions.create(agent_type.id, id=session.id, workspace_config={})


async def test_session_update_degrade_and_end(store: Store) -> None:
    """Session updates set only the given fields, ending sets ended_at, and a missing session gives None."""
    agent_type = await store.agent_types.create("coder", {})
    session = await store.sessions.create(agent_type.id)
    workspace = await _workspace(store)

    active = await store.sessions.update(session.id, status="active", workspace_id=workspace.id)
    degraded = await store.sessions.update(session.id, degraded=True, degraded_reason="no provider is available")
    warned = await store.sessions.add_warnings(session.id, "setup command failed", "setup command failed")
    ended = await store.sessions.update(session.id, status="ended")

    assert active is not None
    assert (active.status, active.workspace_id, active.ended_at) == ("active", workspace.id, None)
    assert degraded is not None
    assert (degraded.status, degraded.degraded, degraded.degraded_reason) == (
        "active",
        True,
        "no provider is available",
    )
    assert warned is not None
    assert warned.warnings == ("setup command failed",)
    assert ended is not None
    assert ended.status == "ended"
    assert ended.ended_at is not None
    assert ended.workspace_id == workspace.id
    assert [s.id for s in await store.sessions.list(workspace_id=workspace.id)] == [session.id]
    assert await store.sessions.list(status="active") == []
    assert await store.sessions.update("missing", status="ended") is None
    assert await store.sessions.add_warnings("missing", "w") is None


# --- audit -----------------------------------------------------------------------------------------------------------


async def test_audit_entries_list_in_time_order_per_session(store: Store) -> None:
    """Audit entries come back for their session only, ordered by time and then by insertion."""
    t0 = datetime.now(UTC) - timedelta(hours=1)
    await store.audit.append(
        "s1", tool="write", arguments_summary="b", status="ok", duration_ms=2.5, at=t0 + timedelta(minutes=1)
    )
    await store.audit.append("s1", tool="bash", arguments_summary="a", status="ok", duration_ms=1.0, at=t0)
    await store.audit.append("s2", tool="read", arguments_summary="x", status="ok", duration_ms=0.1, at=t0)
    await store.audit.append(
        "s1", tool="grep", arguments_summary="c", status="denied", duration_ms=0, at=t0 + timedelta(minutes=1)
    )
    latest = await store.audit.append("s1", tool="git", arguments_summary="d", status="error", duration_ms=3.25)

    entries = await store.audit.list("s1")

    assert [e.arguments_summary for e in entries] == ["a", "b", "c", "d"]
    assert entries[-1] == latest
    assert entries[0].at == t0
    assert entries[0].duration_ms == 1.0
    assert entries[2].status == "denied"
    assert await store.audit.list("nobody") == []


async def test_audit_record_writes_a_batch_for_existing_sessions_only(store: Store) -> None:
    """``record`` writes a batch of tool calls in one go, in order, skipping calls of sessions that do not exist,
    with credentials masked."""
    agent_type = await store.agent_types.create("recorder", {"enabled": True})
    session = await store.sessions.create(agent_type.id)
    at = datetime.now(UTC)
    calls = [
        ToolCall(session.id, at, "bash", "git clone https://u:hunter2@example.com/r.git", "ok", 2.5),
        ToolCall("nobody", at, "bash", "true", "ok", 1.0),
        ToolCall(session.id, at + timedelta(seconds=1), "read", "a.txt", "refused", 0.0),
    ]
    await store.audit.record(calls)
    await store.audit.record([])
    entries = await store.audit.list(session.id)
    assert [(e.tool, e.arguments_summary, e.status, e.at, e.duration_ms) for e in entries] == [
        ("bash", "git clone https://***@example.com/r.git", "ok", at, 2.5),
        ("read", "a.txt", "refused", at + timedelta(seconds=1), 0.0),
    ]
    assert await store.audit.list("nobody") == []


# --- opening ---------------------------------------------------------------------------------------------------------


@pytest.mark.unit
async def test_sqlite_connections_use_wal_a_busy_timeout_and_foreign_keys(tmp_path: Path) -> None:
    """Every SQLite connection runs in WAL mode with a busy timeout and enforced foreign keys."""
    async with await Store.open(f"sqlite:///{tmp_path / 'corral.db'}") as store, store.engine.connect() as connection:
        pragmas = [
            (await connection.execute(text(f"PRAGMA {name}"))).scalar_one()
            for name in ("journal_mode", "busy_timeout", "foreign_keys")
        ]
    assert pragmas == ["wal", corral.store.db.SQLITE_BUSY_TIMEOUT_MS, 1]


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("sqlite:///{tmp}/a-file/corral.db", marks=pytest.mark.unit, id="sqlite"),
        pytest.param("postgresql://corral:s3cret@127.0.0.1:1/corral", marks=pytest.mark.integration, id="postgresql"),
    ],
)
async def test_opening_an_unusable_database_raises_a_corral_error_without_the_password(
    url: str, tmp_path: Path
) -> None:
    """A database that cannot be opened raises CorralError, and the message never shows the password."""
    (tmp_path / "a-file").write_text("not a directory")
    with pytest.raises(CorralError, match="cannot open the database") as caught:
        await Store.open(url.format(tmp=tmp_path))
    assert "s3cret" not in str(caught.value)


@pytest.mark.unit
def test_the_store_package_exports_its_public_api() -> None:
    """corral.store exports exactly the store's public names."""
    assert set(corral.store.__all__) == {
        "UNSET",
        "AgentTypeRecord",
        "AgentTypeRepository",
        "AuditEntry",
        "AuditRepository",
        "ProviderAttempt",
        "SessionRecord",
        "SessionRepository",
        "SessionStatus",
        "SnapshotKind",
        "SnapshotRecord",
        "SnapshotRepository",
        "SnapshotStatus",
        "Store",
        "ToolCall",
        "Unset",
        "WorkspaceRecord",
        "WorkspaceRepository",
        "WorkspaceStatus",
        "alembic_config",
        "async_url",
        "create_engine",
        "migrate",
    }
    assert all(hasattr(corral.store, name) for name in corral.store.__all__)


async def test_a_write_cancelled_at_any_point_still_ends_its_transaction(store: Store) -> None:
    """A write cancelled after any number of event-loop turns ends its transaction (SQLite's write lock used to stay
    held by the abandoned connection, and every later writer failed with "database is locked"); the caller still
    hears the cancellation."""
    agent_type = await store.agent_types.create("t", {"enabled": True})
    session = await store.sessions.create(agent_type.id, task_context={})
    for turns in range(40):
        write = asyncio.create_task(store.sessions.update(session.id, status="active"))
        for _ in range(turns):
            await asyncio.sleep(0)
        if not write.cancel():  # it committed first: every earlier point has been tried
            await write
            break
        with pytest.raises(asyncio.CancelledError):
            await write
        # The busy timeout is 15 s; a held lock shows as this bound running out, not as a slow pass.
        await asyncio.wait_for(store.sessions.update(session.id, status="provisioning"), 10)
    # Whether the loop ended on a write that committed (fast machines) or ran out of turns, the store still takes one.
    await asyncio.wait_for(store.sessions.update(session.id, status="ended"), 10)
    assert (await store.sessions.get(session.id)).status == "ended"
