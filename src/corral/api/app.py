"""``create_app(settings)``: the FastAPI application with its store, providers and background tasks.

Nothing is created at import time; everything lives on ``app.state`` for the app's lifetime and is closed on shutdown.

Start-up order matters: the setup snapshots' warm pools are registered first (reconciliation keeps the warm
workspaces of configured pools only), then reconciliation (records and runtime agree), then sessions a previous
server left ``provisioning`` are provisioned again (:meth:`~corral.agents.sessions.AgentService.resume_interrupted`).
The data directory (database, api-token, secret-key) is kept private: mode 0700, its files 0600.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI

from corral import __version__
from corral.agents.sessions import AgentService
from corral.api import agents as agents_api
from corral.api import pty, workspaces
from corral.api.deps import require_token
from corral.api.e2b import mount_e2b
from corral.api.errors import install_error_handlers
from corral.api.guard import GuardLimits, RequestGuard
from corral.api.openapi import install_openapi
from corral.api.ports import mount_ports
from corral.api.schemas import HealthResponse
from corral.console import console_router
from corral.credentials import load_secret_box
from corral.orchestrator.disk import DiskWatcher
from corral.orchestrator.health import HealthMonitor
from corral.orchestrator.pool import WarmPools, pool_specs
from corral.orchestrator.reaper import Reaper
from corral.orchestrator.reconcile import reconcile
from corral.orchestrator.selection import SelectionInputs, fallback_chain
from corral.orchestrator.service import WorkspaceService
from corral.orchestrator.snapshots import SnapshotService, reconcile_snapshots
from corral.providers.base import WorkspaceProvider
from corral.providers.registry import build_provider
from corral.settings import Settings
from corral.store import Store
from corral.values import parse_size

__all__ = ["create_app", "private_data_dir", "resolve_api_token"]

log = logging.getLogger(__name__)


def private_data_dir(path: Path) -> None:
    """Create the data directory with mode 0700, or tighten an existing one to it (older installs made it 0755).

    A directory that is plainly not Corral's own (the filesystem root, a shared sticky directory such as /tmp, one
    owned by another user) is left as it is, with a warning: its files are still created 0600.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o077:
        return
    if path.resolve() == Path(path.resolve().anchor) or mode & stat.S_ISVTX or info.st_uid != os.geteuid():
        log.warning(
            "data directory %s is mode %o and shared; point CORRAL_DATA_DIR at a directory of its own", path, mode
        )
        return
    path.chmod(0o700)
    log.info("data directory %s: mode %o tightened to 700", path, mode)


def resolve_api_token(settings: Settings) -> str:
    """CORRAL_API_TOKEN, or a token generated once and kept in ``data_dir/api-token`` (mode 0600)."""
    if settings.api_token:
        return settings.api_token
    path = settings.data_dir / "api-token"
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # made readable by others by hand, or by a copy
        return path.read_text().strip()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    log.warning("CORRAL_API_TOKEN is not set; generated one and wrote it to %s", path)
    return token


async def _reconcile_at_start(service: WorkspaceService, snapshots: SnapshotService, pools: WarmPools) -> None:
    """Records, runtime and warm pools agree again after a restart (or a crash)."""
    await snapshots.sync_setup_pools()  # before reconcile, so the setup pools' warm workspaces are adopted back
    await reconcile(service, pool_keys=pools.keys)
    await reconcile_snapshots(service, service.store)
    await snapshots.sync_setup_pools()  # a setup snapshot whose files vanished loses its pool


def create_app(settings: Settings, *, providers: dict[str, WorkspaceProvider] | None = None) -> FastAPI:
    """Build the API. ``providers`` replaces the configured ones (tests pass fakes here)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        private_data_dir(settings.data_dir)
        box = load_secret_box(
            settings.data_dir, settings.secret_key.get_secret_value() if settings.secret_key else None
        )
        store = await Store.open(settings.sqlalchemy_url())
        built = (
            providers if providers is not None else {n: build_provider(n, settings) for n in settings.provider_names()}
        )
        monitor = HealthMonitor(built, settings.health_interval_s)
        await monitor.check_all()
        # The default pool holds what auto selection picks now for an agent workspace.
        choice, _ = fallback_chain(SelectionInputs.of(settings, built), "agent_workspace", monitor.healthy())
        pools = WarmPools(pool_specs(settings, default_provider=next(iter(choice), None), configured=built))
        service = WorkspaceService(settings, store, built, monitor, pools=pools)
        await service.probe_providers()  # isolation and host size, so answers name their isolation at once
        snapshots = SnapshotService(
            service,
            store,
            storage_limit=parse_size(settings.snapshot_storage_limit, field_name="CORRAL_SNAPSHOT_STORAGE_LIMIT"),
            setup_pool_size=settings.setup_pool_size,
        )
        await _reconcile_at_start(service, snapshots, pools)
        disk = DiskWatcher(service, interval_s=settings.disk_check_interval_s, warn_ratio=settings.disk_warn_ratio)
        app.state.service = service
        app.state.snapshots = snapshots
        app.state.agents = agents = AgentService(service, box, snapshots=snapshots)
        reaper = Reaper(
            service,
            ttl_s=settings.workspace_ttl_s,
            idle_s=settings.idle_timeout_s,
            interval_s=settings.reaper_interval_s,
            failed_ttl_s=settings.failed_record_ttl_s,
            sessions=agents,  # idle sessions end through the agent layer, which destroys their workspaces
        )
        await agents.protect_stored_credentials()
        await agents.resume_interrupted()
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

    # FastAPI's /docs and /redoc load their scripts from a CDN; Corral serves Swagger UI itself (mount_docs).
    app = FastAPI(title="Corral", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    private_data_dir(settings.data_dir)
    app.state.api_token = resolve_api_token(settings)
    install_error_handlers(app)
    # Outermost: authentication and body caps come before anything reads the body (see corral.api.guard).
    app.add_middleware(
        RequestGuard, token=lambda: str(app.state.api_token), limits=GuardLimits(json=settings.max_request_body)
    )
    # Outside even that: a preview host ({port}-{id}.{domain}) belongs to the workspace, whatever its path, and a
    # port's bodies stream uncapped (see corral.api.ports).
    mount_ports(app, domain=settings.sandbox_domain)

    _mount_routes(app, settings)
    return app


def _mount_routes(app: FastAPI, settings: Settings) -> None:
    """Every route, each group with the authentication it needs."""

    @app.get("/healthz", tags=["meta"])
    async def healthz() -> HealthResponse:
        """Liveness: answers without a token."""
        return HealthResponse(status="ok", version=__version__)

    app.include_router(workspaces.router, dependencies=[Depends(require_token)])
    app.include_router(workspaces.snapshots_router, dependencies=[Depends(require_token)])
    app.include_router(agents_api.router, dependencies=[Depends(require_token)])
    # The terminal WebSocket: RequestGuard authenticates the upgrade (header or subprotocol) before it is accepted.
    app.include_router(pty.router)
    # E2B compatibility authenticates the SDK's own way (X-API-KEY, sandbox access tokens): see corral.api.e2b.
    mount_e2b(app)
    # The web console's pages at / are public files; its data comes from the API above, with the token.
    app.include_router(console_router(settings))
    # /openapi.json and Swagger UI at /docs (served from web/node_modules, not a CDN) are public like /healthz.
    install_openapi(app, docs_assets_dir=settings.web_assets_dir)
