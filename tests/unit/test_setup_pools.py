"""Warm pools filled from setup snapshots, over the fake provider and a real SQLite store: a later session of a
``snapshot_after_setup`` type gets a workspace restored ahead of time, superseded and deleted snapshots lose their
pool (its workspaces destroyed), and a restart registers the pools again before reconciliation.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corral.agents.sessions import AgentService, TaskContext
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.pool import PoolSpec, WarmPools, snapshot_pool_key
from corral.orchestrator.reconcile import reconcile
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.orchestrator.snapshots import SETUP_OWNER, SnapshotService
from corral.providers.base import ExecRequest, WorkspaceSpec
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import SessionRecord, SnapshotRecord, Store, WorkspaceRecord

pytestmark = pytest.mark.unit

PROVIDER = "gvisor"
SETUP = "echo ran >> /workspace/setup.log"
TYPE_CONFIG: dict[str, Any] = {
    "enabled": True,
    "provider": PROVIDER,
    "setup_commands": [SETUP],
    "snapshot_after_setup": True,
}


@dataclass
class Stack:
    """What a server builds, over one fake provider and one SQLite file."""

    provider: FakeProvider
    store: Store
    pools: WarmPools
    service: WorkspaceService
    snapshots: SnapshotService
    agents: AgentService


async def eventually(condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0) -> None:
    """Wait until ``await condition()`` holds, failing after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"condition still false after {timeout_s} s")
        await asyncio.sleep(0.005)


async def settle() -> None:
    """Wait until no pool refill runs (closing pools mid-refill could cut a SQLite call in half)."""

    async def idle() -> bool:
        return not any(t.get_name().startswith("warm-pool-refill-") and not t.done() for t in asyncio.all_tasks())

    await eventually(idle)


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* / E2B_API_KEY variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


async def build(tmp_path: Path, provider: FakeProvider, *, setup_pool_size: int = 1) -> Stack:
    """The services as the app wires them, pools started (a restart builds a second stack on the same files)."""
    settings = Settings(data_dir=tmp_path, providers=PROVIDER)
    store = await Store.open(settings.sqlalchemy_url())
    monitor = HealthMonitor({PROVIDER: provider}, settings.health_interval_s)
    await monitor.check_all()
    pools = WarmPools([])
    service = WorkspaceService(settings, store, {PROVIDER: provider}, monitor, pools=pools)
    snapshots = SnapshotService(service, store, storage_limit=10**9, setup_pool_size=setup_pool_size)
    return Stack(provider, store, pools, service, snapshots, AgentService(service, snapshots=snapshots))


async def close(stack: Stack) -> None:
    """Stop provisioning, drain every pool (as a clean shutdown does) and close the store."""
    await stack.agents.aclose()
    await settle()
    await stack.pools.close(drain=True)
    await stack.store.close()


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    """A started stack with setup pools of one workspace."""
    built = await build(tmp_path, FakeProvider(PROVIDER, isolation="gvisor"))
    built.pools.start()
    yield built
    await close(built)


async def session(stack: Stack, agent_type_id: str) -> tuple[SessionRecord, WorkspaceRecord]:
    """Start a session, wait for its provisioning, and return it with its workspace."""
    started = await stack.agents.start(agent_type_id, TaskContext())
    done = await stack.agents.wait_provisioned(started.id)
    assert (done.status, done.degraded) == ("active", False), done.degraded_reason
    assert done.workspace_id is not None
    return done, await stack.service.get(done.workspace_id)


async def warm(stack: Stack, snapshot_id: str, count: int = 1) -> list[str]:
    """Wait until the snapshot's pool holds ``count`` ready workspaces; returns their ids."""
    key = snapshot_pool_key(snapshot_id)

    async def full() -> bool:
        return len(await stack.service.warm_records(key, ("ready",))) == count

    await eventually(full)
    return [r.id for r in await stack.service.warm_records(key, ("ready",))]


async def setup_log(stack: Stack, workspace_id: str) -> str:
    result = await stack.service.exec(workspace_id, ExecRequest("cat /workspace/setup.log"))
    return result.stdout.decode()


def snapshot_pools(stack: Stack) -> list[str]:
    """The snapshots that have a pool now."""
    return [spec.snapshot_id for spec in stack.pools.specs if spec.snapshot_id is not None]


async def test_a_later_session_gets_a_workspace_restored_ahead_of_time(stack: Stack) -> None:
    """After the first session's setup snapshot, its pool fills with a workspace restored from it; the next session
    is handed exactly that workspace, marked as from the pool, with the setup's file and no new setup run."""
    agent_type = await stack.agents.create_type("t", TYPE_CONFIG)
    _, first = await session(stack, agent_type.id)
    assert first.metadata["setup"]["source"] == "ran"
    snapshot_id = first.metadata["setup"]["snapshot_id"]
    snapshot = await stack.snapshots.get(snapshot_id)
    assert snapshot.metadata[SETUP_OWNER] == agent_type.id
    assert snapshot_pools(stack) == [snapshot_id]
    [member] = await warm(stack, snapshot_id)
    assert ("restore", member) in stack.provider.calls
    second_session, second = await session(stack, agent_type.id)
    assert second.id == member
    assert second.from_warm_pool is True
    assert second.pool_key is None
    assert second.metadata["setup"] == {"source": "snapshot", "snapshot_id": snapshot_id, "warm_pool": True}
    assert (second.metadata["from_snapshot"], second.metadata["session_id"]) == (snapshot_id, second_session.id)
    assert await setup_log(stack, second.id) == "ran\n"
    await warm(stack, snapshot_id)  # the hand-out refills the pool


async def test_an_empty_pool_falls_back_to_restoring_on_demand(tmp_path: Path) -> None:
    """With CORRAL_SETUP_POOL_SIZE=0 no pool is made: a later session restores the snapshot itself, and its
    metadata does not claim a warm pool."""
    stack = await build(tmp_path, FakeProvider(PROVIDER, isolation="gvisor"), setup_pool_size=0)
    stack.pools.start()
    try:
        agent_type = await stack.agents.create_type("t", TYPE_CONFIG)
        _, first = await session(stack, agent_type.id)
        assert snapshot_pools(stack) == []
        _, second = await session(stack, agent_type.id)
        assert second.from_warm_pool is False
        assert second.metadata["setup"] == {"source": "snapshot", "snapshot_id": first.metadata["setup"]["snapshot_id"]}
        assert await setup_log(stack, second.id) == "ran\n"
    finally:
        await close(stack)


async def test_a_newer_setup_snapshot_drains_the_old_pool_and_never_serves_the_old_key(stack: Stack) -> None:
    """A config change makes a new setup snapshot of the type: the old snapshot's pool is removed and its warm
    workspace destroyed. A session with the old config still restores the old snapshot (on demand), never a
    workspace of the new snapshot's pool."""
    agent_type = await stack.agents.create_type("t", TYPE_CONFIG)
    _, first = await session(stack, agent_type.id)
    old_snapshot = first.metadata["setup"]["snapshot_id"]
    [old_member] = await warm(stack, old_snapshot)

    await stack.agents.set_config(agent_type.id, {**TYPE_CONFIG, "setup_commands": [SETUP, "echo v2 > /workspace/v"]})
    _, changed = await session(stack, agent_type.id)
    assert changed.metadata["setup"]["source"] == "ran"
    new_snapshot = changed.metadata["setup"]["snapshot_id"]
    assert snapshot_pools(stack) == [new_snapshot]
    assert old_member not in await stack.provider.list_workspaces()
    assert (await stack.service.get(old_member)).status == "destroyed"
    [new_member] = await warm(stack, new_snapshot)

    await stack.agents.set_config(agent_type.id, TYPE_CONFIG)
    _, back = await session(stack, agent_type.id)
    assert back.metadata["setup"] == {"source": "snapshot", "snapshot_id": old_snapshot}
    assert back.from_warm_pool is False
    assert await warm(stack, new_snapshot) == [new_member]


async def test_deleting_a_setup_snapshot_drains_its_pool_before_its_files_go(stack: Stack) -> None:
    """Deleting the snapshot destroys its pool's warm workspaces (records and runtime) before the provider's
    snapshot files are removed, and the pool is gone."""
    agent_type = await stack.agents.create_type("t", TYPE_CONFIG)
    _, first = await session(stack, agent_type.id)
    snapshot_id = first.metadata["setup"]["snapshot_id"]
    [member] = await warm(stack, snapshot_id)
    running_at_delete: list[list[str]] = []
    real_delete = stack.provider.delete_snapshot

    async def delete_snapshot(snapshot_id: str) -> None:
        running_at_delete.append(await stack.provider.list_workspaces())
        await real_delete(snapshot_id)

    stack.provider.delete_snapshot = delete_snapshot  # type: ignore[method-assign]  # watch the order
    await stack.snapshots.delete(snapshot_id)
    assert running_at_delete == [[first.id]]
    assert (await stack.service.get(member)).status == "destroyed"
    assert snapshot_pools(stack) == []
    assert await stack.service.warm_records(snapshot_pool_key(snapshot_id), ("creating", "ready")) == []


async def test_removing_a_pool_waits_for_a_restore_in_flight_and_destroys_it(stack: Stack) -> None:
    """A pool removed while its refill is inside the provider's restore waits for it, then destroys the workspace
    it made: nothing is left on the provider or in the pool, and no refill follows."""
    source = await stack.service.create(CreateWorkspace(provider=PROVIDER))
    record = await stack.snapshots.create(source.id)
    gate, parked = asyncio.Event(), asyncio.Event()
    real_restore = stack.provider.restore

    async def slow_restore(spec: WorkspaceSpec, snapshot_id: str) -> None:
        parked.set()
        await gate.wait()
        await real_restore(spec, snapshot_id)

    stack.provider.restore = slow_restore  # type: ignore[method-assign]  # park the refill in the provider
    spec = PoolSpec(PROVIDER, record.base_image, stack.service.default_limits(), "isolated", 1, snapshot_id=record.id)
    assert stack.pools.add(spec) is True
    await asyncio.wait_for(parked.wait(), 5)
    removal = asyncio.create_task(stack.pools.remove(spec.key))
    await asyncio.sleep(0)  # let the removal reach the pool's lock
    assert not removal.done()
    gate.set()
    assert await asyncio.wait_for(removal, 5) == 1
    await settle()
    assert await stack.provider.list_workspaces() == [source.id]
    assert stack.pools.keys == []
    assert await stack.pools.refill(spec.key) == 0


async def _setup_snapshot(
    stack: Stack, source: str, snapshot_id: str, *, owner: str | None, container_type: str = "agent_workspace"
) -> SnapshotRecord:
    """A ready setup snapshot (record and provider files) of ``owner``'s type, as an earlier server left it."""
    record = await stack.store.snapshots.create(
        id=snapshot_id,
        workspace_id=source,
        provider=PROVIDER,
        base_image=stack.service.settings.base_image,
        container_type=container_type,
        network="isolated",
        resource_limits=stack.service.default_limits().to_json(),
        setup_key=f"key-{snapshot_id}",
        metadata={SETUP_OWNER: owner} if owner is not None else {},
        status="ready",
    )
    await stack.provider.snapshot(source, snapshot_id)
    return record


async def test_sync_pools_the_newest_ready_setup_snapshot_of_each_type(stack: Stack) -> None:
    """Of two ready setup snapshots of one type only the newer gets a pool; one without a type (an older version's)
    gets its own; a failed one, an MCP server's and a plain snapshot get none."""
    source = (await stack.service.create(CreateWorkspace(provider=PROVIDER))).id
    await _setup_snapshot(stack, source, "older", owner="type-a")
    await _setup_snapshot(stack, source, "newer", owner="type-a")
    await _setup_snapshot(stack, source, "untyped", owner=None)
    await _setup_snapshot(stack, source, "mcp", owner="type-b", container_type="mcp_server")
    failed = await _setup_snapshot(stack, source, "failed", owner="type-c")
    await stack.store.snapshots.update(failed.id, status="error", error="its files vanished from the host")
    await stack.snapshots.create(source, name="plain")
    await stack.snapshots.sync_setup_pools()
    assert sorted(snapshot_pools(stack)) == ["newer", "untyped"]
    status = {entry["snapshot_id"]: entry for entry in await stack.pools.status()}
    assert (status["newer"]["key"], status["newer"]["target"]) == (snapshot_pool_key("newer"), 1)


async def test_a_restart_adopts_the_setup_pool_when_it_registers_before_reconcile(tmp_path: Path) -> None:
    """A server stopped without draining leaves its setup pool's warm workspace running; the next server syncs
    its setup pools before reconciling, so the workspace is adopted back and handed to the next session."""
    provider = FakeProvider(PROVIDER, isolation="gvisor")
    first = await build(tmp_path, provider)
    first.pools.start()
    agent_type = await first.agents.create_type("t", TYPE_CONFIG)
    _, ran = await session(first, agent_type.id)
    snapshot_id = ran.metadata["setup"]["snapshot_id"]
    [member] = await warm(first, snapshot_id)
    await first.agents.aclose()
    await settle()
    await first.pools.close(drain=False)
    await first.store.close()

    second = await build(tmp_path, provider)
    try:
        await second.snapshots.sync_setup_pools()
        report = await reconcile(second.service, pool_keys=second.pools.keys)
        assert report.pool_adopted == [member]
        second.pools.start()
        _, later = await session(second, agent_type.id)
        assert (later.id, later.from_warm_pool) == (member, True)
    finally:
        await close(second)


async def test_shutdown_destroys_the_setup_pools_workspaces(tmp_path: Path) -> None:
    """A clean shutdown (drain) destroys the warm workspaces of setup pools like those of any pool."""
    provider = FakeProvider(PROVIDER, isolation="gvisor")
    stack = await build(tmp_path, provider)
    stack.pools.start()
    agent_type = await stack.agents.create_type("t", TYPE_CONFIG)
    _, ran = await session(stack, agent_type.id)
    [member] = await warm(stack, ran.metadata["setup"]["snapshot_id"])
    await close(stack)
    assert member not in await provider.list_workspaces()
    assert await provider.list_workspaces() == [ran.id]
