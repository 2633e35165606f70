"""``create_app(settings)``: the FastAPI application with its store, providers and background tasks.

Nothing is created at import time; everything lives on ``app.state`` for the app's lifetime and is closed on shutdown.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI

from corral import __version__
from corral.agents.sessions import AgentService
from corral.api import agents as agents_api
from corral.api import workspaces
from corral.api.deps import require_token
from corral.api.e2b import mount_e2b
from corral.api.errors import install_error_handlers
from corral.orchestrator.disk import DiskWatcher
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.pool import WarmPools, pool_specs
from corral.orchestrator.reaper import Reaper
from corral.orchestrator.reconcile import reconcile
from corral.orchestrator.service import WorkspaceService
from corral.providers.base import WorkspaceProvider
from corral.providers.registry import build_provider
from corral.settings import Settings
from corral.store import Store

__all__ = ["create_app", "resolve_api_token"]

log = logging.getLogger(__name__)


def resolve_api_token(settings: Settings) -> str:
    """CORRAL_API_TOKEN, or a token generated once and kept in ``data_dir/api-token`` (mode 0600)."""
    if settings.api_token:
        return settings.api_token
    path = settings.data_dir / "api-token"
    if path.exists():
        return path.read_text().strip()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    log.warning("CORRAL_API_TOKEN is not set; generated one and wrote it to %s", path)
    return token


def create_app(settings: Settings, *, providers: dict[str, WorkspaceProvider] | None = None) -> FastAPI:
    """Build the API. ``providers`` replaces the configured ones (tests pass fakes here)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        store = await Store.open(settings.sqlalchemy_url())
        built = (
            providers if providers is not None else {n: build_provider(n, settings) for n in settings.provider_names()}
        )
        monitor = HealthMonitor(built, settings.health_interval_s)
        service = WorkspaceService(settings, store, built, monitor)
        await monitor.check_all()
        pools = WarmPools(service, pool_specs(settings, service))
        await reconcile(service, pool_keys=pools.keys)
        service.pools = pools
        disk = DiskWatcher(service, interval_s=settings.disk_check_interval_s, warn_ratio=settings.disk_warn_ratio)
        reaper = Reaper(
            service,
            ttl_s=settings.workspace_ttl_s,
            idle_s=settings.idle_timeout_s,
            interval_s=settings.reaper_interval_s,
        )
        app.state.service = service
        app.state.agents = agents = AgentService(service)
        await monitor.start()
        await disk.start()
        await reaper.start()
        pools.start()
        try:
            yield
        finally:
            await agents.aclose()
            await pools.close(drain=settings.warm_pool_drain_on_shutdown)
            await reaper.stop()
            await disk.stop()
            await monitor.stop()
            await service.aclose()
            await store.close()

    app = FastAPI(title="Corral", version=__version__, lifespan=lifespan)
    app.state.api_token = resolve_api_token(settings)
    install_error_handlers(app)

    @app.get("/healthz", tags=["meta"])
    async def healthz() -> dict[str, Any]:
        """Liveness: answers without a token."""
        return {"status": "ok", "version": __version__}

    app.include_router(workspaces.router, dependencies=[Depends(require_token)])
    app.include_router(agents_api.router, dependencies=[Depends(require_token)])
    # E2B compatibility authenticates the SDK's own way (X-API-KEY, sandbox access tokens): see corral.api.e2b.
    mount_e2b(app)
    return app
