"""Warm pool provider coordination (seed 000): filling, matching requests to pools, misses, status and shutdown."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from corral.errors import InvalidRequestError
from corral.orchestrator import pool as pool_module
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.pool import PoolSpec, WarmPools, pool_specs
from corral.orchestrator.selection import SelectionInputs, fallback_chain
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import ResourceLimits, WorkspaceState
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import Store, WorkspaceRecord

ISOLATION = {"docker": "container", "gvisor": "gvisor", "firecracker": "microvm"}
"""What each real provider reports, for the fakes that stand in for them."""

pytestmark = pytest.mark.unit

SMALL = ResourceLimits.parse({"cpu": "1", "memory": "1G", "disk": "5G"})


def create_calls(provider: FakeProvider) -> list[str]:
    """Ids of the workspaces ``create`` was called for on this provider."""
    return [workspace_id for method, workspace_id in provider.calls if method == "create"]


async def eventually(condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 5.0) -> None:
    """Wait until ``await condition()`` holds, failing after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"condition still false after {timeout_s} s")
        await asyncio.sleep(0.005)


def refills_running() -> bool:
    """Whether a background pool refill is still running in this event loop."""
    return any(t.get_name().startswith("warm-pool-refill-") and not t.done() for t in asyncio.all_tasks())


async def shrunk() -> None:
    """Wait until no pool waits to shrink back after a burst, or is shrinking."""

    async def done() -> bool:
        return not any(t.get_name().startswith("warm-pool-shrink-") and not t.done() for t in asyncio.all_tasks())

    await eventually(done)


async def settle() -> None:
    """Wait for background refills to finish.

    Closing pools cancels refills, and a refill cancelled inside a database call can strand a SQLite connection
    holding the write lock; tests close only settled pools (except where a refill is parked in a provider call).
    """

    async def idle() -> bool:
        return not refills_running()

    await eventually(idle)


def miss_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warm pool's miss messages."""
    return [r.getMessage() for r in caplog.records if r.name == pool_module.__name__ and "miss" in r.getMessage()]


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* / E2B_API_KEY variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture
def providers() -> dict[str, FakeProvider]:
    """Firecracker, gVisor and Docker fakes, all healthy."""
    return {
        name: FakeProvider(name, isolation=ISOLATION.get(name, "none")) for name in ("firecracker", "gvisor", "docker")
    }


@pytest.fixture
async def service(tmp_path: Path, providers: dict[str, FakeProvider]) -> AsyncIterator[WorkspaceService]:
    """A service over the fakes and a SQLite file, health checked once; its pools are drained afterwards."""
    settings = Settings(data_dir=tmp_path, providers=",".join(providers))
    store = await Store.open(settings.sqlalchemy_url())
    monitor = HealthMonitor(providers, settings.health_interval_s)
    await monitor.check_all()
    service = WorkspaceService(settings, store, providers, monitor)
    yield service
    if service.pools is not None:
        await settle()
        await service.pools.close(drain=True)
    await store.close()


def spec(
    service: WorkspaceService,
    provider: str = "firecracker",
    *,
    size: int = 2,
    image: str | None = None,
    limits: ResourceLimits | None = None,
    network: str = "isolated",
    max_size: int = 0,
) -> PoolSpec:
    """A pool of the default shape (the server's base image and default limits, isolated network)."""
    image = image or service.settings.base_image
    return PoolSpec(provider, image, limits or service.default_limits(), network, size, max_size=max_size)


async def filled(service: WorkspaceService, *specs: PoolSpec) -> WarmPools:
    """Attach pools for ``specs`` to the service and fill each one deterministically."""
    pools = WarmPools(list(specs))
    service.attach_pools(pools)
    for key in pools.keys:
        await pools.refill(key)
    return pools


async def warm(service: WorkspaceService, key: str) -> list[WorkspaceRecord]:
    """The ready workspaces waiting in the pool ``key``, oldest (next to be handed out) first."""
    return await service.store.workspaces.list(status="ready", pool_key=key)


async def status_of(pools: WarmPools, key: str) -> dict[str, Any]:
    """The status entry of one pool."""
    [entry] = [entry for entry in await pools.status() if entry["key"] == key]
    return entry


# --- filling -------------------------------------------------------------------------------------------------------


async def test_refill_creates_size_warm_workspaces_hidden_from_the_list(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """Refill creates `size` ready workspaces on the pool's provider, tagged with the pool and not listed as in use."""
    pool = spec(service, size=3)
    pools = WarmPools([pool])
    service.attach_pools(pools)
    assert await pools.refill(pool.key) == 3
    waiting = await warm(service, pool.key)
    assert len(waiting) == 3
    assert all(r.pool_key == pool.key and r.provider == "firecracker" and not r.from_warm_pool for r in waiting)
    assert sorted(create_calls(providers["firecracker"])) == sorted(r.id for r in waiting)
    assert await service.list_workspaces() == []
    assert await pools.refill(pool.key) == 0  # already at its target


async def test_each_warm_workspace_runs_its_first_command_before_it_is_offered(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """A refill runs one command in every workspace it creates, so a claimer's first command is not the sandbox's."""
    pool = spec(service, size=2)
    await filled(service, pool)
    waiting = await warm(service, pool.key)
    execs = [target for call, target in providers["firecracker"].calls if call == "exec"]
    assert sorted(execs) == sorted(r.id for r in waiting)


async def test_warm_and_cold_workspace_ids_have_one_format(service: WorkspaceService) -> None:
    """A warm workspace's id looks like a cold one's: 16 hex digits (they were 32 and 16)."""
    pool = spec(service, size=1)
    await filled(service, pool)
    (warm_record,) = await warm(service, pool.key)
    cold = await service.create(CreateWorkspace(provider="firecracker", network="default"))
    assert re.fullmatch(r"[0-9a-f]{16}", warm_record.id), warm_record.id
    assert re.fullmatch(r"[0-9a-f]{16}", cold.id), cold.id


async def test_zero_size_pool_is_not_configured(service: WorkspaceService) -> None:
    """A pool spec of size 0 configures no pool."""
    assert WarmPools([spec(service, size=0)]).keys == []


# --- handing out ---------------------------------------------------------------------------------------------------


async def test_matching_request_gets_a_warm_workspace_and_the_pool_refills(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """A request whose selected provider and shape match the pool gets a warm workspace; the pool refills to target."""
    pool = spec(service)
    pools = await filled(service, pool)
    oldest = (await warm(service, pool.key))[0]
    record = await service.create(CreateWorkspace(metadata={"task": "t-1"}))
    assert record.id == oldest.id
    assert record.from_warm_pool is True
    assert record.provider == "firecracker"
    assert record.pool_key is None
    assert record.status == "ready"
    assert record.requested_provider == "auto"
    assert record.metadata == {"task": "t-1"}
    assert [r.id for r in await service.list_workspaces()] == [record.id]
    assert (await status_of(pools, pool.key))["hits"] == 1

    async def back_to_target() -> bool:
        return (await status_of(pools, pool.key))["size"] == 2

    await eventually(back_to_target)
    assert len(create_calls(providers["firecracker"])) == 3  # two fills and one refill; no cold start


async def test_warm_workspace_is_usable(service: WorkspaceService) -> None:
    """A workspace handed out from the pool runs commands like a cold-started one."""
    pool = spec(service)
    await filled(service, pool)
    record = await service.create(CreateWorkspace())
    assert record.from_warm_pool
    assert await service.runtime_state(record.id) is WorkspaceState.RUNNING


async def test_warm_hit_records_providers_skipped_by_selection(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """With Firecracker unhealthy, selection chooses gVisor, so a gVisor pool matches; the skip is one warning."""
    providers["firecracker"].healthy = False
    providers["firecracker"].health_error = "KVM not available"
    await service.health.check_all()
    pool = spec(service, "gvisor")
    await filled(service, pool)
    record = await service.create(CreateWorkspace())
    assert record.from_warm_pool and record.provider == "gvisor"
    assert record.provider_attempts == ()  # nothing was tried for this request
    assert record.warnings == ("skipped firecracker (unhealthy); reasons at GET /api/v1/agent/workspaces/providers",)


async def test_explicit_provider_request_can_use_its_pool(service: WorkspaceService) -> None:
    """An explicit provider request matching the pool's provider and shape gets a warm workspace too."""
    pool = spec(service, "gvisor")
    await filled(service, pool)
    record = await service.create(CreateWorkspace(provider="gvisor"))
    assert record.from_warm_pool and record.provider == "gvisor"
    assert record.requested_provider == "gvisor"


async def test_provider_mismatch_cold_starts_on_the_selected_provider(
    service: WorkspaceService, providers: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """A pool on gVisor while selection picks Firecracker is a "provider mismatch" miss and a Firecracker cold start."""
    caplog.set_level(logging.INFO, logger=pool_module.__name__)
    pool = spec(service, "gvisor")
    pools = await filled(service, pool)
    record = await service.create(CreateWorkspace())
    assert record.provider == "firecracker"
    assert record.from_warm_pool is False
    assert len(await warm(service, pool.key)) == 2  # the gVisor pool was not touched
    status = await status_of(pools, pool.key)
    assert (status["hits"], status["misses"], status["miss_reasons"]) == (0, 1, {"provider mismatch": 1})
    [message] = miss_logs(caplog)
    assert "provider mismatch" in message and "cold start with firecracker" in message


async def test_mcp_server_request_does_not_take_a_firecracker_warm_workspace(
    service: WorkspaceService, caplog: pytest.LogCaptureFixture
) -> None:
    """MCP servers are routed to gVisor, so a Firecracker pool is a provider mismatch and gVisor cold-starts."""
    caplog.set_level(logging.INFO, logger=pool_module.__name__)
    pool = spec(service, "firecracker")
    pools = await filled(service, pool)
    record = await service.create(CreateWorkspace(container_type="mcp_server"))
    assert record.provider == "gvisor"
    assert record.from_warm_pool is False
    assert (await status_of(pools, pool.key))["miss_reasons"] == {"provider mismatch": 1}
    assert any("cold start with gvisor" in m for m in miss_logs(caplog))


@pytest.mark.parametrize(
    "request_changes",
    [
        pytest.param({"limits": SMALL}, id="limits"),
        pytest.param({"base_image": "corral/workspace:python"}, id="image"),
        pytest.param({"network": "default"}, id="network"),
    ],
)
async def test_spec_mismatch_cold_starts(
    service: WorkspaceService,
    providers: dict[str, FakeProvider],
    caplog: pytest.LogCaptureFixture,
    request_changes: dict[str, Any],
) -> None:
    """A request on the pool's provider but with other limits, image or network misses with "spec mismatch"."""
    caplog.set_level(logging.INFO, logger=pool_module.__name__)
    pool = spec(service)
    pools = await filled(service, pool)
    record = await service.create(CreateWorkspace(**request_changes))
    assert record.provider == "firecracker"
    assert record.from_warm_pool is False
    assert len(await warm(service, pool.key)) == 2
    assert (await status_of(pools, pool.key))["miss_reasons"] == {"spec mismatch": 1}
    assert any("spec mismatch" in m for m in miss_logs(caplog))


async def test_request_no_pool_is_near_counts_an_unpooled_miss(service: WorkspaceService) -> None:
    """A request matching no pool in provider or shape is counted as "no pool configured" and cold-starts."""
    pools = await filled(service, spec(service, "gvisor"))
    record = await service.create(CreateWorkspace(limits=SMALL))
    assert record.provider == "firecracker" and not record.from_warm_pool
    assert pools.unpooled_misses() == {"no pool configured": 1}


async def test_empty_pool_misses_and_cold_starts(
    service: WorkspaceService, providers: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """A matching pool with nothing in it is a "pool empty" miss, logged, and a cold start on the selected provider."""
    caplog.set_level(logging.INFO, logger=pool_module.__name__)
    pool = spec(service)
    pools = WarmPools([pool])  # never filled
    service.attach_pools(pools)
    record = await service.create(CreateWorkspace())
    assert record.provider == "firecracker"
    assert record.from_warm_pool is False
    status = await status_of(pools, pool.key)
    assert (status["hits"], status["misses"], status["miss_reasons"]) == (0, 1, {"pool empty": 1})
    assert any("pool empty" in m for m in miss_logs(caplog))


async def test_concurrent_creates_never_share_a_warm_workspace(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """Five concurrent requests against a pool of two each get their own workspace; none is handed out twice."""
    pool = spec(service)
    pools = await filled(service, pool)
    initially_warm = {r.id for r in await warm(service, pool.key)}
    records = await asyncio.gather(*(service.create(CreateWorkspace()) for _ in range(5)))
    ids = [r.id for r in records]
    assert len(set(ids)) == 5
    from_pool = [r for r in records if r.from_warm_pool]
    assert initially_warm <= {r.id for r in from_pool}  # both warm ones were handed out, once each
    status = await status_of(pools, pool.key)
    assert status["hits"] == len(from_pool)
    assert status["hits"] + status["misses"] == 5
    for record in records:
        assert await providers["firecracker"].state(record.id) is WorkspaceState.RUNNING
        assert (await service.get(record.id)).pool_key is None


async def test_dead_warm_workspace_is_discarded_and_the_next_one_used(
    service: WorkspaceService, providers: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """A warm workspace that died while waiting is discarded, and the next warm workspace is handed out instead."""
    pool = spec(service)
    pools = await filled(service, pool)
    dead, alive = await warm(service, pool.key)
    await providers["firecracker"].destroy(dead.id)  # killed from outside
    record = await service.create(CreateWorkspace())
    assert record.id == alive.id
    assert record.from_warm_pool is True
    assert (await service.get(dead.id)).status == "destroyed"
    assert (await status_of(pools, pool.key))["hits"] == 1
    assert any(dead.id in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


async def test_when_every_warm_workspace_died_a_live_one_is_still_returned(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """With every pooled workspace dead, all are discarded and the request still gets a running workspace."""
    pool = spec(service)
    await filled(service, pool)
    dead = await warm(service, pool.key)
    for record in dead:
        await providers["firecracker"].destroy(record.id)
    record = await service.create(CreateWorkspace())
    assert record.id not in {d.id for d in dead}
    assert record.provider == "firecracker"
    assert await providers["firecracker"].state(record.id) is WorkspaceState.RUNNING
    for gone in dead:
        assert (await service.get(gone.id)).status == "destroyed"


# --- growing ahead of a burst --------------------------------------------------------------------------------------


async def _burst(service: WorkspaceService, n: int) -> list[WorkspaceRecord]:
    """``n`` creates at once."""
    return list(await asyncio.gather(*(service.create(CreateWorkspace()) for _ in range(n))))


async def _ready_count(service: WorkspaceService, key: str, n: int) -> None:
    """Wait until the pool holds exactly ``n`` ready workspaces and no refill runs."""

    async def reached() -> bool:
        return len(await warm(service, key)) == n and not refills_running()

    await eventually(reached)


async def test_a_burst_grows_the_pool_so_the_same_burst_again_is_all_warm(
    service: WorkspaceService, caplog: pytest.LogCaptureFixture
) -> None:
    """Six requests at once on a pool of one: one is warm, five cold; the pool grows to six, and six more at once
    are all warm."""
    caplog.set_level(logging.INFO, logger=pool_module.__name__)
    pool = spec(service, size=1, max_size=10)
    pools = await filled(service, pool)

    first = await _burst(service, 6)
    assert sum(r.from_warm_pool for r in first) == 1
    await _ready_count(service, pool.key, 6)
    status = await status_of(pools, pool.key)
    assert (status["target"], status["base_size"], status["max_size"], status["size"]) == (6, 1, 10, 6)
    assert any("growing to" in r.getMessage() for r in caplog.records)

    second = await _burst(service, 6)
    assert all(r.from_warm_pool for r in second)
    assert len({r.id for r in first + second}) == 12


async def test_a_pool_grows_no_further_than_its_max_size(service: WorkspaceService) -> None:
    """A burst of eight on a pool of one that may grow to three: the pool holds three afterwards."""
    pool = spec(service, size=1, max_size=3)
    pools = await filled(service, pool)
    await _burst(service, 8)
    await _ready_count(service, pool.key, 3)
    assert (await status_of(pools, pool.key))["target"] == 3


async def test_requests_spread_out_do_not_grow_the_pool(
    service: WorkspaceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests further apart than the burst window never count together: the pool keeps its size."""
    monkeypatch.setattr(pool_module, "BURST_WINDOW_S", 0.05)
    pool = spec(service, size=1, max_size=10)
    pools = await filled(service, pool)
    for _ in range(4):
        await service.create(CreateWorkspace())
        await asyncio.sleep(0.1)
    await settle()
    assert (await status_of(pools, pool.key))["target"] == 1
    assert len(await warm(service, pool.key)) == 1


async def test_a_pool_without_headroom_never_grows(service: WorkspaceService) -> None:
    """max_size equal to size (CORRAL_WARM_POOL_GROWTH=1) keeps the pool at its size through a burst."""
    pool = spec(service, size=1)  # max_size 0: no growth
    pools = await filled(service, pool)
    await _burst(service, 5)
    await _ready_count(service, pool.key, 1)
    assert (await status_of(pools, pool.key))["target"] == 1


async def test_a_grown_pool_shrinks_back_once_the_burst_is_forgotten(
    service: WorkspaceService, providers: dict[str, FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After GROWN_FOR_S without another burst the pool returns to its size: the surplus warm workspaces are
    destroyed (records and runtime), the one it keeps is still warm."""
    monkeypatch.setattr(pool_module, "GROWN_FOR_S", 0.5)
    pool = spec(service, size=1, max_size=10)
    pools = await filled(service, pool)
    await _burst(service, 4)
    await _ready_count(service, pool.key, 4)
    grown_ids = {r.id for r in await warm(service, pool.key)}

    await shrunk()  # the shrink check fires after GROWN_FOR_S
    [kept] = await warm(service, pool.key)
    assert (await status_of(pools, pool.key))["target"] == 1
    for gone in grown_ids - {kept.id}:
        assert (await service.get(gone)).status == "destroyed"
        assert await providers["firecracker"].state(gone) is WorkspaceState.MISSING


async def test_a_burst_again_keeps_the_pool_grown(service: WorkspaceService, monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst as large as the grown target renews it: the pool does not shrink under a steady train of bursts."""
    monkeypatch.setattr(pool_module, "GROWN_FOR_S", 1.5)
    monkeypatch.setattr(pool_module, "BURST_WINDOW_S", 0.2)  # the two bursts below are two, not one of six
    pool = spec(service, size=1, max_size=10)
    pools = await filled(service, pool)
    await _burst(service, 3)
    await _ready_count(service, pool.key, 3)
    await asyncio.sleep(0.8)
    await _burst(service, 3)  # renews the memory: 1.5 s from now
    await asyncio.sleep(0.9)  # past the first burst's 1.5 s, well within the second's
    await settle()
    assert (await status_of(pools, pool.key))["target"] == 3
    assert len(await warm(service, pool.key)) == 3


async def test_requests_during_a_shrink_leave_the_pool_its_target(
    service: WorkspaceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests that take warm workspaces while the pool shrinks count toward the surplus: the shrink stops at the
    target instead of destroying a fixed number and leaving the pool empty."""
    monkeypatch.setattr(pool_module, "GROWN_FOR_S", 0.3)
    pool = spec(service, size=1, max_size=10)
    await filled(service, pool)
    await _burst(service, 4)
    await _ready_count(service, pool.key, 4)
    *_, youngest = await warm(service, pool.key)

    parked, release = asyncio.Event(), asyncio.Event()
    discard = service.discard

    async def slow_discard(workspace_id: str) -> None:
        parked.set()
        await release.wait()
        await discard(workspace_id)

    monkeypatch.setattr(service, "discard", slow_discard)
    await asyncio.wait_for(parked.wait(), 5)  # the shrink took the oldest and is destroying it
    taken = [await service.create(CreateWorkspace()) for _ in range(2)]
    assert all(r.from_warm_pool for r in taken)
    release.set()
    await shrunk()
    await settle()
    assert [r.id for r in await warm(service, pool.key)] == [youngest.id]
    assert (await service.get(youngest.id)).status == "ready"


async def test_a_workspace_claimed_for_a_request_that_went_away_is_destroyed(
    service: WorkspaceService, providers: dict[str, FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request cancelled while its claim runs (the claim commits anyway: a write is never cut in half) does not
    leave the workspace it took running outside the pool with no one to use it: it is destroyed, and close()
    waits for that."""
    pool = spec(service, size=1)
    pools = await filled(service, pool)
    [waiting] = await warm(service, pool.key)
    parked, release = asyncio.Event(), asyncio.Event()
    claim = service.store.workspaces.claim_from_pool

    async def slow_claim(*args: Any, **kwargs: Any) -> WorkspaceRecord | None:
        parked.set()
        await release.wait()
        return await claim(*args, **kwargs)

    monkeypatch.setattr(service.store.workspaces, "claim_from_pool", slow_claim)
    request = asyncio.create_task(service.create(CreateWorkspace()))
    await asyncio.wait_for(parked.wait(), 5)
    request.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await request
    await settle()
    await pools.close(drain=False)  # waits for the destroy
    assert (await service.get(waiting.id)).status == "destroyed"
    assert await providers["firecracker"].state(waiting.id) is WorkspaceState.MISSING


# --- status and shutdown -------------------------------------------------------------------------------------------


async def test_status_reports_target_size_hits_misses_and_reasons(service: WorkspaceService) -> None:
    """status() reports each pool's shape, target, current size, hits, misses and miss reasons."""
    pool = spec(service)
    pools = await filled(service, pool)
    await service.create(CreateWorkspace())  # hit
    await service.create(CreateWorkspace(network="default"))  # spec mismatch

    async def refilled() -> bool:
        return (await status_of(pools, pool.key))["size"] == 2

    await eventually(refilled)
    status = await status_of(pools, pool.key)
    assert status["provider"] == "firecracker"
    assert status["image"] == service.settings.base_image
    assert status["resource_limits"] == {"cpu": "2", "memory": "4G", "disk": "10G"}
    assert status["network"] == "isolated"
    assert (status["target"], status["size"], status["creating"]) == (2, 2, 0)
    assert (status["hits"], status["misses"]) == (1, 1)
    assert status["miss_reasons"] == {"spec mismatch": 1}
    assert status["last_error"] is None


async def test_status_reports_the_last_fill_error(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """A pool whose provider cannot create stays short of its target and reports why."""
    providers["gvisor"].fail_create = "runsc runtime is not registered"
    pool = spec(service, "gvisor")
    pools = await filled(service, pool)
    status = await status_of(pools, pool.key)
    assert (status["target"], status["size"]) == (2, 0)
    assert status["last_error"] == "gvisor: runsc runtime is not registered"


async def test_close_with_drain_destroys_every_warm_workspace(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """close(drain=True) destroys every warm workspace and leaves handed-out ones alone."""
    firecracker_pool, gvisor_pool = spec(service), spec(service, "gvisor", network="default")
    pools = await filled(service, firecracker_pool, gvisor_pool)
    in_use = await service.create(CreateWorkspace())
    waiting = await service.store.workspaces.list(status=("creating", "ready"), pool_key=firecracker_pool.key)
    waiting += await service.store.workspaces.list(status=("creating", "ready"), pool_key=gvisor_pool.key)
    await settle()
    await pools.close(drain=True)
    assert [(await service.get(r.id)).status for r in waiting] == ["destroyed"] * len(waiting)
    assert await providers["firecracker"].list_workspaces() == [in_use.id]
    assert await providers["gvisor"].list_workspaces() == []
    assert all(entry["size"] == 0 for entry in await pools.status())


async def test_close_with_drain_also_removes_a_workspace_still_being_created(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """A refill interrupted by close(drain=True) while its provider is still creating leaves nothing behind."""
    pool = spec(service)
    pools = await filled(service, pool)
    providers["firecracker"].create_delay_s = 60.0
    await service.create(CreateWorkspace())  # a hit: the refill starts in the background

    async def refill_is_in_the_provider() -> bool:
        return len(create_calls(providers["firecracker"])) == 3

    await eventually(refill_is_in_the_provider)
    [half_made] = await service.store.workspaces.list(status="creating", pool_key=pool.key)
    await pools.close(drain=True)
    assert (await service.get(half_made.id)).status == "destroyed"
    assert await providers["firecracker"].state(half_made.id) is WorkspaceState.MISSING
    assert await warm(service, pool.key) == []
    assert not refills_running()


async def test_close_without_drain_keeps_warm_workspaces(service: WorkspaceService) -> None:
    """close(drain=False) stops refilling but keeps warm workspaces for the next start to adopt."""
    pool = spec(service)
    pools = await filled(service, pool)
    await pools.close(drain=False)
    pools.schedule_refill(pool.key)
    assert not refills_running()
    assert len(await warm(service, pool.key)) == 2


# --- pool_specs: the default pool and CORRAL_WARM_POOLS -----------------------------------------------------------


def _specs(config: Settings, service: WorkspaceService) -> list[PoolSpec]:
    """pool_specs as the app calls it: the default pool from what auto selection picks now."""
    choice, _ = fallback_chain(
        SelectionInputs.of(config, service.providers), "agent_workspace", service.health.healthy()
    )
    return pool_specs(config, default_provider=next(iter(choice), None), configured=service.providers)


def default_pools(service: WorkspaceService, **settings: Any) -> list[PoolSpec]:
    """pool_specs for the service's providers with these settings."""
    config = service.settings.model_copy(update=settings)
    return _specs(config, service)


async def test_default_pool_uses_the_auto_choice(service: WorkspaceService) -> None:
    """The default pool holds warm workspaces of the default provider, shape and size (Firecracker with KVM)."""
    [default] = default_pools(service, warm_pool_size=2)
    limits = service.default_limits()
    assert default == PoolSpec("firecracker", service.settings.base_image, limits, "isolated", 2, max_size=8)


async def test_default_pool_follows_the_platform(service: WorkspaceService, providers: dict[str, FakeProvider]) -> None:
    """Without KVM the default pool is on gVisor, and filling it creates gVisor workspaces."""
    providers["firecracker"].healthy = False
    await service.health.check_all()
    [default] = default_pools(service, warm_pool_size=1)
    assert default.provider == "gvisor"
    await filled(service, default)
    [waiting] = await warm(service, default.key)
    assert waiting.provider == "gvisor"
    assert create_calls(providers["firecracker"]) == []


async def test_default_pool_is_off_at_size_zero_or_with_no_healthy_provider(
    service: WorkspaceService, providers: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """warm_pool_size 0 turns the default pool off; with no healthy provider it is left out with a warning."""
    assert default_pools(service, warm_pool_size=0) == []
    for provider in providers.values():
        provider.healthy = False
    await service.health.check_all()
    assert default_pools(service, warm_pool_size=2) == []
    assert any("no healthy provider for the default warm pool" in r.getMessage() for r in caplog.records)


async def test_warm_pools_json_is_read_from_the_environment(
    service: WorkspaceService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """CORRAL_WARM_POOLS adds pools; unset fields default to the base image, default limits, isolated and size 1."""
    extra = [
        {
            "provider": "gvisor",
            "size": 3,
            "network": "default",
            "resource_limits": {"cpu": "1", "memory": "1G"},
            "image": "corral/workspace:python",
        },
        {"provider": "docker"},
    ]
    monkeypatch.setenv("CORRAL_WARM_POOLS", json.dumps(extra))
    settings = Settings(data_dir=tmp_path, warm_pool_size=0, allow_docker_fallback=True)
    gvisor, docker = _specs(settings, service)
    assert gvisor == PoolSpec(
        "gvisor",
        "corral/workspace:python",
        ResourceLimits.parse({"cpu": "1", "memory": "1G", "disk": "10G"}),
        "default",
        3,
        max_size=12,  # CORRAL_WARM_POOL_GROWTH (4) times the size
    )
    assert docker == PoolSpec("docker", settings.base_image, service.default_limits(), "isolated", 1, max_size=4)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        pytest.param("[{", "not valid JSON", id="bad-json"),
        pytest.param('{"provider": "gvisor"}', "must be a JSON list", id="not-a-list"),
        pytest.param('["gvisor"]', "CORRAL_WARM_POOLS[0]: needs 'provider'", id="not-an-object"),
        pytest.param('[{"size": 1}]', "needs 'provider'", id="no-provider"),
        pytest.param('[{"provider": "gvisor", "colour": "blue"}]', "needs 'provider'", id="unknown-field"),
        pytest.param('[{"provider": "e2b"}]', "provider 'e2b' is not configured", id="unknown-provider"),
        pytest.param(
            '[{"provider": "docker"}]', "'docker' is not allowed unless CORRAL_ALLOW_DOCKER_FALLBACK", id="docker"
        ),
        pytest.param(
            '[{"provider": "gvisor"}, {"provider": "gvisor", "network": "bridge"}]',
            "CORRAL_WARM_POOLS[1]: network must be 'isolated' or 'default'",
            id="bad-network",
        ),
        pytest.param('[{"provider": "gvisor", "size": -1}]', "size must be a whole number", id="negative-size"),
        pytest.param('[{"provider": "gvisor", "size": 101}]', "size must be a whole number", id="huge-size"),
        pytest.param('[{"provider": "gvisor", "size": "2"}]', "size must be a whole number", id="string-size"),
        pytest.param('[{"provider": "gvisor", "size": 1.5}]', "size must be a whole number", id="fractional-size"),
        pytest.param(
            '[{"provider": "gvisor", "size": 3, "max_size": 2}]',
            "max_size must be a whole number from the pool's size (3) to 100",
            id="max-below-size",
        ),
        pytest.param('[{"provider": "gvisor", "max_size": 101}]', "max_size must be a whole number", id="huge-max"),
        pytest.param('[{"provider": "gvisor", "max_size": true}]', "max_size must be a whole number", id="bool-max"),
        pytest.param(
            '[{"provider": "gvisor", "resource_limits": {"memory": "lots"}}]', "resource_limits.memory", id="limits"
        ),
    ],
)
async def test_bad_warm_pools_json_is_rejected_naming_the_problem(
    service: WorkspaceService, raw: str, problem: str
) -> None:
    """A malformed CORRAL_WARM_POOLS is refused with an InvalidRequestError that says what is wrong."""
    with pytest.raises(InvalidRequestError) as caught:
        default_pools(service, warm_pool_size=0, warm_pools=raw)
    assert problem in caught.value.message
