"""The reaper: workspaces past their TTL are destroyed, idle ones stopped, kept failed creates deleted. Time is
faked."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from corral.orchestrator import reaper as reaper_module
from corral.orchestrator import service as service_module
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.pool import PoolSpec, WarmPools
from corral.orchestrator.reaper import Reaper
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import ExecRequest, WorkspaceState
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import Store, _common, agent_types, audit, sessions, workspaces

pytestmark = pytest.mark.unit


class FakeClock:
    """Wall-clock time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        """Stands in for ``time.time()``."""
        return self.now

    def utcnow(self) -> datetime:
        """Stands in for the store's ``utcnow()``, so records are stamped on the same clock."""
        return datetime.fromtimestamp(self.now, UTC)

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds


def reaper_tasks() -> list[asyncio.Task[object]]:
    """The reaper's background tasks still alive in this event loop."""
    return [t for t in asyncio.all_tasks() if t.get_name() == "corral-reaper" and not t.done()]


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* / E2B_API_KEY variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """One fake clock for the reaper's ``time.time()``, the service's last-use stamps and the store's timestamps."""
    fake = FakeClock()
    monkeypatch.setattr(reaper_module, "time", fake)
    monkeypatch.setattr(service_module, "time", fake)
    for store_module in (_common, workspaces, agent_types, sessions, audit):  # every module that stamps times
        monkeypatch.setattr(store_module, "utcnow", fake.utcnow)
    return fake


@pytest.fixture
def provider() -> FakeProvider:
    """The one backend: a gVisor fake."""
    return FakeProvider("gvisor")


@pytest.fixture
async def service(tmp_path: Path, provider: FakeProvider, clock: FakeClock) -> AsyncIterator[WorkspaceService]:
    """A service over the fake and a SQLite file, health checked once."""
    settings = Settings(data_dir=tmp_path, providers="gvisor")
    store = await Store.open(settings.sqlalchemy_url())
    monitor = HealthMonitor({"gvisor": provider}, settings.health_interval_s)
    await monitor.check_all()
    service = WorkspaceService(settings, store, {"gvisor": provider}, monitor)
    yield service
    if service.pools is not None:
        await service.pools.close(drain=True)
    await store.close()


def reaper(
    service: WorkspaceService,
    *,
    ttl_s: float = 0.0,
    idle_s: float = 0.0,
    interval_s: float = 60.0,
    failed_ttl_s: float = 0.0,
) -> Reaper:
    """A reaper over the service."""
    return Reaper(service, ttl_s=ttl_s, idle_s=idle_s, interval_s=interval_s, failed_ttl_s=failed_ttl_s)


async def new_workspace(service: WorkspaceService) -> str:
    """Create a workspace now (on the fake clock) and return its id."""
    return (await service.create(CreateWorkspace())).id


async def assert_destroyed(service: WorkspaceService, provider: FakeProvider, workspace_id: str) -> None:
    """The record says destroyed and the runtime object is gone."""
    assert (await service.get(workspace_id)).status == "destroyed"
    assert await provider.state(workspace_id) is WorkspaceState.MISSING


async def assert_kept(service: WorkspaceService, provider: FakeProvider, workspace_id: str) -> None:
    """The record is still ready and the runtime object still runs."""
    assert (await service.get(workspace_id)).status == "ready"
    assert await provider.state(workspace_id) is WorkspaceState.RUNNING


def test_defaults_are_an_hour_of_idle_time_and_no_ttl(service: WorkspaceService) -> None:
    """By default there is no TTL, the idle timeout is an hour (warned about 5 minutes ahead) and failed creates kept
    on request are deleted after an hour."""
    settings = service.settings
    assert (settings.workspace_ttl_s, settings.idle_timeout_s, settings.idle_warning_s) == (0.0, 3600.0, 300.0)
    assert settings.failed_record_ttl_s == 3600.0


async def test_reaper_with_everything_off_does_nothing(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """With no TTL, no idle timeout and no failed-record TTL the reaper is off: start() runs nothing, sweeps reap
    none."""
    off = Reaper(service, ttl_s=0, idle_s=0, interval_s=60, failed_ttl_s=0)
    assert off.enabled is False
    await off.start()
    assert reaper_tasks() == []
    workspace_id = await new_workspace(service)
    clock.advance(10 * 365 * 24 * 3600)
    assert await off.sweep() == []
    await assert_kept(service, provider, workspace_id)
    await off.stop()  # nothing to stop is fine


@pytest.mark.parametrize(("ttl_s", "idle_s"), [(60.0, 0.0), (0.0, 60.0), (60.0, 60.0)])
def test_reaper_is_enabled_by_a_ttl_or_an_idle_timeout(service: WorkspaceService, ttl_s: float, idle_s: float) -> None:
    """Setting either a TTL or an idle timeout turns the reaper on."""
    assert reaper(service, ttl_s=ttl_s, idle_s=idle_s).enabled is True


async def test_ttl_destroys_old_workspaces_and_keeps_fresh_ones(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """With ttl_s set, a workspace older than the TTL is destroyed by sweep() and a younger one is kept."""
    old = await new_workspace(service)
    clock.advance(50)
    fresh = await new_workspace(service)
    clock.advance(20)  # old is 70 s old, fresh 20 s
    assert await reaper(service, ttl_s=60).sweep() == [old]
    await assert_destroyed(service, provider, old)
    await assert_kept(service, provider, fresh)
    assert ("destroy", old) in provider.calls


async def test_ttl_counts_from_creation_even_for_busy_workspaces(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """The TTL is a lifetime: a workspace used a moment ago is still destroyed once it is older than the TTL."""
    workspace_id = await new_workspace(service)
    clock.advance(61)
    await service.exec(workspace_id, ExecRequest("true"))
    assert await reaper(service, ttl_s=60).sweep() == [workspace_id]
    await assert_destroyed(service, provider, workspace_id)


async def assert_stopped(service: WorkspaceService, provider: FakeProvider, workspace_id: str) -> None:
    """The record says stopped and the runtime object is stopped, not removed (its disk is kept)."""
    assert (await service.get(workspace_id)).status == "stopped"
    assert await provider.state(workspace_id) is WorkspaceState.STOPPED


async def test_idle_timeout_stops_idle_workspaces_and_keeps_used_ones(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """With idle_s set, a workspace used recently (service.exec) is kept while one unused for longer is stopped."""
    used, idle = await new_workspace(service), await new_workspace(service)
    clock.advance(50)
    result = await service.exec(used, ExecRequest("echo hi"))
    assert result.exit_code == 0
    clock.advance(20)  # used: idle 20 s; idle: unused for 70 s since creation
    sweeper = reaper(service, idle_s=60)
    assert await sweeper.sweep() == [idle]
    await assert_stopped(service, provider, idle)
    await assert_kept(service, provider, used)

    clock.advance(41)  # now used has been idle 61 s too
    assert await sweeper.sweep() == [used]
    await assert_stopped(service, provider, used)
    clock.advance(3600)
    assert await sweeper.sweep() == []  # stopped ones stay stopped: idle time never destroys
    await service.resume(idle)  # and come back on resume, which counts as use
    await assert_kept(service, provider, idle)
    assert await sweeper.sweep() == []


async def test_file_calls_count_as_use(service: WorkspaceService, provider: FakeProvider, clock: FakeClock) -> None:
    """Writing a file counts as use for the idle timeout, like exec."""
    workspace_id = await new_workspace(service)
    clock.advance(50)
    await service.write_file(workspace_id, "notes.txt", b"still here")
    clock.advance(20)
    assert await reaper(service, idle_s=60).sweep() == []
    await assert_kept(service, provider, workspace_id)


async def test_stopped_workspaces_are_reaped_too(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """A stopped workspace past its TTL is destroyed like a ready one."""
    workspace_id = await new_workspace(service)
    await service.stop(workspace_id)
    clock.advance(61)
    assert await reaper(service, ttl_s=60).sweep() == [workspace_id]
    await assert_destroyed(service, provider, workspace_id)


async def test_kept_failed_creates_are_deleted_after_their_grace_period(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """A failed create kept with keep_failed stays through its grace period, then the reaper deletes its record."""
    provider.fail_create = "runsc missing"
    with pytest.raises(Exception, match="runsc missing"):
        await service.create(CreateWorkspace(keep_failed=True))
    [record] = await service.store.workspaces.list(status="error")
    sweeper = reaper(service, ttl_s=60, idle_s=60)
    sweeper.failed_ttl_s = 600
    clock.advance(599)
    assert await sweeper.sweep() == []
    assert (await service.get(record.id)).status == "error"
    clock.advance(2)
    assert await sweeper.sweep() == [record.id]
    assert await service.store.workspaces.get(record.id) is None


async def test_broken_workspaces_are_not_collected_as_failed_creates(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """A workspace that broke after it was created (error with a provider) is left for a resume or a person."""
    workspace_id = await new_workspace(service)
    await service.mark_error(workspace_id, "agent broke the protocol")
    clock.advance(10 * 3600)
    assert await reaper(service, ttl_s=0, idle_s=60, failed_ttl_s=60).sweep() == []
    assert (await service.get(workspace_id)).status == "error"


async def test_warm_pool_workspaces_are_not_reaped(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock
) -> None:
    """Warm workspaces waiting in a pool are not in use, so neither the TTL nor the idle timeout applies to them."""
    pool = PoolSpec("gvisor", service.settings.base_image, service.default_limits(), "isolated", 2)
    pools = WarmPools([pool])
    service.attach_pools(pools)
    await pools.refill(pool.key)
    clock.advance(3600)
    assert await reaper(service, ttl_s=60, idle_s=60).sweep() == []
    assert len(await service.store.workspaces.list(status="ready", pool_key=pool.key)) == 2


async def test_start_sweeps_in_the_background_until_stop(
    service: WorkspaceService, provider: FakeProvider, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An enabled reaper started with a short interval destroys an expired workspace by itself; stop() ends it."""
    workspace_id = await new_workspace(service)
    clock.advance(61)
    sweeper = reaper(service, ttl_s=60, interval_s=0.01)
    sweep = sweeper.sweep
    reaped = asyncio.Event()

    async def observed_sweep() -> list[str]:
        result = await sweep()
        if result:
            # Park the loop in its sleep, so stop() never cancels a sweep in the middle of a database call.
            sweeper.interval_s = 3600
            reaped.set()
        return result

    monkeypatch.setattr(sweeper, "sweep", observed_sweep)
    await sweeper.start()
    assert len(reaper_tasks()) == 1
    await asyncio.wait_for(reaped.wait(), timeout=5)
    await sweeper.stop()
    assert reaper_tasks() == []
    await assert_destroyed(service, provider, workspace_id)
