"""Start-up reconciliation against a real engine: records and runtime objects agree again after a crash."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.errors import WorkspaceStateError
from corral.orchestrator.pool import PoolSpec, WarmPools
from corral.orchestrator.reconcile import reconcile
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import ExecRequest, ResourceLimits, WorkspaceSpec, WorkspaceState
from corral.providers.docker import container_name, volume_name
from corral.providers.gvisor import GVisorProvider
from corral.settings import Settings
from tests.conftest import BASE_IMAGE
from tests.integration.conftest import build_service, close_service

pytestmark = pytest.mark.integration


@pytest.fixture
async def service(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[WorkspaceService]:
    owner = Settings(data_dir=tmp_path).owner_id()
    svc = await build_service(
        tmp_path, {"gvisor": GVisorProvider(DockerEngine(docker_engine.socket_path), owner=owner)}
    )
    yield svc
    if svc.pools is not None:
        await svc.pools.close(drain=True)
    await close_service(svc)


async def test_runtime_objects_without_a_record_are_destroyed(
    service: WorkspaceService, docker_engine: DockerEngine
) -> None:
    """A labelled container and volume that no record knows are removed."""
    orphan = uuid.uuid4().hex[:16]
    await service.providers["gvisor"].create(WorkspaceSpec(id=orphan, image=BASE_IMAGE))
    report = await reconcile(service)
    assert report.orphans_destroyed == [orphan]
    assert await docker_engine.inspect_volume(volume_name(orphan)) is None
    assert await docker_engine.inspect_container(container_name(orphan)) is None


async def test_other_owners_objects_are_left_alone(service: WorkspaceService, docker_engine: DockerEngine) -> None:
    """Workspaces of another installation (another database) on the same engine are never touched."""
    stranger = GVisorProvider(DockerEngine(docker_engine.socket_path), owner="someone-else")
    other = uuid.uuid4().hex[:16]
    await stranger.create(WorkspaceSpec(id=other, image=BASE_IMAGE))
    try:
        report = await reconcile(service)
        assert other not in report.orphans_destroyed
        assert await stranger.state(other) is WorkspaceState.RUNNING
    finally:
        await stranger.destroy(other)
        await stranger.aclose()


async def test_record_states_follow_the_runtime(service: WorkspaceService, docker_engine: DockerEngine) -> None:
    """A ready record whose container is gone becomes stopped; one whose volume is gone too is marked vanished."""
    lost_container = await service.create(CreateWorkspace(provider="gvisor"))
    lost_everything = await service.create(CreateWorkspace(provider="gvisor"))
    healthy = await service.create(CreateWorkspace(provider="gvisor"))
    # The server goes down (nothing watches the engine's events now), and the objects go while it is down; the
    # restarted server's provider has seen nothing of it.
    before = service.providers["gvisor"]
    assert isinstance(before, GVisorProvider)
    await before.aclose()
    await docker_engine.remove_container(container_name(lost_container.id))
    await docker_engine.remove_container(container_name(lost_everything.id))
    await docker_engine.remove_volume(volume_name(lost_everything.id))
    service.providers["gvisor"] = GVisorProvider(DockerEngine(docker_engine.socket_path), owner=before.owner)

    report = await reconcile(service)

    assert report.marked_stopped == [lost_container.id]
    assert report.marked_vanished == [lost_everything.id]
    assert (await service.get(lost_container.id)).status == "stopped"
    vanished = await service.get(lost_everything.id)
    assert vanished.status == "error" and "vanished" in (vanished.error or "")
    assert (await service.get(healthy.id)).status == "ready"
    resumed = await service.resume(lost_container.id)
    assert resumed.status == "ready"


async def test_interrupted_create_is_cleaned_up(service: WorkspaceService, docker_engine: DockerEngine) -> None:
    """A record left "creating" by a crash has its runtime objects destroyed and is marked as an error."""
    record = await service.store.workspaces.create(
        requested_provider="auto",
        container_type="agent_workspace",
        resource_limits=ResourceLimits().to_json(),
        network="isolated",
        base_image=BASE_IMAGE,
    )
    await service.providers["gvisor"].create(WorkspaceSpec(id=record.id, image=BASE_IMAGE))
    report = await reconcile(service)
    assert report.interrupted_creates == [record.id]
    after = await service.get(record.id)
    assert after.status == "error" and "being created" in (after.error or "")
    assert await docker_engine.inspect_volume(volume_name(record.id)) is None


async def test_warm_pool_survives_a_restart_without_leaking(service: WorkspaceService) -> None:
    """Running warm workspaces are adopted back into their pool; a dead one is discarded."""
    spec = PoolSpec("gvisor", BASE_IMAGE, service.default_limits(), "isolated", size=2)
    pools = WarmPools([spec])
    service.attach_pools(pools)
    assert await pools.refill(spec.key) == 2
    warm = await service.store.workspaces.list(pool_key=spec.key)
    await service.providers["gvisor"].destroy(warm[0].id)  # dies while the server is down

    report = await reconcile(service, pool_keys=[spec.key])

    assert report.pool_adopted == [warm[1].id]
    assert report.pool_discarded == [warm[0].id]
    restarted = WarmPools([spec])
    service.attach_pools(restarted)
    assert await restarted.refill(spec.key) == 1  # only the discarded one is replaced


async def test_warm_workspaces_of_a_pool_no_longer_configured_are_discarded(service: WorkspaceService) -> None:
    """After a restart with the pool configured away, its warm workspaces are destroyed, not kept forever."""
    spec = PoolSpec("gvisor", BASE_IMAGE, service.default_limits(), "isolated", size=1)
    pools = WarmPools([spec])
    service.attach_pools(pools)
    assert await pools.refill(spec.key) == 1
    [warm] = await service.store.workspaces.list(pool_key=spec.key)
    report = await reconcile(service, pool_keys=[])
    assert report.pool_discarded == [warm.id]
    assert await service.providers["gvisor"].state(warm.id) is WorkspaceState.MISSING


async def test_a_container_that_dies_on_its_own_is_recorded_as_stopped(
    service: WorkspaceService, docker_engine: DockerEngine
) -> None:
    """When a workspace's container is killed from outside, the next exec answers 'stopped' and the record follows,
    so resume brings it back with /workspace intact."""
    record = await service.create(CreateWorkspace(provider="gvisor"))
    await service.exec(record.id, ExecRequest("echo kept > /workspace/kept.txt"))
    await docker_engine.request("POST", f"/containers/{container_name(record.id)}/kill")
    # The dead sandbox never answers; the Docker event stream closes the agent's stream and exec reports the state.
    with pytest.raises(WorkspaceStateError):
        await service.exec(record.id, ExecRequest("true"))
    assert (await service.get(record.id)).status == "stopped"
    assert (await service.resume(record.id)).status == "ready"
    assert (await service.exec(record.id, ExecRequest("cat /workspace/kept.txt"))).stdout == b"kept\n"
