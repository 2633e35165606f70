"""Sessions over fake providers: limit inheritance, warm pool assignment and the retry on the fallback provider."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.agents.sessions import AgentService, TaskContext
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.pool import PoolSpec, WarmPools
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import WorkspaceProvider
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import Store

pytestmark = pytest.mark.unit


@pytest.fixture
def fakes() -> dict[str, FakeProvider]:
    return {
        "gvisor": FakeProvider("gvisor", isolation="gvisor"),
        "docker": FakeProvider("docker", isolation="container"),
    }


@pytest.fixture
async def agents(tmp_path: Path, fakes: dict[str, FakeProvider]) -> AsyncIterator[AgentService]:
    settings = Settings(
        data_dir=tmp_path,
        providers="gvisor,docker",
        default_cpu="1",
        default_memory="3G",
        default_disk="7G",
        allow_docker_fallback=True,  # the retry tests fall back to plain docker
    )
    store = await Store.open(settings.sqlalchemy_url())
    providers: dict[str, WorkspaceProvider] = dict(fakes)
    monitor = HealthMonitor(providers, 30)
    await monitor.check_all()
    service = AgentService(WorkspaceService(settings, store, providers, monitor))
    yield service
    await service.aclose()
    if service.workspaces.pools is not None:
        await service.workspaces.pools.close(drain=True)
    await store.close()


async def _session(agents: AgentService, workspace: dict[str, object]) -> str:
    agent_type = await agents.create_type("t", workspace)
    return (await agents.start(agent_type.id, TaskContext())).id


async def test_limits_fall_back_to_the_workspace_defaults(agents: AgentService) -> None:
    """A type without resource_limits gets WORKSPACE_DEFAULT_CPU/MEMORY/DISK; given ones override per field."""
    plain = await agents.wait_provisioned(await _session(agents, {"enabled": True}))
    assert plain.workspace_id is not None
    record = await agents.workspaces.get(plain.workspace_id)
    assert record.resource_limits == {"cpu": "1", "memory": "3G", "disk": "7G"}
    partial = await agents.create_type("p", {"enabled": True, "resource_limits": {"memory": "1G"}})
    session = await agents.wait_provisioned((await agents.start(partial.id, TaskContext())).id)
    assert session.workspace_id is not None
    assert (await agents.workspaces.get(session.workspace_id)).resource_limits["memory"] == "1G"


async def test_a_matching_warm_workspace_is_assigned(agents: AgentService) -> None:
    """A session whose workspace matches a warm pool gets a warm workspace instead of a new one."""
    service = agents.workspaces
    spec = PoolSpec("gvisor", service.settings.base_image, service.default_limits(), "isolated", size=1)
    service.attach_pools(WarmPools([spec]))
    assert await service.pools.refill(spec.key) == 1
    agent_type = await agents.create_type("t", {"enabled": True})
    session = await agents.start(agent_type.id, TaskContext())
    # Nothing to check out or set up and a warm workspace at hand: active in the same request.
    assert session.status == "active" and session.workspace_id is not None
    record = await service.get(session.workspace_id)
    assert record.from_warm_pool is True
    assert record.metadata["session_id"] == session.id


async def test_a_burst_of_sessions_grows_the_pool_by_one_per_session(agents: AgentService) -> None:
    """Five sessions at once on a pool of one: each counts once toward the burst, although the four that miss ask
    the pool again while provisioning; the pool grows to five, not nine."""
    service = agents.workspaces
    spec = PoolSpec("gvisor", service.settings.base_image, service.default_limits(), "isolated", size=1, max_size=20)
    service.attach_pools(pools := WarmPools([spec]))
    assert await pools.refill(spec.key) == 1
    agent_type = await agents.create_type("t", {"enabled": True})
    sessions = await asyncio.gather(*(agents.start(agent_type.id, TaskContext()) for _ in range(5)))
    for session in sessions:
        assert (await agents.wait_provisioned(session.id)).status == "active"
    [status] = await pools.status()
    assert status["target"] == 5


async def test_a_session_with_setup_work_provisions_in_the_background(agents: AgentService) -> None:
    """A session that has setup commands to run starts provisioning, and becomes active once they ran."""
    agent_type = await agents.create_type("s", {"enabled": True, "setup_commands": ["true"]})
    session = await agents.start(agent_type.id, TaskContext())
    assert session.status == "provisioning"
    assert (await agents.wait_provisioned(session.id)).status == "active"


async def test_a_failed_provision_is_retried_once_on_the_fallback_provider(
    agents: AgentService, fakes: dict[str, FakeProvider]
) -> None:
    """When the type's explicit provider fails, provisioning retries once with auto, which picks another one."""
    fakes["gvisor"].fail_create = "runsc vanished"
    session = await agents.wait_provisioned(await _session(agents, {"enabled": True, "provider": "gvisor"}))
    assert (session.status, session.degraded) == ("active", False)
    assert session.workspace_id is not None
    record = await agents.workspaces.get(session.workspace_id)
    assert record.provider == "docker"
    assert [a.provider for a in record.provider_attempts] == ["gvisor"]


async def test_two_failures_degrade_the_session(agents: AgentService, fakes: dict[str, FakeProvider]) -> None:
    """If the retry fails too, the session is active and degraded with both reasons."""
    fakes["gvisor"].fail_create = "runsc vanished"
    fakes["docker"].fail_create = "dockerd down"
    session = await agents.wait_provisioned(await _session(agents, {"enabled": True}))
    assert (session.status, session.degraded, session.workspace_id) == ("active", True, None)
    assert session.degraded_reason is not None
    assert "runsc vanished" in session.degraded_reason and "dockerd down" in session.degraded_reason


async def test_ending_a_session_while_provisioning_leaves_nothing(
    agents: AgentService, fakes: dict[str, FakeProvider]
) -> None:
    """DELETE during provisioning cancels it, and the half-made workspace is destroyed."""
    fakes["gvisor"].create_delay_s = 30
    session_id = await _session(agents, {"enabled": True})
    ended = await agents.end(session_id)
    assert ended.status == "ended"
    assert await fakes["gvisor"].list_workspaces() == []
