"""A workspace service over real Docker and gVisor providers and a real SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.service import WorkspaceService
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import WorkspaceProvider
from corral.providers.docker import DockerProvider
from corral.providers.gvisor import GVisorProvider
from corral.settings import Settings
from corral.store import Store


async def build_service(
    tmp_path: Path, providers: dict[str, WorkspaceProvider], **settings: object
) -> WorkspaceService:
    """A started service (health checked once) whose store is a SQLite file in ``tmp_path``."""
    config = Settings(data_dir=tmp_path, providers=",".join(providers), **settings)  # type: ignore[arg-type]
    store = await Store.open(config.sqlalchemy_url())
    monitor = HealthMonitor(providers, config.health_interval_s)
    await monitor.check_all()
    return WorkspaceService(config, store, providers, monitor)


async def close_service(service: WorkspaceService) -> None:
    """Destroy every workspace the service knows, then close it."""
    for record in await service.list_workspaces():
        await service.destroy(record.id)
    await service.aclose()
    await service.store.close()


@pytest.fixture
async def real_service(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[WorkspaceService]:
    """gVisor and Docker providers on the local engine."""
    providers: dict[str, WorkspaceProvider] = {
        "gvisor": GVisorProvider(DockerEngine(docker_engine.socket_path)),
        "docker": DockerProvider(DockerEngine(docker_engine.socket_path)),
    }
    service = await build_service(tmp_path, providers)
    yield service
    await close_service(service)
