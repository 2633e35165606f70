"""E2B compatibility: the unmodified E2B SDK drives Corral workspaces.

Point the SDK at a Corral server and it works as with E2B's cloud::

    E2B_API_URL=http://HOST:PORT/e2b
    E2B_SANDBOX_URL=http://HOST:PORT/e2b/envd
    E2B_API_KEY=<CORRAL_API_TOKEN>

* :mod:`~corral.api.e2b.control` serves E2B's control plane under ``/e2b`` (sandboxes: create, list, get, kill,
  timeout, pause, resume/connect, fork; snapshots: create, list, delete), authenticated with ``X-API-KEY``.
* :mod:`~corral.api.e2b.envd` serves envd, the in-sandbox daemon, under ``/e2b/envd`` for every sandbox at once
  (the SDK names the sandbox in the ``E2b-Sandbox-Id`` header), authenticated with the sandbox's
  ``X-Access-Token``; ``/files`` at the root serves the SDK's signed file URLs.
* :mod:`~corral.api.e2b.templates` serves the template build API under ``/e2b`` (``Template.build``, status, tags,
  aliases, delete), building images on the local Docker engine.

Everything goes through :class:`~corral.orchestrator.service.WorkspaceService` and the configured providers: a sandbox
is a workspace, on whatever provider Corral's auto selection picks. Include the routers in ``create_app`` with
:func:`mount_e2b`, which also makes the app answer every error under ``/e2b`` (and ``/files``) in E2B's shapes (see
:mod:`~corral.api.e2b._errors`); do not put Corral's bearer-token dependency on the routers, they authenticate the
way the E2B SDK does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from corral.api.e2b._errors import install_error_handlers
from corral.api.e2b._metrics import metrics_router
from corral.api.e2b._state import E2BState
from corral.api.e2b.control import control_router, delete_template
from corral.api.e2b.envd import envd_router, signed_files_router
from corral.api.e2b.templates import templates_routers
from corral.orchestrator.pool import PoolSpec, grown
from corral.orchestrator.service import WorkspaceService

__all__ = ["E2BState", "default_sandbox_pool", "e2b_routers", "mount_e2b"]


def default_sandbox_pool(service: WorkspaceService) -> PoolSpec | None:
    """The warm pool of E2B's default sandbox (``Sandbox.create()``), or None when CORRAL_E2B_WARM_POOL_SIZE is 0 or
    no provider is healthy.

    Its key is what :func:`~corral.api.e2b.control` asks the pools for: the provider auto selection picks now, the
    base image, the default limits and the ``default`` network (E2B sandboxes have internet access unless told
    otherwise), so such a create never misses on the isolated default pool's "spec mismatch".
    """
    size = service.settings.e2b_warm_pool_size
    try_order, _ = service.plan("auto", "agent_workspace")
    if size <= 0 or not try_order:
        return None
    settings = service.settings
    return PoolSpec(
        try_order[0], settings.base_image, service.default_limits(), "default", size, max_size=grown(settings, size)
    )


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Runs inside create_app's lifespan (FastAPI nests included routers' lifespans), so the service exists and its
    # pools have started: an added pool fills in the background at once.
    service: WorkspaceService = app.state.service
    pool = default_sandbox_pool(service)
    if pool is not None and service.pools is not None:
        service.pools.add(pool)  # False when CORRAL_WARM_POOLS already has this key: that pool serves E2B too
    state = E2BState(service, app.state.api_token, snapshots=app.state.snapshots)
    app.state.e2b = state
    state.start()
    try:
        yield
    finally:
        await state.aclose()


def e2b_routers() -> list[APIRouter]:
    """New routers: ``/e2b`` (control plane) and ``/e2b/envd`` (envd) with the lifespan that runs their state, and
    ``/files`` at the root for the signed URLs of ``download_url``/``upload_url`` (the SDK builds them there)."""
    router = APIRouter(prefix="/e2b", lifespan=_lifespan)
    router.include_router(envd_router(), prefix="/envd")
    router.include_router(metrics_router())  # first: /sandboxes/metrics is no /sandboxes/{sandbox_id}
    # First: DELETE /templates/{id} of a template built here is no snapshot's.
    for templates in templates_routers(delete_template):
        router.include_router(templates)
    router.include_router(control_router())
    return [router, signed_files_router()]


def mount_e2b(app: FastAPI) -> None:
    """Serve the E2B-compatible API on ``app`` (call it in ``create_app``, after the app is built and its error
    handlers are installed: requests under ``/e2b`` then get their errors in E2B's shapes)."""
    for router in e2b_routers():
        app.include_router(router)
    install_error_handlers(app)
