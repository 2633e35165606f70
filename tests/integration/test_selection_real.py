"""Seed 000's selection and fallback scenarios with the real providers of this host: Firecracker (whose readiness
check fails here), gVisor and Docker on a real engine, plus providers made to fail."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.errors import AllProvidersFailedError, ProviderUnavailableError
from corral.microvm.readiness import ReadinessConfig
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import WorkspaceProvider, WorkspaceState
from corral.providers.docker import DockerProvider
from corral.providers.firecracker import FirecrackerProvider
from corral.providers.gvisor import GVisorProvider
from tests.integration.conftest import build_service, close_service

pytestmark = pytest.mark.integration


def _host_providers(socket_path: str, *, gvisor_runtime: str = "runsc") -> dict[str, WorkspaceProvider]:
    return {
        "firecracker": FirecrackerProvider(ReadinessConfig()),
        "gvisor": GVisorProvider(DockerEngine(socket_path), runtime=gvisor_runtime),
        "docker": DockerProvider(DockerEngine(socket_path)),
    }


@pytest.fixture
async def service(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[WorkspaceService]:
    # Plain docker allowed: the fallback scenarios below end on it.
    svc = await build_service(tmp_path, _host_providers(docker_engine.socket_path), allow_docker_fallback=True)
    yield svc
    await close_service(svc)


async def test_auto_picks_gvisor_here_and_says_firecracker_was_skipped(service: WorkspaceService) -> None:
    """With default settings on a host without usable KVM, auto picks gVisor; firecracker, never tried, is not an
    attempt but one short warning, and its reason stays with its health."""
    if (await service.providers["firecracker"].health()).healthy:
        pytest.skip("this host can run Firecracker; the scenario needs one that cannot")
    record = await service.create(CreateWorkspace())
    assert record.requested_provider == "auto"
    assert record.provider == "gvisor"
    assert await service.providers["gvisor"].state(record.id) is WorkspaceState.RUNNING
    assert record.provider_attempts == ()
    assert record.warnings == ("skipped firecracker (unhealthy); reasons at GET /api/v1/agent/workspaces/providers",)
    health = service.health.latest("firecracker")
    assert health is not None and health.error is not None and "KVM not available" in health.error


async def test_explicit_firecracker_fails_without_fallback(service: WorkspaceService) -> None:
    """An explicit provider never falls back: the error names firecracker and why KVM cannot be used."""
    before = await service.providers["gvisor"].list_workspaces()
    with pytest.raises(ProviderUnavailableError) as caught:
        await service.create(CreateWorkspace(provider="firecracker"))
    assert caught.value.provider == "firecracker"
    assert caught.value.reason.startswith("KVM not available")
    assert await service.providers["gvisor"].list_workspaces() == before


async def test_gvisor_failing_at_create_falls_back_to_docker_with_a_warning(
    service: WorkspaceService, caplog: pytest.LogCaptureFixture
) -> None:
    """When gVisor was healthy but its create fails, auto falls back to plain Docker, logs it, and records gVisor's
    attempt (firecracker, skipped untried on this host, only in a one-line warning)."""
    gvisor = service.providers["gvisor"]
    assert isinstance(gvisor, GVisorProvider)
    gvisor.runtime = "runsc-unregistered"  # as if runsc vanished from dockerd after the last health check
    gvisor._runtimes_checked_at = float("-inf")
    with caplog.at_level(logging.WARNING):
        record = await service.create(CreateWorkspace())
    assert record.provider == "docker"
    assert [a.provider for a in record.provider_attempts] == ["gvisor"]
    assert "gVisor runtime not available" in record.provider_attempts[0].error
    assert any("isolation is reduced" in w for w in record.warnings)
    assert any("falling back to docker" in r.getMessage() for r in caplog.records)
    assert any("SECURITY" in r.getMessage() for r in caplog.records)


async def test_every_provider_failing_gives_one_error_listing_each(tmp_path: Path) -> None:
    """With no Docker engine at the configured socket and no KVM, the one error lists every provider's reason."""
    providers = _host_providers(str(tmp_path / "no-docker.sock"))
    service = await build_service(tmp_path, providers, allow_docker_fallback=True)
    try:
        if (await providers["firecracker"].health()).healthy:
            pytest.skip("this host can run Firecracker; the scenario needs one that cannot")
        with pytest.raises(AllProvidersFailedError) as caught:
            await service.create(CreateWorkspace())
        reasons = dict(caught.value.attempts)
        assert set(reasons) == {"firecracker", "gvisor", "docker"}
        assert "KVM not available" in reasons["firecracker"]
        assert "unreachable" in reasons["gvisor"] and "unreachable" in reasons["docker"]
        assert caught.value.http_status == 503
    finally:
        await close_service(service)
