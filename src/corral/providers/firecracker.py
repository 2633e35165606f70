"""The ``firecracker`` provider: workspaces as Firecracker microVMs, through the Firecracker manager's HTTP API.

The provider is a client of the manager (:mod:`corral.microvm.server`). With ``CORRAL_FIRECRACKER_MANAGER_URL``
set it talks to a standalone manager (``http://host:port``, or ``unix:/path/to/socket``); without it, it runs the
manager in-process and reaches the same API through ``httpx.ASGITransport``, so both deployments take one code
path. Lifecycle calls map onto the manager's routes (``POST /vms``, ``POST /vms/{id}/stop|resume``,
``DELETE /vms/{id}``); the manager's JSON errors become Corral's typed errors again (a host without usable KVM
gives ``ProviderUnavailableError`` whose reason begins "KVM not available", so the orchestrator falls back).

Exec and file calls go to the guest agent inside the VM (the same :mod:`corral.guest.agent` the container
providers use, started by the VM's init): the provider reads the VM's vsock socket path from the manager, opens
the hybrid-vsock stream to guest port 1024 (:mod:`corral.microvm.vsock`, retrying while the guest boots), and
multiplexes requests over it with :class:`~corral.guest.client.GuestConnection`. That needs the manager's socket
directory on the provider's file system: given in-process, a bind mount for a containerised manager.

The VM boots the manager's root filesystem (``CORRAL_FIRECRACKER_ROOTFS``, built from the base image by
:mod:`corral.microvm.rootfs`); ``WorkspaceSpec.image`` is recorded as a label, not converted per request.

Stop keeps the VM's whole root disk (``persistence: "full"``). The provider is a
:class:`~corral.providers.base.Snapshotter` through the manager, which uses Firecracker's snapshot API: ``pause``
snapshots memory and ends the VM's process (``POST /vms/{id}/pause``), ``resume`` loads it back; ``snapshot``
captures memory, state and a disk copy while the VM keeps running (``POST /vms/{id}/snapshots/{sid}``);
``restore`` creates a VM from one (``POST /vms`` with ``from_snapshot``: the snapshot's vCPUs, memory and disk,
the spec's id, network mode, env and labels); ``delete_snapshot`` and ``list_snapshots`` map onto
``/snapshots``. A VM restored from another VM's snapshot keeps the source's guest IP configuration (it is in the
guest's memory), which its own TAP device does not route; see :mod:`corral.microvm.manager`.

On a host where KVM cannot boot guests (Corral's CI: PVM KVM, no firecracker binary) ``health`` is unhealthy with
the probe's reason and ``create`` refuses with it; everything here is tested against the manager running the
Firecracker API double (:mod:`corral.testing.firecracker`). That double enforces the snapshot calls but cannot
keep memory: a real Firecracker process restoring real guest memory was not exercised, and under the double a
paused or restored guest comes back with its disk but with its processes started anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import httpx

from corral.errors import (
    CorralError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    SnapshotNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.guest.client import GuestConnection, GuestConnectionLost
from corral.microvm.manager import READINESS_CACHE_S, FirecrackerManager, ManagerConfig, config_from_settings
from corral.microvm.readiness import Check, Readiness, ReadinessConfig, probe
from corral.microvm.server import create_manager_app
from corral.microvm.vsock import VsockConnectError, connect
from corral.providers.agent_backed import AgentBackedProvider
from corral.providers.base import (
    Capabilities,
    ExecRequest,
    Health,
    SnapshotInfo,
    WorkspaceSpec,
    WorkspaceState,
)

if TYPE_CHECKING:
    from corral.settings import Settings

__all__ = ["READINESS_CACHE_S", "FirecrackerProvider", "from_settings"]

AGENT_TIMEOUT_S = 30.0
"""How long create and resume wait for the guest agent to answer over vsock (the guest boots meanwhile)."""
MANAGER_TIMEOUT_S = 120.0
"""Per request to the manager: a create clones a disk and boots a VM."""

_ERRORS: dict[str, type[CorralError]] = {
    "workspace_not_found": WorkspaceNotFoundError,
    "snapshot_not_found": SnapshotNotFoundError,
    "workspace_state_conflict": WorkspaceStateError,
    "resource_limit": ResourceLimitError,
    "invalid_request": InvalidRequestError,
}


class FirecrackerProvider(AgentBackedProvider):
    """Firecracker microVMs managed by a (standalone or in-process) Firecracker manager."""

    name = "firecracker"

    def __init__(
        self,
        config: ReadinessConfig | None = None,
        *,
        probe: Callable[[ReadinessConfig], Readiness] = probe,
        clock: Callable[[], float] = time.monotonic,
        manager: FirecrackerManager | None = None,
        manager_config: ManagerConfig | None = None,
        manager_url: str | None = None,
        output_limit: int = 16 * 1024 * 1024,
        agent_timeout_s: float = AGENT_TIMEOUT_S,
    ) -> None:
        self.output_limit = output_limit
        self.agent_timeout_s = agent_timeout_s
        self.manager: FirecrackerManager | None = None
        if manager_url:
            self.config = config or ReadinessConfig()
            self.manager_url = manager_url
            if manager_url.startswith("unix:"):
                transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(uds=manager_url.removeprefix("unix:"))
                base_url = "http://firecracker-manager"
            else:
                transport, base_url = httpx.AsyncHTTPTransport(), manager_url
        else:
            if manager is None:
                base_config = manager_config or ManagerConfig()
                if config is not None:
                    base_config = dataclasses.replace(base_config, readiness=config)
                manager = FirecrackerManager(base_config, probe=probe, clock=clock)
            self.manager = manager
            self.config = manager.config.readiness
            self.manager_url = "in-process"
            transport, base_url = httpx.ASGITransport(app=create_manager_app(manager)), "http://firecracker-manager"
        self._http = httpx.AsyncClient(transport=transport, base_url=base_url, timeout=MANAGER_TIMEOUT_S)
        self._agents: dict[str, GuestConnection] = {}
        self._agent_locks: dict[str, asyncio.Lock] = {}
        self._env: dict[str, dict[str, str]] = {}
        self._startup_ms: float | None = None

    # --- the manager's API --------------------------------------------------------------------------------------

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ProviderUnavailableError(
                self.name, f"the Firecracker manager at {self.manager_url} is unreachable: {exc!r}"
            ) from exc
        if response.status_code >= 400:
            raise self._error(response)
        return response

    def _error(self, response: httpx.Response) -> CorralError:
        try:
            error = response.json()["error"]
            code, message, details = str(error["code"]), str(error["message"]), dict(error.get("details") or {})
        except (ValueError, KeyError, TypeError):
            text = response.text[:300]
            return ProviderUnavailableError(self.name, f"the manager answered {response.status_code}: {text}")
        if code in ("provider_unavailable", "all_providers_failed") or code not in _ERRORS:
            reason = str(details.pop("reason", message))
            details.pop("provider", None)
            return ProviderUnavailableError(self.name, reason, details=details)
        return _ERRORS[code](message, details=details)

    async def _vm(self, workspace_id: str) -> dict[str, Any]:
        vm: dict[str, Any] = (await self._request("GET", f"/vms/{workspace_id}")).json()
        return vm

    async def manager_health(self) -> dict[str, Any]:
        """The manager's ``GET /health`` body."""
        body: dict[str, Any] = (await self._request("GET", "/health")).json()
        return body

    async def readiness(self) -> Readiness:
        """The manager's readiness verdict (cached there for :data:`READINESS_CACHE_S` seconds)."""
        kvm = (await self.manager_health())["kvm"]
        checks = tuple(Check(c["name"], c["ok"], c["detail"], c.get("skipped", False)) for c in kvm["checks"])
        return Readiness(usable=bool(kvm["available"]), reason=str(kvm["reason"]), checks=checks)

    # --- lifecycle ----------------------------------------------------------------------------------------------

    async def create(self, spec: WorkspaceSpec) -> None:
        """Ask the manager for a VM with the spec's limits and network, then wait for its agent over vsock."""
        started = time.monotonic()
        body = {
            "id": spec.id,
            "resource_limits": spec.limits.to_json(),
            "network": spec.network,
            "env": dict(spec.env),
            "labels": {**dict(spec.labels), "corral.image": spec.image, "corral.container_type": spec.container_type},
        }
        await self._boot(spec.id, body, started)

    async def _boot(self, workspace_id: str, body: dict[str, Any], started: float) -> None:
        """Ask the manager for the VM (``POST /vms``), wait until its agent answers, and note how long it took; a VM
        whose agent never answers is destroyed."""
        await self._request("POST", "/vms", json=body)
        try:
            await self._agent(workspace_id)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.destroy(workspace_id))
            raise
        elapsed = (time.monotonic() - started) * 1000
        self._startup_ms = elapsed if self._startup_ms is None else 0.8 * self._startup_ms + 0.2 * elapsed

    async def destroy(self, workspace_id: str) -> None:
        """Shut the VM down and remove its disk, network and metadata. Idempotent."""
        await self._drop_agent(workspace_id)
        await self._request("DELETE", f"/vms/{workspace_id}")
        self._env.pop(workspace_id, None)

    async def stop(self, workspace_id: str) -> None:
        """Shut the VM down; its disk file keeps the whole file system. A paused VM's memory is discarded."""
        await self._vm(workspace_id)
        await self._drop_agent(workspace_id)
        await self._request("POST", f"/vms/{workspace_id}/stop")

    async def resume(self, workspace_id: str) -> None:
        """Run the VM again (no-op when running): a paused one from its memory snapshot, a stopped one booted on
        its disk; then wait for its agent."""
        await self._request("POST", f"/vms/{workspace_id}/resume")
        await self._agent(workspace_id)

    async def state(self, workspace_id: str) -> WorkspaceState:
        """Running, paused or stopped as the manager sees it; missing when it does not know the id."""
        try:
            vm = await self._vm(workspace_id)
        except WorkspaceNotFoundError:
            return WorkspaceState.MISSING
        return {"running": WorkspaceState.RUNNING, "paused": WorkspaceState.PAUSED}.get(
            vm["state"], WorkspaceState.STOPPED
        )

    # --- pause and snapshots (Snapshotter) ----------------------------------------------------------------------

    async def pause(self, workspace_id: str) -> Literal["memory", "filesystem"]:
        """Snapshot the VM's memory and end its process ("memory"); ``resume`` loads it back. Pausing a paused
        workspace answers "memory"; a stopped one is refused (WorkspaceStateError)."""
        await self._vm(workspace_id)
        await self._drop_agent(workspace_id)
        body = (await self._request("POST", f"/vms/{workspace_id}/pause")).json()
        kept: Literal["memory", "filesystem"] = "filesystem" if body.get("pause") == "filesystem" else "memory"
        return kept

    async def snapshot(self, workspace_id: str, snapshot_id: str) -> SnapshotInfo:
        """Memory, state and a disk copy under ``snapshot_id``; the VM keeps running (held still meanwhile)."""
        try:
            body = (await self._request("POST", f"/vms/{workspace_id}/snapshots/{snapshot_id}")).json()
        finally:
            # Firecracker resets vsock connections when it writes a snapshot: the next call connects again.
            await self._drop_agent(workspace_id)
        return SnapshotInfo(kind=body["kind"], size_bytes=int(body["size_bytes"]))

    async def restore(self, spec: WorkspaceSpec, snapshot_id: str) -> None:
        """Create workspace ``spec.id`` from a snapshot (its vCPUs, memory and disk; the spec's id, network mode,
        env and labels) and wait for its agent.

        Raises:
            SnapshotNotFoundError: the snapshot is gone.
        """
        started = time.monotonic()
        body = {
            "id": spec.id,
            "network": spec.network,
            "env": dict(spec.env),
            "labels": {**dict(spec.labels), "corral.image": spec.image, "corral.container_type": spec.container_type},
            "from_snapshot": snapshot_id,
        }
        await self._boot(spec.id, body, started)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Remove the snapshot's files. Idempotent; workspaces restored from it keep running."""
        await self._request("DELETE", f"/snapshots/{snapshot_id}")

    async def list_snapshots(self) -> list[str]:
        """Ids of every snapshot the manager holds."""
        body = (await self._request("GET", "/snapshots")).json()
        return sorted(str(snap["id"]) for snap in body["snapshots"])

    async def list_workspaces(self) -> list[str]:
        """Every VM the manager holds, running or stopped."""
        body = (await self._request("GET", "/vms")).json()
        return sorted(str(vm["id"]) for vm in body["vms"])

    # --- the agent ----------------------------------------------------------------------------------------------

    async def _require_running(self, workspace_id: str) -> None:
        vm = await self._vm(workspace_id)
        if vm["state"] != "running":
            raise WorkspaceStateError(
                f"workspace {workspace_id} is {vm['state']}; resume it first", details={"id": workspace_id}
            )

    def _exec_env(self, workspace_id: str, request: ExecRequest) -> dict[str, str]:
        return {**self._env.get(workspace_id, {}), **request.env}

    async def _agent(self, workspace_id: str) -> GuestConnection:
        conn = self._agents.get(workspace_id)
        if conn is not None and not conn.closed:
            return conn
        lock = self._agent_locks.setdefault(workspace_id, asyncio.Lock())
        async with lock:
            conn = self._agents.pop(workspace_id, None)
            if conn is not None:
                if not conn.closed:
                    self._agents[workspace_id] = conn
                    return conn
                await conn.aclose()  # the stream ended (VM stopped or crashed): release it before reconnecting
            vm = await self._vm(workspace_id)
            if vm["state"] != "running":
                raise WorkspaceStateError(
                    f"workspace {workspace_id} is {vm['state']}; resume it first", details={"id": workspace_id}
                )
            self._env[workspace_id] = dict(vm.get("env") or {})
            try:
                reader, writer = await connect(
                    vm["vsock"]["uds_path"], vm["vsock"]["port"], timeout_s=self.agent_timeout_s
                )
            except VsockConnectError as exc:
                await self._require_running(workspace_id)
                raise ProviderUnavailableError(self.name, f"the workspace agent is unreachable: {exc.message}") from exc
            conn = GuestConnection(
                reader,
                writer,
                label=f"microVM {workspace_id}",
                on_violation=self._violation_reporter(workspace_id),
                answer_timeout_s=self.agent_answer_timeout_s,
            )
            try:
                await conn.wait_ready(self.agent_timeout_s)
            except GuestConnectionLost as exc:
                await conn.aclose()
                await self._require_running(workspace_id)
                raise ProviderUnavailableError(self.name, f"the workspace agent did not start: {exc}") from exc
            except BaseException:
                await asyncio.shield(conn.aclose())
                raise
            self._agents[workspace_id] = conn
            return conn

    async def _drop_agent(self, workspace_id: str) -> None:
        conn = self._agents.pop(workspace_id, None)
        self._agent_locks.pop(workspace_id, None)
        if conn is not None:
            await conn.aclose()

    # --- health -------------------------------------------------------------------------------------------------

    async def health(self) -> Health:
        """Healthy when the manager answers and its host can run microVMs; the error is its one-sentence reason."""
        started = time.perf_counter()
        try:
            body = await self.manager_health()
        except ProviderUnavailableError as exc:
            return Health(False, exc.reason, latency_ms=(time.perf_counter() - started) * 1000)
        kvm = body["kvm"]
        details: dict[str, object] = {
            c["name"]: {"ok": c["ok"], "detail": c["detail"], "skipped": c.get("skipped", False)} for c in kvm["checks"]
        }
        details["manager"] = {k: v for k, v in body.items() if k != "kvm"}
        return Health(
            healthy=bool(kvm["available"]),
            error=None if kvm["available"] else str(kvm["reason"]),
            latency_ms=(time.perf_counter() - started) * 1000,
            details=details,
        )

    async def capabilities(self) -> Capabilities:
        """MicroVM workspaces; the resources are the manager host's, with whether KVM is usable and why."""
        resources: dict[str, object] = {}
        try:
            body = await self.manager_health()
            resources = {
                **body["resources"],
                "active_vms": body["active_vms"],
                "max_vms": body["max_vms"],
                "kvm_usable": body["kvm"]["available"],
                "reason": body["kvm"]["reason"],
            }
        except ProviderUnavailableError as exc:
            resources = {"kvm_usable": False, "reason": exc.reason}
        return Capabilities(
            isolation="microvm",
            persistence="full",  # stop keeps the VM's whole root disk file
            snapshots="memory",
            pause="memory",
            warm_pool=True,
            streaming=True,
            disk_limit="enforced",
            requirements=("kvm", "firecracker"),
            startup_latency_ms=self._startup_ms if self._startup_ms is not None else 125.0,
            resources=resources,
        )

    async def aclose(self) -> None:
        """Close agent streams and the manager client; VMs keep running (the manager re-adopts them)."""
        for workspace_id in list(self._agents):
            await self._drop_agent(workspace_id)
        await self._http.aclose()
        if self.manager is not None:
            await self.manager.aclose()


def from_settings(settings: Settings) -> FirecrackerProvider:
    """``CORRAL_FIRECRACKER_MANAGER_URL`` set: a client of that manager; unset: an in-process manager configured
    from the ``CORRAL_FIRECRACKER_*`` settings (see :func:`corral.microvm.manager.config_from_settings`)."""
    manager_config = config_from_settings(settings)
    url = getattr(settings, "firecracker_manager_url", None)
    output_limit = int(getattr(settings, "exec_output_limit", 16 * 1024 * 1024))
    if url:
        return FirecrackerProvider(manager_config.readiness, manager_url=url, output_limit=output_limit)
    return FirecrackerProvider(manager_config=manager_config, output_limit=output_limit)
