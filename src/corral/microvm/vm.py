"""One microVM: a Firecracker process, configured through its API socket, started, and shut down.

:meth:`MicroVM.boot` runs ``<firecracker> --api-sock <api socket> --id <vm id>`` (inside the configured
network namespace, if any), waits for the API, then issues, in this order, the pre-boot calls

    PUT /machine-config        {vcpu_count, mem_size_mib, smt: false}
    PUT /boot-source           {kernel_image_path, boot_args}
    PUT /drives/rootfs         {drive_id: "rootfs", path_on_host: <disk>, is_root_device: true, is_read_only: false}
    PUT /network-interfaces/eth0  {iface_id: "eth0", host_dev_name: <tap>, guest_mac}
    PUT /vsock                 {guest_cid, uds_path: <vsock socket>}
    PUT /actions               {action_type: "InstanceStart"}

and returns once Firecracker accepted ``InstanceStart`` (the guest agent's readiness is the caller's to await over
vsock). :meth:`MicroVM.shutdown` sends ``SendCtrlAltDel``, gives the guest up to 5 s to stop cleanly (the guest
reboots, which ends the Firecracker process), then kills the process. The process's output goes to
``<workdir>/firecracker.log``, whose tail is quoted in boot errors.

On hosts that cannot boot a VM (Corral's CI: PVM KVM, no firecracker binary) this module is exercised with
``firecracker_cmd`` pointing at :mod:`corral.testing.firecracker`, which enforces the same API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.errors import ProviderUnavailableError
from corral.microvm.api_client import FirecrackerAPIError, FirecrackerClient, FirecrackerUnreachableError

__all__ = ["MicroVM", "ShutdownResult", "VMSpec"]

SHUTDOWN_GRACE_S = 5.0
LOG_TAIL_BYTES = 2000


@dataclass(frozen=True, slots=True)
class VMSpec:
    """Everything one boot needs."""

    vm_id: str
    vcpu_count: int
    mem_size_mib: int
    kernel_path: str
    boot_args: str
    disk_path: str
    tap: str | None
    guest_mac: str | None
    guest_cid: int
    workdir: str
    """Holds ``firecracker.log``."""
    api_socket: str
    vsock_uds: str


ShutdownResult = str
"""``"clean"`` (the guest stopped by itself after Ctrl-Alt-Del), ``"killed"`` or ``"gone"`` (not running)."""


def firecracker_id(vm_id: str) -> str:
    """Firecracker's ``--id`` accepts letters, digits and ``-`` (at most 64)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", vm_id)[:64]


class MicroVM:
    """A Firecracker process for one :class:`VMSpec`."""

    def __init__(
        self,
        spec: VMSpec,
        *,
        firecracker_cmd: Sequence[str] = ("firecracker",),
        netns: str | None = None,
        api_timeout_s: float = 5.0,
    ) -> None:
        self.spec = spec
        self.firecracker_cmd = tuple(firecracker_cmd)
        self.netns = netns
        self.api_timeout_s = api_timeout_s
        self.workdir = Path(spec.workdir)
        self.api_socket = spec.api_socket
        self.vsock_uds = spec.vsock_uds
        self.log_path = self.workdir / "firecracker.log"
        self.process: asyncio.subprocess.Process | None = None
        self.pid: int | None = None

    # --- process ------------------------------------------------------------------------------------------------

    @classmethod
    def adopt(cls, spec: VMSpec, pid: int, **kwargs: object) -> MicroVM:
        """Take over a Firecracker process started by an earlier manager (after a restart)."""
        vm = cls(spec, **kwargs)  # type: ignore[arg-type]
        vm.pid = pid
        return vm

    def alive(self) -> bool:
        """Whether the Firecracker process still runs (and is ours: its command line names our API socket)."""
        if self.process is not None:
            return self.process.returncode is None
        if self.pid is None:
            return False
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{self.pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            return False
        return state != b"Z" and self.api_socket.encode() in cmdline

    def log_tail(self) -> str:
        """The last lines the process printed."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(fh.tell() - LOG_TAIL_BYTES, 0))
                return fh.read().decode(errors="replace").strip()
        except OSError:
            return ""

    async def _spawn(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for stale in (self.api_socket, self.vsock_uds):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        argv = [*self.firecracker_cmd, "--api-sock", self.api_socket, "--id", firecracker_id(self.spec.vm_id)]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        log = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        except OSError as exc:
            raise ProviderUnavailableError(
                "firecracker", f"cannot start {argv[0]}: {exc}", details={"argv": argv}
            ) from exc
        finally:
            os.close(log)
        self.pid = self.process.pid

    # --- boot ---------------------------------------------------------------------------------------------------

    async def boot(self) -> None:
        """Start the process, configure the VM through the API, and send ``InstanceStart``.

        Raises:
            ProviderUnavailableError: the process did not start or serve its API, or Firecracker refused a call;
                the message carries Firecracker's ``fault_message`` and the tail of its log. The process is
                killed before raising.
        """
        spec = self.spec
        await self._spawn()
        client = FirecrackerClient(self.api_socket, timeout_s=self.api_timeout_s)
        try:
            await self._wait_api(client)
            await client.put_machine_config(vcpu_count=spec.vcpu_count, mem_size_mib=spec.mem_size_mib, smt=False)
            await client.put_boot_source(kernel_image_path=spec.kernel_path, boot_args=spec.boot_args)
            await client.put_drive("rootfs", path_on_host=spec.disk_path, is_root_device=True, is_read_only=False)
            if spec.tap is not None:
                await client.put_network_interface("eth0", host_dev_name=spec.tap, guest_mac=spec.guest_mac)
            await client.put_vsock(guest_cid=spec.guest_cid, uds_path=self.vsock_uds)
            await client.start()
        except (FirecrackerAPIError, FirecrackerUnreachableError) as exc:
            await asyncio.shield(self.kill())
            tail = self.log_tail()
            raise ProviderUnavailableError(
                "firecracker",
                f"VM {spec.vm_id} failed to boot: {exc.message}" + (f"; its log ends with: {tail}" if tail else ""),
                details={"vm_id": spec.vm_id, **exc.details},
            ) from exc
        except BaseException:
            await asyncio.shield(self.kill())
            raise
        finally:
            await client.aclose()

    async def _wait_api(self, client: FirecrackerClient) -> None:
        deadline = time.monotonic() + self.api_timeout_s
        while True:
            if not self.alive():
                raise FirecrackerUnreachableError(
                    f"the firecracker process exited before serving its API (status {self._returncode()})"
                )
            try:
                await client.describe_instance()
            except FirecrackerUnreachableError:
                if time.monotonic() >= deadline:
                    raise
            else:
                return
            await asyncio.sleep(0.01)

    def _returncode(self) -> int | None:
        return self.process.returncode if self.process is not None else None

    # --- shutdown -----------------------------------------------------------------------------------------------

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> ShutdownResult:
        """``SendCtrlAltDel``, up to ``grace_s`` for the process to end by itself, then SIGKILL."""
        if not self.alive():
            self._remove_sockets()
            return "gone"
        client = FirecrackerClient(self.api_socket, timeout_s=min(self.api_timeout_s, grace_s))
        try:
            await client.send_ctrl_alt_del()
        except (FirecrackerAPIError, FirecrackerUnreachableError):
            pass  # not booted, or the API is wedged: the deadline below decides
        finally:
            await client.aclose()
        if await self._wait_exit(grace_s):
            self._remove_sockets()
            return "clean"
        await self.kill()
        return "killed"

    async def _wait_exit(self, timeout_s: float) -> bool:
        if self.process is not None:
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                return False
            return True
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def kill(self) -> None:
        """SIGKILL the process and wait until it is gone."""
        if self.alive() and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        await self._wait_exit(10.0)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        for path in (self.api_socket, self.vsock_uds):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
