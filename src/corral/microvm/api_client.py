"""A client for Firecracker's REST API, which every Firecracker process serves on its own Unix socket.

Only the calls Corral needs are wrapped, each mapped one to one onto Firecracker's published API
(``src/firecracker/swagger/firecracker.yaml``), as of release 1.12.0 (the first with ``network_overrides``):

======================================  ==========================================================  =========
call                                    body                                                        allowed
======================================  ==========================================================  =========
``GET /``                               -> ``{id, state: "Not started"|"Running"|"Paused", ...}``   always
``PUT /machine-config``                 ``{vcpu_count, mem_size_mib, smt?}``                        pre-boot
``PUT /boot-source``                    ``{kernel_image_path, boot_args?}``                         pre-boot
``PUT /drives/{drive_id}``              ``{drive_id, path_on_host, is_root_device, is_read_only}``  pre-boot
``PUT /network-interfaces/{iface_id}``  ``{iface_id, host_dev_name, guest_mac?}``                   pre-boot
``PUT /vsock``                          ``{guest_cid, uds_path}``                                   pre-boot
``PUT /actions``                        ``{action_type: "InstanceStart"}``                          pre-boot
``PUT /snapshot/load``                  ``{snapshot_path, mem_backend: {backend_type: "File",       fresh
                                        backend_path}, resume_vm, network_overrides?}``             process
``PUT /actions``                        ``{action_type: "SendCtrlAltDel"}``                         post-boot
``PATCH /drives/{drive_id}``            ``{drive_id, path_on_host?}``                               post-boot
``PATCH /vm``                           ``{state: "Paused"|"Resumed"}``                             post-boot
``PUT /snapshot/create``                ``{snapshot_type: "Full", snapshot_path, mem_file_path}``   paused
======================================  ==========================================================  =========

Paths in bodies may be relative: Firecracker opens them from its working directory. The paths of drives and of
the vsock socket are recorded in a snapshot and reopened as recorded when it is loaded.

Successful ``PUT``/``PATCH`` calls answer ``204 No Content``; failures answer ``400`` (or another status) with
``{"fault_message": "..."}``, which becomes :class:`FirecrackerAPIError` carrying the message verbatim. A socket
that does not exist or does not answer becomes :class:`FirecrackerUnreachableError`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import httpx

from corral.errors import CorralError

__all__ = [
    "FirecrackerAPIError",
    "FirecrackerClient",
    "FirecrackerUnreachableError",
    "InstanceState",
]

InstanceState = Literal["Not started", "Running", "Paused"]
DEFAULT_TIMEOUT_S = 5.0


class FirecrackerAPIError(CorralError):
    """Firecracker refused a request; ``fault_message`` is its own explanation, unchanged."""

    code = "firecracker_api_error"
    http_status = 502

    def __init__(self, method: str, path: str, status: int, fault_message: str) -> None:
        super().__init__(
            f"Firecracker refused {method} {path} ({status}): {fault_message}",
            details={"method": method, "path": path, "status": status, "fault_message": fault_message},
        )
        self.method = method
        self.path = path
        self.status = status
        self.fault_message = fault_message


class FirecrackerUnreachableError(CorralError):
    """The API socket does not exist, refuses connections, or did not answer in time."""

    code = "firecracker_unreachable"
    http_status = 502


class FirecrackerClient:
    """One Firecracker process's API, reached over its Unix socket ``socket_path``."""

    def __init__(self, socket_path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=socket_path),
            base_url="http://localhost",
            timeout=timeout_s,
        )

    async def __aenter__(self) -> FirecrackerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP connection pool (the Firecracker process is not affected)."""
        await self._client.aclose()

    # --- transport ----------------------------------------------------------------------------------------------

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Send one call; return the JSON body of a 200, None for a 204, raise for anything else."""
        try:
            response = await self._client.request(method, path, json=body)
        except (httpx.TransportError, OSError) as exc:
            raise FirecrackerUnreachableError(
                f"Firecracker API socket {self.socket_path} did not answer {method} {path}: {exc!r}",
                details={"socket": self.socket_path},
            ) from exc
        if response.status_code == 204:
            return None
        try:
            data = response.json() if response.content else {}
        except ValueError:
            data = {"fault_message": response.text}
        if response.status_code == 200 and isinstance(data, dict):
            return data
        fault = data.get("fault_message") if isinstance(data, dict) else None
        raise FirecrackerAPIError(method, path, response.status_code, str(fault or response.text or "no message"))

    async def wait_ready(self, timeout_s: float, *, interval_s: float = 0.01) -> dict[str, Any]:
        """Poll ``GET /`` until the process serves its API (it creates the socket a moment after starting)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return await self.describe_instance()
            except FirecrackerUnreachableError:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(interval_s)

    # --- calls --------------------------------------------------------------------------------------------------

    async def describe_instance(self) -> dict[str, Any]:
        """``GET /``: ``{id, state, vmm_version, app_name}``."""
        return await self.request("GET", "/") or {}

    async def state(self) -> InstanceState:
        """The instance state: ``"Not started"``, ``"Running"`` or ``"Paused"``."""
        state: InstanceState = (await self.describe_instance())["state"]
        return state

    async def put_machine_config(self, *, vcpu_count: int, mem_size_mib: int, smt: bool = False) -> None:
        """Set vCPUs and memory (pre-boot only)."""
        await self.request(
            "PUT", "/machine-config", {"vcpu_count": vcpu_count, "mem_size_mib": mem_size_mib, "smt": smt}
        )

    async def get_machine_config(self) -> dict[str, Any]:
        """``GET /machine-config``."""
        return await self.request("GET", "/machine-config") or {}

    async def put_boot_source(self, *, kernel_image_path: str, boot_args: str) -> None:
        """Set the guest kernel and its command line (pre-boot only)."""
        await self.request("PUT", "/boot-source", {"kernel_image_path": kernel_image_path, "boot_args": boot_args})

    async def put_drive(
        self, drive_id: str, *, path_on_host: str, is_root_device: bool, is_read_only: bool = False
    ) -> None:
        """Attach a block device backed by a host file (pre-boot only)."""
        await self.request(
            "PUT",
            f"/drives/{drive_id}",
            {
                "drive_id": drive_id,
                "path_on_host": path_on_host,
                "is_root_device": is_root_device,
                "is_read_only": is_read_only,
            },
        )

    async def patch_drive(self, drive_id: str, *, path_on_host: str) -> None:
        """Point a drive at another host file (post-boot only, e.g. after swapping a disk image)."""
        await self.request("PATCH", f"/drives/{drive_id}", {"drive_id": drive_id, "path_on_host": path_on_host})

    async def put_network_interface(self, iface_id: str, *, host_dev_name: str, guest_mac: str | None) -> None:
        """Attach a virtio-net device backed by the host TAP device ``host_dev_name`` (pre-boot only)."""
        body: dict[str, Any] = {"iface_id": iface_id, "host_dev_name": host_dev_name}
        if guest_mac is not None:
            body["guest_mac"] = guest_mac
        await self.request("PUT", f"/network-interfaces/{iface_id}", body)

    async def put_vsock(self, *, guest_cid: int, uds_path: str) -> None:
        """Attach the vsock device; Firecracker listens on ``uds_path`` for host-initiated connections."""
        await self.request("PUT", "/vsock", {"guest_cid": guest_cid, "uds_path": uds_path})

    async def start(self) -> None:
        """``InstanceStart``: boot the guest (pre-boot only, once)."""
        await self.request("PUT", "/actions", {"action_type": "InstanceStart"})

    async def send_ctrl_alt_del(self) -> None:
        """``SendCtrlAltDel``: ask the guest to shut down cleanly (post-boot, x86_64 only)."""
        await self.request("PUT", "/actions", {"action_type": "SendCtrlAltDel"})

    async def patch_vm(self, state: Literal["Paused", "Resumed"]) -> None:
        """``PATCH /vm``: pause or resume the vCPUs (post-boot; both are idempotent)."""
        await self.request("PATCH", "/vm", {"state": state})

    async def create_snapshot(self, *, snapshot_path: str, mem_file_path: str) -> None:
        """``PUT /snapshot/create``: a full snapshot (state and memory files) of the paused VM."""
        await self.request(
            "PUT",
            "/snapshot/create",
            {"snapshot_type": "Full", "snapshot_path": snapshot_path, "mem_file_path": mem_file_path},
        )

    async def load_snapshot(
        self,
        *,
        snapshot_path: str,
        mem_file_path: str,
        resume_vm: bool,
        network_overrides: dict[str, str] | None = None,
    ) -> None:
        """``PUT /snapshot/load`` on a fresh process: memory from ``mem_file_path``, each interface named in
        ``network_overrides`` (iface id -> TAP device) on another TAP device than the snapshot's."""
        body: dict[str, Any] = {
            "snapshot_path": snapshot_path,
            "mem_backend": {"backend_type": "File", "backend_path": mem_file_path},
            "resume_vm": resume_vm,
        }
        if network_overrides:
            body["network_overrides"] = [
                {"iface_id": iface, "host_dev_name": tap} for iface, tap in sorted(network_overrides.items())
            ]
        await self.request("PUT", "/snapshot/load", body)
