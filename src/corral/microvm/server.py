"""The Firecracker manager's HTTP API (FastAPI), served standalone or mounted in-process by the provider.

======================================  ==============================================================================
``GET /health``                         200 always; ``{status: "healthy"|"unhealthy", kvm: {available, reason,
                                        checks}, active_vms, stopped_vms, paused_vms, snapshots, max_vms, warm_pool,
                                        resources, network, errors}``
``POST /vms``                           ``{id, resource_limits?: {cpu, memory, disk}, network?: "isolated"|
                                        "default", env?, labels?, from_snapshot?}`` -> 201 VM (booted, or restored
                                        from the snapshot; the agent may still be starting: connect to
                                        ``vsock.uds_path`` with retries)
``GET /vms``                            ``{vms: [VM...]}``
``GET /vms/{id}``                       VM
``DELETE /vms/{id}``                    204 (also for an unknown id: destroy is idempotent)
``POST /vms/{id}/stop``                 VM, ``state: "stopped"`` (a paused VM's memory is discarded)
``POST /vms/{id}/resume``               VM, ``state: "running"`` (a paused VM's memory is loaded back)
``POST /vms/{id}/pause``                ``{pause: "memory", vm: VM}``, ``state: "paused"``: memory snapshotted, the
                                        Firecracker process ended
``POST /vms/{id}/snapshots/{snap_id}``  201 Snapshot; the VM keeps running (held still while it is written)
``GET /snapshots``                      ``{snapshots: [Snapshot...]}``
``GET /snapshots/{snap_id}``            Snapshot
``DELETE /snapshots/{snap_id}``         204 (also for an unknown id)
======================================  ==============================================================================

A VM is ``{id, state: "running"|"stopped"|"paused", vcpu_count, mem_size_mib, disk_bytes, disk_path, network:
{tap, host_ip, guest_ip, guest_mac, mode, ...}, vsock: {uds_path, port, guest_cid}, pid, created_at,
from_warm_pool, from_snapshot, boots, last_exit, env, labels}``. A Snapshot is ``{id, kind: "memory", size_bytes,
source_vm, vcpu_count, mem_size_mib, disk_bytes, guest_cid, created_at}``; snapshot ids are the caller's,
``[a-z0-9-]{1,64}``. Errors have Corral's shape ``{"error": {code, message, details}}`` and status (404
``workspace_not_found`` / ``snapshot_not_found``, 409 ``workspace_state_conflict``, 422 ``resource_limit``, 503
``provider_unavailable`` with ``details.reason`` beginning "KVM not available" on hosts that cannot run VMs).

Reaching the agent: the API does not proxy agent traffic. The provider connects to ``vsock.uds_path`` itself
(Firecracker's hybrid vsock, :mod:`corral.microvm.vsock`), so it must share the manager's file system: in-process
that is given; a standalone manager in a container must bind-mount its state directory at the same path into the
Corral server's environment (``-v /var/lib/corral/firecracker:/var/lib/corral/firecracker``).

Run standalone with ``corral firecracker-manager --host H --port P`` (or ``python -m corral.microvm.server``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from corral.errors import CorralError
from corral.microvm.manager import CreateVM, FirecrackerManager, config_from_settings
from corral.values import ResourceLimits

if TYPE_CHECKING:
    from corral.settings import Settings

__all__ = ["CreateVMBody", "create_manager_app", "main", "serve_manager"]

log = logging.getLogger(__name__)


class CreateVMBody(BaseModel):
    """``POST /vms``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=63)
    resource_limits: dict[str, str | int | float] | None = None
    network: Literal["isolated", "default"] = "isolated"
    env: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    from_snapshot: str | None = Field(default=None, pattern=r"^[a-z0-9-]{1,64}$")
    """Restore the VM from this snapshot (its vCPUs, memory size and disk; ``resource_limits`` is not used)."""


def create_manager_app(manager: FirecrackerManager, *, close_manager: bool = False) -> FastAPI:
    """The manager's API over ``manager``; ``close_manager`` closes it when the app shuts down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        del app
        await manager.start()
        yield
        if close_manager:
            await manager.aclose()

    app = FastAPI(title="Corral Firecracker manager", version="1", lifespan=lifespan)

    @app.exception_handler(CorralError)
    async def corral_error(request: Request, exc: CorralError) -> JSONResponse:
        del request
        return JSONResponse(exc.to_json(), status_code=exc.http_status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        del request
        problems = [f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()]
        body = {"error": {"code": "invalid_request", "message": "; ".join(problems), "details": {"problems": problems}}}
        return JSONResponse(body, status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return await manager.health()

    @app.post("/vms", status_code=201)
    async def create_vm(body: CreateVMBody) -> dict[str, Any]:
        limits = ResourceLimits.parse(body.resource_limits)
        request = CreateVM.from_limits(
            body.id, cpu=limits.cpu, memory_bytes=limits.memory_bytes, disk_bytes=limits.disk_bytes,
            network=body.network, env=body.env, labels=body.labels,
        )  # fmt: skip
        return (await manager.create(request, from_snapshot=body.from_snapshot)).to_json()

    @app.get("/vms")
    async def list_vms() -> dict[str, Any]:
        return {"vms": [record.to_json() for record in await manager.list()]}

    @app.get("/vms/{vm_id}")
    async def get_vm(vm_id: str) -> dict[str, Any]:
        return (await manager.get(vm_id)).to_json()

    @app.delete("/vms/{vm_id}", status_code=204)
    async def destroy_vm(vm_id: str) -> Response:
        await manager.destroy(vm_id)
        return Response(status_code=204)

    @app.post("/vms/{vm_id}/stop")
    async def stop_vm(vm_id: str) -> dict[str, Any]:
        return (await manager.stop(vm_id)).to_json()

    @app.post("/vms/{vm_id}/resume")
    async def resume_vm(vm_id: str) -> dict[str, Any]:
        return (await manager.resume(vm_id)).to_json()

    @app.post("/vms/{vm_id}/pause")
    async def pause_vm(vm_id: str) -> dict[str, Any]:
        return {"pause": "memory", "vm": (await manager.pause(vm_id)).to_json()}

    @app.post("/vms/{vm_id}/snapshots/{snapshot_id}", status_code=201)
    async def snapshot_vm(vm_id: str, snapshot_id: str) -> dict[str, Any]:
        return (await manager.snapshot(vm_id, snapshot_id)).to_json()

    @app.get("/snapshots")
    async def list_snapshots() -> dict[str, Any]:
        return {"snapshots": [snap.to_json() for snap in manager.list_snapshots()]}

    @app.get("/snapshots/{snapshot_id}")
    async def get_snapshot(snapshot_id: str) -> dict[str, Any]:
        return manager.get_snapshot(snapshot_id).to_json()

    @app.delete("/snapshots/{snapshot_id}", status_code=204)
    async def delete_snapshot(snapshot_id: str) -> Response:
        await asyncio.to_thread(manager.delete_snapshot, snapshot_id)  # a disk copy can take a moment to delete
        return Response(status_code=204)

    return app


def serve_manager(
    settings: Settings, *, host: str = "127.0.0.1", port: int = 8100, uds: str | None = None, log_level: str = "info"
) -> None:
    """Run the standalone manager (what ``corral firecracker-manager`` does) until interrupted."""
    import uvicorn  # noqa: PLC0415 - only the standalone server needs it

    manager = FirecrackerManager(config_from_settings(settings))
    app = create_manager_app(manager, close_manager=True)
    where = f"unix:{uds}" if uds else f"http://{host}:{port}"
    log.info("firecracker manager: serving on %s (state in %s)", where, manager.config.state_dir)
    if uds:
        uvicorn.run(app, uds=uds, log_level=log_level.lower(), access_log=False)
    else:
        uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), access_log=False)


def main(argv: list[str] | None = None) -> None:
    """``python -m corral.microvm.server --host H --port P`` (the same as ``corral firecracker-manager``)."""
    from corral.settings import Settings  # noqa: PLC0415 - keeps the module importable without settings side effects

    parser = argparse.ArgumentParser(description="Corral's Firecracker manager service.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--uds", default=None, help="listen on this Unix socket instead of TCP")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_manager(Settings(), host=args.host, port=args.port, uds=args.uds, log_level=args.log_level)


if __name__ == "__main__":
    main()
