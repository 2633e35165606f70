"""One microVM: a Firecracker process, configured through its API socket, started, paused, snapshotted, restored,
and shut down.

:meth:`MicroVM.boot` runs ``<firecracker> --api-sock <api socket> --id <vm id>`` in the VM's directory (inside the
configured network namespace, if any), waits for the API, then issues, in this order, the pre-boot calls

    PUT /machine-config        {vcpu_count, mem_size_mib, smt: false}
    PUT /boot-source           {kernel_image_path, boot_args}
    PUT /drives/rootfs         {drive_id: "rootfs", path_on_host: "rootfs.ext4", is_root_device: true, ...}
    PUT /network-interfaces/eth0  {iface_id: "eth0", host_dev_name: <tap>, guest_mac}
    PUT /vsock                 {guest_cid, uds_path: "v.sock"}
    PUT /actions               {action_type: "InstanceStart"}

and returns once Firecracker accepted ``InstanceStart`` (the guest agent's readiness is the caller's to await over
vsock). The disk and the vsock socket are given **relative to the VM's directory** (the process's working
directory) because a snapshot records these paths and Firecracker reopens them as recorded when the snapshot is
loaded: relative, they resolve to the loading VM's own disk copy and socket, so one VM's snapshot can be restored
into another VM's directory. Unix socket addresses are limited to 107 bytes, so the provider reaches the vsock
socket through a short symlink under the manager's ``run/`` directory (``VMSpec.vsock_uds``).

:meth:`MicroVM.shutdown` sends ``SendCtrlAltDel``, gives the guest up to 5 s to stop cleanly (the guest reboots,
which ends the Firecracker process), then kills the process. Ctrl-Alt-Del is only key codes injected into the
guest's i8042 controller: a guest whose keyboard driver is not loaded yet, or a kernel without one, never sees
them, and Firecracker still answers 204; the kill after the grace period is what guarantees the stop.

:meth:`MicroVM.pause_vcpus`, :meth:`MicroVM.create_snapshot` and :meth:`MicroVM.resume_vcpus` wrap
``PATCH /vm`` and ``PUT /snapshot/create``; :meth:`MicroVM.restore` starts a fresh process and loads a snapshot
into it (``PUT /snapshot/load``, the only call it makes). The process's output goes to
``<workdir>/firecracker.log``, whose tail is quoted in errors.

On hosts that cannot boot a VM (Corral's CI: PVM KVM, no firecracker binary) this module is exercised with
``firecracker_cmd`` pointing at :mod:`corral.testing.firecracker`, which enforces the same API; a real Firecracker
process restoring real guest memory was not exercised there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.errors import CorralError, ProviderUnavailableError
from corral.microvm.api_client import FirecrackerAPIError, FirecrackerClient, FirecrackerUnreachableError

__all__ = ["DISK_NAME", "VSOCK_NAME", "MicroVM", "ShutdownResult", "VMSpec"]

SHUTDOWN_GRACE_S = 5.0
TERMINATE_GRACE_S = 5.0
SNAPSHOT_TIMEOUT_S = 300.0
"""For ``PUT /snapshot/create`` and ``/snapshot/load``: writing or mapping gigabytes of guest memory takes time."""
DISK_NAME = "rootfs.ext4"
"""The root disk's file name in the VM's directory, as Firecracker is given it (relative)."""
VSOCK_NAME = "v.sock"
"""The vsock socket's name in the VM's directory, as Firecracker is given it (relative)."""
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
    """The Firecracker process's working directory: holds ``firecracker.log``, the disk and the vsock socket."""
    api_socket: str
    vsock_uds: str
    """A short path (a symlink to ``<workdir>/v.sock``) for host processes connecting to the guest."""

    @property
    def drive_path(self) -> str:
        """``path_on_host`` as Firecracker gets it: relative when the disk is in the VM's directory."""
        disk, workdir = os.path.abspath(self.disk_path), os.path.abspath(self.workdir)
        return os.path.relpath(disk, workdir) if os.path.dirname(disk) == workdir else disk


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
        self.vsock_socket = str(self.workdir / VSOCK_NAME)
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
        # Firecracker binds the vsock socket itself and refuses a path that exists (also at snapshot load).
        for stale in (self.api_socket, self.vsock_uds, self.vsock_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        os.symlink(self.vsock_socket, self.vsock_uds)
        argv = [*self.firecracker_cmd, "--api-sock", self.api_socket, "--id", firecracker_id(self.spec.vm_id)]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        log = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            self.process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=self.workdir,
                start_new_session=True,
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
            await client.put_drive("rootfs", path_on_host=spec.drive_path, is_root_device=True, is_read_only=False)
            if spec.tap is not None:
                await client.put_network_interface("eth0", host_dev_name=spec.tap, guest_mac=spec.guest_mac)
            await client.put_vsock(guest_cid=spec.guest_cid, uds_path=VSOCK_NAME)
            await client.start()
        except (FirecrackerAPIError, FirecrackerUnreachableError) as exc:
            raise await self._failed("failed to boot", exc) from exc
        except BaseException:
            await asyncio.shield(self.kill())
            raise
        finally:
            await client.aclose()

    async def restore(self, snapshot_path: str, mem_file_path: str, *, tap: str | None) -> None:
        """Start a fresh process and load a snapshot into it, resumed (``PUT /snapshot/load``, nothing else).

        What the snapshot recorded is reopened as recorded: the disk and vsock socket by their relative names in
        this VM's directory (the vsock path must be free: :meth:`_spawn` removed any stale socket), the network
        interface on ``tap`` through ``network_overrides`` (Firecracker 1.12+; older releases reattach the TAP
        device named in the snapshot, which another VM may hold). The guest keeps everything else it had in
        memory: its vsock CID, and the IP configuration it booted with.

        Raises:
            ProviderUnavailableError: the process did not start or Firecracker refused the load (the process then
                ends by itself, as Firecracker does after a failed load); the message carries its fault message.
        """
        await self._spawn()
        client = FirecrackerClient(self.api_socket, timeout_s=max(self.api_timeout_s, SNAPSHOT_TIMEOUT_S))
        try:
            await self._wait_api(client)
            await client.load_snapshot(
                snapshot_path=snapshot_path,
                mem_file_path=mem_file_path,
                resume_vm=True,
                network_overrides={"eth0": tap} if tap is not None else None,
            )
        except (FirecrackerAPIError, FirecrackerUnreachableError) as exc:
            raise await self._failed("failed to load its snapshot", exc) from exc
        except BaseException:
            await asyncio.shield(self.kill())
            raise
        finally:
            await client.aclose()

    async def _failed(self, what: str, exc: FirecrackerAPIError | FirecrackerUnreachableError) -> CorralError:
        await asyncio.shield(self.kill())
        tail = self.log_tail()
        return ProviderUnavailableError(
            "firecracker",
            f"VM {self.spec.vm_id} {what}: {exc.message}" + (f"; its log ends with: {tail}" if tail else ""),
            details={"vm_id": self.spec.vm_id, **exc.details},
        )

    # --- pause and snapshots ------------------------------------------------------------------------------------

    async def _call(
        self, fn: Callable[[FirecrackerClient], Awaitable[None]], what: str, *, timeout_s: float | None = None
    ) -> None:
        async with FirecrackerClient(self.api_socket, timeout_s=timeout_s or self.api_timeout_s) as client:
            try:
                await fn(client)
            except (FirecrackerAPIError, FirecrackerUnreachableError) as exc:
                tail = self.log_tail()
                raise ProviderUnavailableError(
                    "firecracker",
                    f"VM {self.spec.vm_id}: {what} failed: {exc.message}"
                    + (f"; its log ends with: {tail}" if tail else ""),
                    details={"vm_id": self.spec.vm_id, **exc.details},
                ) from exc

    async def pause_vcpus(self) -> None:
        """``PATCH /vm {"state": "Paused"}``: the guest stops running; the process and its memory stay."""
        await self._call(lambda c: c.patch_vm("Paused"), "pause")

    async def resume_vcpus(self) -> None:
        """``PATCH /vm {"state": "Resumed"}``."""
        await self._call(lambda c: c.patch_vm("Resumed"), "resume")

    async def create_snapshot(self, snapshot_path: str, mem_file_path: str) -> None:
        """``PUT /snapshot/create`` (a full snapshot) of the paused VM: its state and its whole memory. Block devices
        are flushed to their files first; vsock connections are reset (the host must connect again)."""
        await self._call(
            lambda c: c.create_snapshot(snapshot_path=snapshot_path, mem_file_path=mem_file_path),
            "snapshot",
            timeout_s=max(self.api_timeout_s, SNAPSHOT_TIMEOUT_S),
        )

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

    async def terminate(self, grace_s: float = TERMINATE_GRACE_S) -> None:
        """SIGTERM (a paused VM has no clean shutdown: its snapshot holds everything), then SIGKILL past ``grace_s``."""
        if self.alive() and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            if await self._wait_exit(grace_s):
                self._remove_sockets()
                return
        await self.kill()

    async def kill(self) -> None:
        """SIGKILL the process and wait until it is gone."""
        if self.alive() and self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        await self._wait_exit(10.0)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        for path in (self.api_socket, self.vsock_uds, self.vsock_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
