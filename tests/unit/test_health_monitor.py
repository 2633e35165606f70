"""Provider health monitoring (seed 000): cached checks, leaving and rejoining auto selection, bounded checks."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path

import pytest

from corral.orchestrator import health as health_module
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import Health
from corral.providers.fake import FakeProvider
from corral.settings import Settings
from corral.store import Store

ISOLATION = {"docker": "container", "gvisor": "gvisor", "firecracker": "microvm"}
"""What each real provider reports, for the fakes that stand in for them."""

pytestmark = pytest.mark.unit

UNREACHABLE = "firecracker manager unreachable: connection refused"


def fakes(*names: str) -> dict[str, FakeProvider]:
    """In-memory providers named after the real backends, so auto selection considers them."""
    return {name: FakeProvider(name, isolation=ISOLATION.get(name, "none")) for name in names}


def health_calls(provider: FakeProvider) -> int:
    """How many times the provider's health() ran."""
    return sum(1 for method, _ in provider.calls if method == "health")


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    """Messages logged by the health monitor at exactly ``level``."""
    return [r.getMessage() for r in caplog.records if r.name == health_module.__name__ and r.levelno == level]


async def eventually(condition: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    """Wait until ``condition()`` holds, failing after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"condition still false after {timeout_s} s")
        await asyncio.sleep(0.005)


def monitor_tasks() -> list[asyncio.Task[object]]:
    """The health monitor's background tasks still alive in this event loop."""
    return [t for t in asyncio.all_tasks() if t.get_name() == "corral-health-monitor" and not t.done()]


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's CORRAL_* / E2B_API_KEY variables out of Settings."""
    for name in list(os.environ):
        if name.startswith(("CORRAL_", "WORKSPACE_DEFAULT_")) or name == "E2B_API_KEY":
            monkeypatch.delenv(name)


@pytest.fixture
def providers() -> dict[str, FakeProvider]:
    """Firecracker, gVisor and Docker fakes, all healthy to begin with."""
    return fakes("firecracker", "gvisor", "docker")


@pytest.fixture
async def service(tmp_path: Path, providers: dict[str, FakeProvider]) -> AsyncIterator[WorkspaceService]:
    """A service over the fakes and a SQLite file; its health monitor has not run yet (plain docker allowed)."""
    settings = Settings(data_dir=tmp_path, providers=",".join(providers), allow_docker_fallback=True)
    store = await Store.open(settings.sqlalchemy_url())
    monitor = HealthMonitor(providers, interval_s=0.01)
    yield WorkspaceService(settings, store, providers, monitor)
    await monitor.stop()
    await store.close()


def test_health_is_checked_every_30_seconds_by_default(tmp_path: Path) -> None:
    """The health check interval defaults to 30 seconds (CORRAL_HEALTH_INTERVAL_S)."""
    settings = Settings(data_dir=tmp_path)
    assert settings.health_interval_s == 30.0
    assert HealthMonitor({}, settings.health_interval_s).interval_s == 30.0


async def test_check_all_caches_every_result(providers: dict[str, FakeProvider]) -> None:
    """check_all checks each configured provider once and caches the answer; healthy() lists the healthy ones."""
    providers["docker"].healthy = False
    monitor = HealthMonitor(providers, interval_s=30)
    assert monitor.latest("gvisor") is None
    assert monitor.healthy() == []
    results = await monitor.check_all()
    assert set(results) == {"firecracker", "gvisor", "docker"}
    assert sorted(monitor.healthy()) == ["firecracker", "gvisor"]
    gvisor = monitor.latest("gvisor")
    assert gvisor is not None and gvisor.healthy and isinstance(gvisor.checked_at, datetime)
    assert all(health_calls(p) == 1 for p in providers.values())


async def test_selection_reads_the_cache_without_checking(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """A selection decision uses the cached health status and never waits for a health check."""
    await service.health.check_all()
    for _ in range(5):
        service.plan("auto", "agent_workspace")
    await service.create(CreateWorkspace())
    assert all(health_calls(p) == 1 for p in providers.values())


async def test_before_the_first_check_no_provider_is_selected(service: WorkspaceService) -> None:
    """Only providers reporting healthy are selected; an unchecked one is skipped as "not checked yet"."""
    try_order, skipped = service.plan("auto", "agent_workspace")
    assert try_order == []
    assert skipped == [(name, "unhealthy: not checked yet") for name in ("firecracker", "gvisor", "docker")]


async def test_unhealthy_provider_leaves_auto_selection_with_a_warning(
    service: WorkspaceService, providers: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """A failing health check marks the provider unhealthy, removes it from auto selection and logs a warning."""
    providers["firecracker"].healthy = False
    providers["firecracker"].health_error = UNREACHABLE
    await service.health.check_all()
    assert "firecracker" not in service.health.healthy()
    assert messages(caplog, logging.WARNING) == [
        f"provider firecracker is unhealthy and leaves auto selection: {UNREACHABLE}"
    ]
    try_order, skipped = service.plan("auto", "agent_workspace")
    assert try_order == ["gvisor", "docker"]
    assert skipped == [("firecracker", f"unhealthy: {UNREACHABLE}")]
    record = await service.create(CreateWorkspace())
    assert record.provider == "gvisor"
    assert not any(method == "create" for method, _ in providers["firecracker"].calls)


async def test_unhealthy_warning_is_logged_once_per_transition(
    service: WorkspaceService, providers: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """A provider that stays unhealthy over several checks is warned about once, not at every check."""
    providers["gvisor"].healthy = False
    for _ in range(3):
        await service.health.check_all()
    assert len(messages(caplog, logging.WARNING)) == 1


async def test_recovered_provider_rejoins_auto_selection(
    service: WorkspaceService, providers: dict[str, FakeProvider], caplog: pytest.LogCaptureFixture
) -> None:
    """An unhealthy provider is re-added to auto selection when a subsequent health check passes (logged)."""
    caplog.set_level(logging.INFO, logger=health_module.__name__)
    providers["firecracker"].healthy = False
    await service.health.check_all()
    assert (await service.create(CreateWorkspace())).provider == "gvisor"

    providers["firecracker"].healthy = True
    await service.health.check_all()
    assert "firecracker" in service.health.healthy()
    assert messages(caplog, logging.INFO) == ["provider firecracker is healthy again and rejoins auto selection"]
    assert service.plan("auto", "agent_workspace") == (["firecracker", "gvisor", "docker"], [])
    assert (await service.create(CreateWorkspace())).provider == "firecracker"


async def test_health_check_that_raises_reports_unhealthy_with_the_reason(
    providers: dict[str, FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider whose health() raises is reported unhealthy with the exception as the reason; others are fine."""

    async def broken() -> Health:
        raise RuntimeError("manager socket closed")

    monkeypatch.setattr(providers["firecracker"], "health", broken)
    monitor = HealthMonitor(providers, interval_s=30)
    await monitor.check_all()
    result = monitor.latest("firecracker")
    assert result is not None and not result.healthy
    assert result.error == "health check raised RuntimeError: manager socket closed"
    assert sorted(monitor.healthy()) == ["docker", "gvisor"]


async def test_hanging_health_check_is_bounded_and_reports_unhealthy(
    providers: dict[str, FakeProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A health() that never answers is cut off after CHECK_TIMEOUT_S and reported unhealthy with that reason."""
    monkeypatch.setattr(health_module, "CHECK_TIMEOUT_S", 0.05)
    never = asyncio.Event()

    async def hanging() -> Health:
        await never.wait()
        return Health(True)

    monkeypatch.setattr(providers["firecracker"], "health", hanging)
    monitor = HealthMonitor(providers, interval_s=30)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await monitor.check_all()
    assert loop.time() - started < 2.0  # bounded by the (patched) timeout, not by the hang
    result = monitor.latest("firecracker")
    assert result is not None and not result.healthy
    assert result.error == "health check did not answer within 0.05 s"
    assert sorted(monitor.healthy()) == ["docker", "gvisor"]  # checked concurrently, not held up


async def test_mark_unhealthy_removes_a_provider_until_the_next_passing_check(service: WorkspaceService) -> None:
    """A failure seen outside a check (mark_unhealthy) removes the provider until a later check passes."""
    await service.health.check_all()
    service.health.mark_unhealthy("firecracker", "create failed: KVM error")
    assert service.plan("auto", "agent_workspace") == (
        ["gvisor", "docker"],
        [("firecracker", "unhealthy: create failed: KVM error")],
    )
    await service.health.check_all()
    assert service.plan("auto", "agent_workspace")[0][0] == "firecracker"


async def test_start_checks_now_and_keeps_checking_until_stop(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """start() checks at once and then on every interval, so health changes are picked up; stop() ends the loop."""
    monitor = service.health
    await monitor.start()
    assert sorted(monitor.healthy()) == ["docker", "firecracker", "gvisor"]  # the first check ran inside start()

    providers["firecracker"].healthy = False
    await eventually(lambda: "firecracker" not in monitor.healthy())
    providers["firecracker"].healthy = True
    await eventually(lambda: "firecracker" in monitor.healthy())
    assert health_calls(providers["gvisor"]) >= 3
    assert len(monitor_tasks()) == 1

    await monitor.stop()
    assert monitor_tasks() == []
    await monitor.stop()  # stopping twice is harmless


async def test_provider_status_reports_health_and_usage(
    service: WorkspaceService, providers: dict[str, FakeProvider]
) -> None:
    """The status lists every configured provider: name, healthy/unhealthy, last check, active workspaces, resources."""
    providers["firecracker"].healthy = False
    providers["firecracker"].health_error = UNREACHABLE
    await service.health.check_all()
    await service.create(CreateWorkspace())
    status = {entry["name"]: entry for entry in await service.provider_status()}
    assert set(status) == {"firecracker", "gvisor", "docker"}
    assert status["firecracker"]["status"] == "unhealthy"
    assert status["firecracker"]["error"] == UNREACHABLE
    assert status["gvisor"]["status"] == "healthy"
    assert status["gvisor"]["error"] is None
    assert status["gvisor"]["active_workspaces"] == 1
    assert status["docker"]["active_workspaces"] == 0
    assert datetime.fromisoformat(status["gvisor"]["last_check"]).tzinfo is not None
    assert status["gvisor"]["available_resources"]["cpu_count"] == 4
