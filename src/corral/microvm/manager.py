"""The Firecracker manager: the registry of microVMs on one host, their resources, snapshots, and its health.

It runs in-process under ``corral serve`` (when ``CORRAL_FIRECRACKER_MANAGER_URL`` is unset) or standalone as
``corral firecracker-manager`` (:mod:`corral.microvm.server` serves its HTTP API). For each VM it owns

* a directory ``<state_dir>/vms/<id>/`` with ``vm.json`` (the metadata, written atomically on every change, so a
  restarted manager knows its VMs and re-adopts the Firecracker processes still running), the disk
  ``rootfs.ext4``, ``firecracker.log``, the vsock socket ``v.sock`` and, while paused, ``pause.vmstate`` and
  ``pause.mem``; the Firecracker process runs in this directory (see :mod:`corral.microvm.vm` for why);
* the API socket and a short link to the vsock socket under ``<state_dir>/run/`` (Unix socket paths are limited to
  107 bytes);
* a TAP device, a /30 and iptables rules (:mod:`corral.microvm.network`);
* while running, one Firecracker process (:mod:`corral.microvm.vm`).

Lifecycle: ``create`` refuses with the readiness probe's reason ("KVM not available: ...") when the host
cannot run microVMs; otherwise takes a disk from the warm pool (or clones the base rootfs, copy-on-write, grown to
the requested size), sets up the network and boots with ``vcpu_count = ceil(cpu)`` and ``mem_size_mib`` from the
limits. ``stop`` shuts the VM down (Ctrl-Alt-Del, up to 5 s, then kill: the keystroke alone is not relied on) and
keeps disk, network and metadata; ``resume`` boots a new Firecracker process on the same disk file, TAP device and
address; ``destroy`` does the shutdown if needed and removes the disk file, the network configuration and the
metadata. At most ``max_vms`` run at once; past that, and for limits Firecracker cannot grant,
:class:`~corral.errors.ResourceLimitError`.

Memory, through Firecracker's own API:

* ``pause``: ``PATCH /vm Paused``, ``PUT /snapshot/create`` (full) into the VM's directory, then the process is
  ended, which frees its CPU and memory; the VM is ``paused``. ``resume`` starts a fresh process and loads that
  snapshot with ``resume_vm`` (``PUT /snapshot/load``): same disk, same TAP device, processes and memory back.
  ``stop`` of a paused VM discards its memory (the disk stays).
* ``snapshot``: pause, snapshot into ``<state_dir>/snapshots/<snapshot id>/`` (``vmstate``, ``memory``), copy the
  disk beside them while the vCPUs are stopped, resume. Ids are the caller's (``[a-z0-9-]{1,64}``).
* ``create(..., from_snapshot=id)``: a new VM directory with a copy of the snapshot's disk, a new TAP device and
  address, and a fresh process loading the snapshot. What the snapshot recorded comes back as recorded
  (Firecracker requires it): the disk and the vsock socket by their names relative to the process's directory (so
  the new VM's own copy and socket; the socket path must be free at load), the network interface on the new TAP
  device through ``network_overrides`` (Firecracker 1.12 or later; older releases reattach the source's TAP device,
  which the source still holds), and, in guest memory, the vsock CID and the IP configuration the source booted
  with. The new VM's guest therefore keeps the source's address, which its own TAP device does not route:
  re-addressing a restored guest is not implemented.

Not exercised on Corral's machines: a real Firecracker process restoring real guest memory. There the VMM is the
API double (:mod:`corral.testing.firecracker`), which enforces these calls but cannot snapshot memory: a "restored"
guest boots its init again on the restored disk.

The readiness answer is cached for :data:`READINESS_CACHE_S` seconds so ``health`` stays fast.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from corral.errors import (
    CorralError,
    InvalidRequestError,
    ProviderUnavailableError,
    ResourceLimitError,
    SnapshotNotFoundError,
    WorkspaceNotFoundError,
    WorkspaceStateError,
)
from corral.microvm import disks
from corral.microvm.network import DEFAULT_SUBNET, HostNetwork, Lease, NetworkConfig, NetworkError
from corral.microvm.readiness import Readiness, ReadinessConfig, probe
from corral.microvm.vm import DISK_NAME, SHUTDOWN_GRACE_S, MicroVM, VMSpec
from corral.microvm.vsock import AGENT_PORT
from corral.values import NetworkMode, parse_size

if TYPE_CHECKING:
    from corral.settings import Settings

__all__ = [
    "DEFAULT_BOOT_ARGS",
    "READINESS_CACHE_S",
    "CreateVM",
    "FirecrackerManager",
    "ManagerConfig",
    "SnapshotRecord",
    "VMRecord",
    "config_from_settings",
    "readiness_config_from_settings",
]

log = logging.getLogger(__name__)

READINESS_CACHE_S = 10.0
MIB = 1024 * 1024
GIB = 1024 * MIB
MAX_VCPUS = 32
DEFAULT_BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd"
"""Firecracker's default guest command line since 1.12, which dropped ``i8042.nopnp``: on ACPI guest kernels it
keeps the keyboard driver from loading, and ``SendCtrlAltDel`` then never reaches the guest. ``init=``, ``ip=`` and
the agent port are appended per VM."""
SOCKET_PATH_MAX = 107
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
_SNAPSHOT_ID_RE = re.compile(r"^[a-z0-9-]{1,64}$")
PAUSE_STATE, PAUSE_MEMORY = "pause.vmstate", "pause.mem"
SNAPSHOT_STATE, SNAPSHOT_MEMORY, SNAPSHOT_META = "vmstate", "memory", "snapshot.json"

VMState = Literal["running", "stopped", "paused"]


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    """Everything the manager needs; :func:`corral.providers.firecracker.from_settings` maps settings onto it."""

    state_dir: Path = Path("/var/lib/corral/firecracker")
    readiness: ReadinessConfig = field(default_factory=ReadinessConfig)
    """The firecracker binary and the guest kernel (``kernel_path``) and base rootfs (``rootfs_path``)."""
    firecracker_cmd: tuple[str, ...] | None = None
    """The VMM command; None: ``(readiness.firecracker_bin,)``. Tests point it at the API double."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    max_vms: int = 32
    warm_pool_size: int = 0
    """Pre-cloned disks kept ready for creates asking for ``warm_disk_bytes``."""
    warm_disk_bytes: int = 10 * GIB
    boot_args: str = DEFAULT_BOOT_ARGS
    agent_port: int = AGENT_PORT
    shutdown_grace_s: float = SHUTDOWN_GRACE_S
    api_timeout_s: float = 5.0

    @property
    def vmm_command(self) -> tuple[str, ...]:
        """The command that starts one Firecracker process."""
        return self.firecracker_cmd or (self.readiness.firecracker_bin,)


@dataclass(frozen=True, slots=True)
class CreateVM:
    """A request for one VM, in Firecracker's units."""

    id: str
    vcpu_count: int = 2
    mem_size_mib: int = 4096
    disk_bytes: int = 10 * GIB
    network: NetworkMode = "isolated"
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_limits(cls, vm_id: str, *, cpu: float, memory_bytes: int, disk_bytes: int, **kwargs: Any) -> CreateVM:
        """Workspace limits (CPUs may be fractional; Firecracker needs whole vCPUs) to a request."""
        return cls(
            id=vm_id, vcpu_count=max(1, math.ceil(cpu)), mem_size_mib=max(1, memory_bytes // MIB),
            disk_bytes=disk_bytes, **kwargs,
        )  # fmt: skip


@dataclass(slots=True)
class VMRecord:
    """What ``vm.json`` holds about one VM, and what the API returns."""

    id: str
    state: VMState
    vcpu_count: int
    mem_size_mib: int
    disk_bytes: int
    disk_path: str
    network: Lease
    guest_cid: int
    api_socket: str
    vsock_uds: str
    created_at: str
    from_warm_pool: bool = False
    pid: int | None = None
    boots: int = 0
    last_exit: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    from_snapshot: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict (also the API's VM representation)."""
        data = asdict(self)
        data["network"] = self.network.to_json()
        data["vsock"] = {"uds_path": self.vsock_uds, "port": AGENT_PORT, "guest_cid": self.guest_cid}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> VMRecord:
        """The inverse of :meth:`to_json`."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["network"] = Lease.from_json(data["network"])
        return cls(**fields)


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    """What ``snapshot.json`` holds about one snapshot, and what the API returns."""

    id: str
    source_vm: str
    vcpu_count: int
    mem_size_mib: int
    disk_bytes: int
    guest_cid: int
    """Recorded in the snapshot's vsock device: VMs restored from it keep it."""
    created_at: str
    size_bytes: int
    """Bytes on the host: state, memory (sparse where the guest never wrote) and the disk copy."""
    kind: Literal["memory"] = "memory"

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SnapshotRecord:
        """The inverse of :meth:`to_json`."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _allocated(*paths: Path) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += path.stat().st_blocks * 512
    return total


def _meminfo() -> dict[str, int]:
    values: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/meminfo", encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024
    return values


class FirecrackerManager:
    """VM registry, limits, warm pool and persistence for one host (or one network namespace)."""

    def __init__(
        self,
        config: ManagerConfig | None = None,
        *,
        probe: Callable[[ReadinessConfig], Readiness] = probe,
        clock: Callable[[], float] = time.monotonic,
        network: HostNetwork | None = None,
    ) -> None:
        self.config = config or ManagerConfig()
        self._probe = probe
        self._clock = clock
        self.network = network or HostNetwork(self.config.network)
        self.vms: dict[str, VMRecord] = {}
        self._procs: dict[str, MicroVM] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._booking: set[str] = set()
        self._readiness: Readiness | None = None
        self._readiness_at = float("-inf")
        self._readiness_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._started = False
        self.errors: deque[str] = deque(maxlen=20)
        self._pool: list[Path] = []
        self._pool_task: asyncio.Task[int] | None = None
        self.pool_hits = 0
        self.pool_misses = 0
        self._clone_method: str | None = None

    # --- paths ------------------------------------------------------------------------------------------------

    @property
    def vms_dir(self) -> Path:
        """``<state_dir>/vms``."""
        return self.config.state_dir / "vms"

    @property
    def run_dir(self) -> Path:
        """``<state_dir>/run``: the Unix sockets."""
        return self.config.state_dir / "run"

    @property
    def pool_dir(self) -> Path:
        """``<state_dir>/pool``: warm disks."""
        return self.config.state_dir / "pool"

    @property
    def snapshots_dir(self) -> Path:
        """``<state_dir>/snapshots``."""
        return self.config.state_dir / "snapshots"

    def vm_dir(self, vm_id: str) -> Path:
        """One VM's directory."""
        return self.vms_dir / vm_id

    def snapshot_dir(self, snapshot_id: str) -> Path:
        """One snapshot's directory (the id is checked first)."""
        if not _SNAPSHOT_ID_RE.match(snapshot_id):
            raise InvalidRequestError(
                f"snapshot_id: {snapshot_id!r} is not a valid snapshot id (1 to 64 of a-z, 0-9 and '-')",
                details={"field": "snapshot_id"},
            )
        return self.snapshots_dir / snapshot_id

    def _socket_paths(self, vm_id: str) -> tuple[str, str]:
        short = hashlib.sha256(vm_id.encode()).hexdigest()[:12]
        api, vsock = str(self.run_dir / f"{short}.api"), str(self.run_dir / f"{short}.vsock")
        if len(vsock) > SOCKET_PATH_MAX:
            raise ProviderUnavailableError(
                "firecracker",
                f"the state directory {self.config.state_dir} is too long for Unix socket paths "
                f"({len(vsock)} > {SOCKET_PATH_MAX} bytes); choose a shorter CORRAL_FIRECRACKER_STATE_DIR",
            )
        return api, vsock

    # --- readiness --------------------------------------------------------------------------------------------

    async def readiness(self) -> Readiness:
        """The probe's answer, computed at most once every :data:`READINESS_CACHE_S` seconds (off the loop)."""
        async with self._readiness_lock:
            if self._readiness is None or self._clock() - self._readiness_at >= READINESS_CACHE_S:
                self._readiness = await asyncio.to_thread(self._probe, self.config.readiness)
                self._readiness_at = self._clock()
            return self._readiness

    async def _require_usable(self, vm_id: str) -> None:
        readiness = await self.readiness()
        if not readiness.usable:
            raise ProviderUnavailableError(
                "firecracker",
                readiness.reason,
                details={"vm_id": vm_id, "checks": {c.name: c.ok for c in readiness.checks}},
            )

    # --- start-up: persisted state ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Load ``vm.json`` files, re-adopt live Firecracker processes, and clean up orphaned network objects.

        Runs once, on first use. Nothing is created or touched when the state directory does not exist yet.
        """
        async with self._start_lock:
            if self._started:
                return
            self._started = True
            if self.vms_dir.is_dir():
                await self._load()
            if self.snapshots_dir.is_dir():  # snapshots a crash left half-written
                for partial in self.snapshots_dir.glob(".*.tmp-*"):
                    shutil.rmtree(partial, ignore_errors=True)
            if self.config.warm_pool_size > 0 and (await self.readiness()).usable:
                self._scan_pool()
                self._schedule_pool_refill()

    async def _load(self) -> None:
        """Read every ``vm.json``, re-adopt live processes, and restore or clean network objects."""
        for meta in sorted(self.vms_dir.glob("*/vm.json")):
            try:
                record = VMRecord.from_json(json.loads(meta.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._error(f"ignoring unreadable VM metadata {meta}: {exc}")
                continue
            self.vms[record.id] = record
            try:
                self.network.allocator.reserve(record.id, record.network.index)
            except ValueError as exc:
                self._error(f"VM {record.id}: {exc}")
            if record.state == "running":
                vm = MicroVM.adopt(self._vm_spec(record), record.pid or -1, **self._vm_kwargs())
                if vm.alive():
                    self._procs[record.id] = vm
                else:
                    record.state, record.pid, record.last_exit = "stopped", None, "not running at manager start"
                    self._save(record)
        try:
            await self.network.cleanup_orphans(set(self.vms))
            for record in self.vms.values():
                await self.network.restore(record.network)
        except (NetworkError, OSError) as exc:
            self._error(f"network clean-up at start failed: {exc}")

    # --- lifecycle --------------------------------------------------------------------------------------------

    def _lock(self, vm_id: str) -> asyncio.Lock:
        return self._locks.setdefault(vm_id, asyncio.Lock())

    def _running(self) -> int:
        return sum(1 for r in self.vms.values() if r.state == "running") + len(self._booking)

    def _check_limits(self, request: CreateVM) -> None:
        if not _ID_RE.match(request.id):
            raise InvalidRequestError(
                f"id: {request.id!r} is not a valid VM id (letters, digits, '_' and '-', at most 63)",
                details={"field": "id"},
            )
        if not 1 <= request.vcpu_count <= MAX_VCPUS:
            raise ResourceLimitError(
                f"firecracker: {request.vcpu_count} vCPUs requested; a microVM has 1 to {MAX_VCPUS}",
                details={"vcpu_count": request.vcpu_count},
            )
        total = _meminfo().get("MemTotal")
        if total is not None and request.mem_size_mib * MIB > total:
            raise ResourceLimitError(
                f"firecracker: {request.mem_size_mib} MiB of memory requested; this host has {total // MIB} MiB",
                details={"mem_size_mib": request.mem_size_mib, "host_memory_bytes": total},
            )
        self._check_capacity()

    def _check_capacity(self) -> None:
        if self._running() >= self.config.max_vms:
            raise ResourceLimitError(
                f"firecracker: {self.config.max_vms} microVMs already run on this host, the configured maximum "
                "(CORRAL_FIRECRACKER_MAX_VMS)",
                details={"max_vms": self.config.max_vms},
            )

    async def create(self, request: CreateVM, *, from_snapshot: str | None = None) -> VMRecord:
        """Disk, network and a booted VM for ``request`` (see the module docstring).

        With ``from_snapshot`` the VM is that snapshot restored: its disk copy, its vCPUs and memory size (the
        request's limits are not used), its processes and memory; the request gives id, network mode, env and
        labels.

        Raises:
            ProviderUnavailableError: the host cannot run microVMs ("KVM not available: ..."), or boot failed.
            ResourceLimitError: past ``max_vms``, too many vCPUs or too much memory, or a disk too small.
            SnapshotNotFoundError: ``from_snapshot`` names no snapshot.
            WorkspaceStateError: a VM with this id exists.
        """
        await self.start()
        await self._require_usable(request.id)
        if request.id in self.vms or request.id in self._booking:
            raise WorkspaceStateError(f"VM {request.id} already exists", details={"id": request.id})
        snapshot: SnapshotRecord | None = None
        if from_snapshot is not None:
            snapshot = self.get_snapshot(from_snapshot)
            request = replace(
                request, vcpu_count=snapshot.vcpu_count, mem_size_mib=snapshot.mem_size_mib,
                disk_bytes=snapshot.disk_bytes,
            )  # fmt: skip
        self._check_limits(request)
        base, kernel = self.config.readiness.rootfs_path, self.config.readiness.kernel_path
        if snapshot is None and (base is None or kernel is None):
            raise ProviderUnavailableError(
                "firecracker", "no guest kernel or rootfs configured (CORRAL_FIRECRACKER_KERNEL, _ROOTFS)"
            )
        self._booking.add(request.id)
        vm_dir = self.vm_dir(request.id)
        lease: Lease | None = None
        record: VMRecord | None = None
        try:
            async with self._lock(request.id):
                if vm_dir.exists():  # left by a create that crashed before writing vm.json
                    shutil.rmtree(vm_dir)
                vm_dir.mkdir(parents=True)
                self.run_dir.mkdir(parents=True, exist_ok=True)
                disk = vm_dir / DISK_NAME
                from_pool = await self._make_disk(disk, request.disk_bytes, snapshot)
                lease = await self.network.setup(request.id, request.network)
                api, vsock = self._socket_paths(request.id)
                record = VMRecord(
                    id=request.id, state="stopped", vcpu_count=request.vcpu_count,
                    mem_size_mib=request.mem_size_mib, disk_bytes=request.disk_bytes, disk_path=str(disk),
                    network=lease, guest_cid=snapshot.guest_cid if snapshot else 3 + lease.index, api_socket=api,
                    vsock_uds=vsock, created_at=_now(), from_warm_pool=from_pool, env=dict(request.env),
                    labels=dict(request.labels), from_snapshot=snapshot.id if snapshot else None,
                )  # fmt: skip
                self._save(record)
                if snapshot is None:
                    await self._boot(record)
                else:
                    where = self.snapshot_dir(snapshot.id)
                    await self._boot_from_snapshot(
                        record, where / SNAPSHOT_STATE, where / SNAPSHOT_MEMORY, override_tap=True
                    )
                self.vms[request.id] = record
        except BaseException as exc:
            if not isinstance(exc, ResourceLimitError | InvalidRequestError):
                self._error(f"create {request.id} failed: {exc!r}")
            await asyncio.shield(self._abandon(request.id, lease))
            raise
        finally:
            self._booking.discard(request.id)
        self._schedule_pool_refill()
        return record

    async def _make_disk(self, disk: Path, size_bytes: int, snapshot: SnapshotRecord | None) -> bool:
        """The new VM's disk: a copy of the snapshot's, or a warm-pool disk (True), or a clone of the base."""
        if snapshot is not None:
            await disks.clone(self.snapshot_dir(snapshot.id) / DISK_NAME, disk)
            return False
        if await self._take_pool_disk(disk, size_bytes):
            return True
        base = self.config.readiness.rootfs_path
        assert base is not None  # checked by create
        await disks.clone(base, disk, size_bytes)
        return False

    async def _boot(self, record: VMRecord) -> None:
        vm = MicroVM(self._vm_spec(record), **self._vm_kwargs())
        await vm.boot()
        self._procs[record.id] = vm
        record.state, record.pid, record.boots = "running", vm.pid, record.boots + 1
        self._save(record)

    async def _boot_from_snapshot(
        self, record: VMRecord, state_path: Path, mem_path: Path, *, override_tap: bool
    ) -> None:
        """A fresh process loading a snapshot, resumed. ``override_tap``: the snapshot is another VM's, whose TAP
        device it names; attach this VM's instead (``network_overrides``)."""
        vm = MicroVM(self._vm_spec(record), **self._vm_kwargs())
        await vm.restore(str(state_path), str(mem_path), tap=record.network.tap if override_tap else None)
        self._procs[record.id] = vm
        record.state, record.pid, record.boots = "running", vm.pid, record.boots + 1
        self._save(record)

    def _vm_kwargs(self) -> dict[str, Any]:
        return {
            "firecracker_cmd": self.config.vmm_command,
            "netns": self.config.network.netns,
            "api_timeout_s": self.config.api_timeout_s,
        }

    def _vm_spec(self, record: VMRecord) -> VMSpec:
        lease = record.network
        boot_args = " ".join(
            (self.config.boot_args, "init=/sbin/corral-init", lease.kernel_ip_arg(dns=self.config.network.dns),
             f"corral.agent_port={self.config.agent_port}")
        )  # fmt: skip
        return VMSpec(
            vm_id=record.id, vcpu_count=record.vcpu_count, mem_size_mib=record.mem_size_mib,
            kernel_path=self.config.readiness.kernel_path or "", boot_args=boot_args, disk_path=record.disk_path,
            tap=lease.tap, guest_mac=lease.guest_mac, guest_cid=record.guest_cid, workdir=str(self.vm_dir(record.id)),
            api_socket=record.api_socket, vsock_uds=record.vsock_uds,
        )  # fmt: skip

    async def get(self, vm_id: str) -> VMRecord:
        """The VM's record, its state refreshed (a VM whose process died is reported stopped).

        Raises:
            WorkspaceNotFoundError: no such VM.
        """
        await self.start()
        record = self.vms.get(vm_id)
        if record is None:
            raise WorkspaceNotFoundError(f"workspace {vm_id} does not exist", details={"id": vm_id})
        self._refresh(record)
        return record

    def _refresh(self, record: VMRecord) -> None:
        vm = self._procs.get(record.id)
        if record.state == "running" and (vm is None or not vm.alive()):
            self._procs.pop(record.id, None)
            tail = vm.log_tail().splitlines()[-1:] if vm is not None else []
            record.state, record.pid = "stopped", None
            record.last_exit = "the Firecracker process exited" + (f": {tail[0]}" if tail else "")
            self._error(f"VM {record.id}: {record.last_exit}")
            self._save(record)

    async def list(self) -> list[VMRecord]:
        """Every VM, running or stopped, sorted by id."""
        await self.start()
        for record in self.vms.values():
            self._refresh(record)
        return [self.vms[k] for k in sorted(self.vms)]

    async def stop(self, vm_id: str) -> VMRecord:
        """Shut the VM down (Ctrl-Alt-Del, grace, kill); keep disk, network and metadata. Stopping twice is fine;
        stopping a paused VM discards its memory snapshot (the disk is kept as the pause left it)."""
        record = await self.get(vm_id)
        async with self._lock(vm_id):
            if record.state == "running":
                vm = self._procs.pop(vm_id, None)
                outcome = await vm.shutdown(self.config.shutdown_grace_s) if vm is not None else "gone"
                record.state, record.pid, record.last_exit = "stopped", None, f"stopped ({outcome})"
                self._save(record)
            elif record.state == "paused":
                self._drop_pause(vm_id)
                record.state, record.last_exit = "stopped", "stopped while paused (its memory was discarded)"
                self._save(record)
        return record

    def _drop_pause(self, vm_id: str) -> None:
        for name in (PAUSE_STATE, PAUSE_MEMORY):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.vm_dir(vm_id) / name)

    async def resume(self, vm_id: str) -> VMRecord:
        """Run the VM again; a running VM is left as it is. A paused VM gets a new Firecracker process that loads
        its pause snapshot (processes and memory come back); a stopped one boots anew on its disk file.

        Raises:
            ProviderUnavailableError: the host cannot run VMs, or the boot or the snapshot load failed (a paused VM
                stays paused; ``stop`` discards its memory so that it can boot cold).
        """
        record = await self.get(vm_id)
        async with self._lock(vm_id):
            if record.state == "running":
                return record
            await self._require_usable(vm_id)
            self._check_capacity()
            self._booking.add(vm_id)
            try:
                if not await self.network.tap_exists(record.network.tap):
                    await self.network.restore(record.network)
                if record.state == "paused":
                    await self._unpause(record)
                else:
                    await self._boot(record)
            except BaseException as exc:
                self._error(f"resume {vm_id} failed: {exc}")
                raise
            finally:
                self._booking.discard(vm_id)
        return record

    async def _unpause(self, record: VMRecord) -> None:
        state, memory = self.vm_dir(record.id) / PAUSE_STATE, self.vm_dir(record.id) / PAUSE_MEMORY
        if not (state.is_file() and memory.is_file()):
            raise ProviderUnavailableError(
                "firecracker",
                f"VM {record.id} is paused but its memory snapshot ({state.name}, {memory.name}) is gone; "
                "stop it to discard the pause, then resume it to boot from its disk",
                details={"vm_id": record.id},
            )
        # Same TAP device as when paused: no network override needed (Firecracker before 1.12 can do this too).
        await self._boot_from_snapshot(record, state, memory, override_tap=False)
        # Firecracker maps the memory file privately; on Linux unlinking it keeps that mapping valid.
        self._drop_pause(record.id)

    async def pause(self, vm_id: str) -> VMRecord:
        """Snapshot the running VM's memory and state into its directory and end its Firecracker process (freeing
        its CPU and memory); ``resume`` restores it. Pausing a paused VM is a no-op.

        Raises:
            WorkspaceStateError: the VM is stopped.
            ProviderUnavailableError: Firecracker refused the pause or the snapshot (the VM then keeps running).
        """
        record = await self.get(vm_id)
        async with self._lock(vm_id):
            if record.state == "paused":
                return record
            vm = self._procs.get(vm_id)
            if record.state != "running" or vm is None:
                raise WorkspaceStateError(
                    f"VM {vm_id} is stopped; only a running VM can be paused", details={"id": vm_id}
                )
            state, memory = self.vm_dir(vm_id) / PAUSE_STATE, self.vm_dir(vm_id) / PAUSE_MEMORY
            await vm.pause_vcpus()
            try:
                await vm.create_snapshot(str(state), str(memory))
            except BaseException:
                self._drop_pause(vm_id)
                with contextlib.suppress(CorralError):
                    await asyncio.shield(vm.resume_vcpus())
                raise
            self._procs.pop(vm_id, None)
            await vm.terminate()
            record.state, record.pid, record.last_exit = "paused", None, "paused (memory snapshot in its directory)"
            self._save(record)
        return record

    async def snapshot(self, vm_id: str, snapshot_id: str) -> SnapshotRecord:
        """Snapshot the running VM into ``<state_dir>/snapshots/<snapshot_id>/``: pause its vCPUs, write state and
        memory, copy its disk (flushed, and still while the vCPUs are stopped), resume. The VM keeps running; its
        vsock connections are reset by the snapshot (Firecracker does that), so clients connect again.

        Raises:
            InvalidRequestError: the snapshot id is not ``[a-z0-9-]{1,64}``.
            WorkspaceStateError: the VM is not running, or the snapshot id is taken.
        """
        target = self.snapshot_dir(snapshot_id)
        record = await self.get(vm_id)
        async with self._lock(vm_id):
            vm = self._procs.get(vm_id)
            if record.state != "running" or vm is None:
                raise WorkspaceStateError(
                    f"VM {vm_id} is {record.state}; only a running VM can be snapshotted", details={"id": vm_id}
                )
            if target.exists():
                raise WorkspaceStateError(
                    f"snapshot {snapshot_id} already exists", details={"snapshot_id": snapshot_id}
                )
            partial = self.snapshots_dir / f".{snapshot_id}.tmp-{uuid.uuid4().hex[:8]}"
            partial.mkdir(parents=True)
            try:
                await vm.pause_vcpus()
                try:
                    await vm.create_snapshot(str(partial / SNAPSHOT_STATE), str(partial / SNAPSHOT_MEMORY))
                    await disks.clone(record.disk_path, partial / DISK_NAME)
                finally:
                    await asyncio.shield(vm.resume_vcpus())
                snap = SnapshotRecord(
                    id=snapshot_id, source_vm=vm_id, vcpu_count=record.vcpu_count, mem_size_mib=record.mem_size_mib,
                    disk_bytes=record.disk_bytes, guest_cid=record.guest_cid, created_at=_now(),
                    size_bytes=_allocated(*(partial / n for n in (SNAPSHOT_STATE, SNAPSHOT_MEMORY, DISK_NAME))),
                )  # fmt: skip
                (partial / SNAPSHOT_META).write_text(json.dumps(snap.to_json(), indent=2, sort_keys=True) + "\n")
                os.replace(partial, target)
            except BaseException as exc:
                shutil.rmtree(partial, ignore_errors=True)
                if not isinstance(exc, CorralError):
                    self._error(f"snapshot {snapshot_id} of {vm_id} failed: {exc!r}")
                raise
        return snap

    def get_snapshot(self, snapshot_id: str) -> SnapshotRecord:
        """The snapshot's record.

        Raises:
            SnapshotNotFoundError: no such snapshot (or an unreadable one).
        """
        meta = self.snapshot_dir(snapshot_id) / SNAPSHOT_META
        try:
            return SnapshotRecord.from_json(json.loads(meta.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise SnapshotNotFoundError(
                f"snapshot {snapshot_id} does not exist", details={"snapshot_id": snapshot_id}
            ) from exc

    def list_snapshots(self) -> builtins.list[SnapshotRecord]:
        """Every snapshot on this host, sorted by id."""
        found: builtins.list[SnapshotRecord] = []
        for meta in sorted(self.snapshots_dir.glob(f"*/{SNAPSHOT_META}")):
            with contextlib.suppress(CorralError):
                found.append(self.get_snapshot(meta.parent.name))
        return found

    def delete_snapshot(self, snapshot_id: str) -> bool:
        """Remove a snapshot's files; False when there was none. VMs restored from it keep running (their disks
        are copies, and the memory file they map stays readable until they end)."""
        target = self.snapshot_dir(snapshot_id)
        if not target.exists():
            return False
        shutil.rmtree(target, ignore_errors=True)
        return True

    async def destroy(self, vm_id: str) -> str | None:
        """Shut down if running, then remove disk file, network configuration and metadata. Idempotent.

        Returns how a running VM ended (``"clean"`` after Ctrl-Alt-Del, ``"killed"`` past the grace period,
        ``"gone"`` when its process had already exited), ``"stopped"`` for a stopped or paused VM, None for an
        unknown id.
        """
        await self.start()
        record = self.vms.get(vm_id)
        if record is None:
            return None
        async with self._lock(vm_id):
            outcome = "stopped"
            vm = self._procs.pop(vm_id, None)
            if vm is not None:
                outcome = await vm.shutdown(self.config.shutdown_grace_s)
            await self._discard(vm_id, record.network)
            self.vms.pop(vm_id, None)
        self._locks.pop(vm_id, None)
        return outcome

    async def _abandon(self, vm_id: str, lease: Lease | None) -> None:
        """Undo a create that failed or was cancelled half-way: kill its process if it got one, then discard."""
        vm = self._procs.pop(vm_id, None)
        if vm is not None:
            await vm.kill()
        self.vms.pop(vm_id, None)
        await self._discard(vm_id, lease)

    async def _discard(self, vm_id: str, lease: Lease | None) -> None:
        """Remove every host object of a VM that is not running (disk, sockets, network, metadata)."""
        if lease is not None:
            try:
                await self.network.teardown(lease)
            except (NetworkError, OSError) as exc:
                self._error(f"VM {vm_id}: network teardown failed: {exc}")
        vm_dir = self.vm_dir(vm_id)
        if vm_dir.is_dir():
            shutil.rmtree(vm_dir, ignore_errors=True)
        with contextlib.suppress(ProviderUnavailableError):
            for path in self._socket_paths(vm_id):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def _save(self, record: VMRecord) -> None:
        path = self.vm_dir(record.id) / "vm.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record.to_json(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def _error(self, message: str) -> None:
        log.warning("firecracker manager: %s", message)
        self.errors.append(f"{_now()} {message}")

    # --- warm pool --------------------------------------------------------------------------------------------

    def _pool_key(self) -> str | None:
        base = self.config.readiness.rootfs_path
        if base is None:
            return None
        try:
            st = os.stat(base)
        except OSError:
            return None
        ident = f"{os.path.realpath(base)}|{st.st_size}|{st.st_mtime_ns}|{self.config.warm_disk_bytes}"
        return hashlib.sha256(ident.encode()).hexdigest()[:12]

    def _scan_pool(self) -> None:
        key = self._pool_key()
        self._pool = []
        if not self.pool_dir.is_dir():
            return
        for path in sorted(self.pool_dir.glob("*.ext4")):
            if key is not None and path.name.startswith(f"{key}-"):
                self._pool.append(path)
            else:
                disks.remove(path)  # made from another base image or for another size

    async def _take_pool_disk(self, target: Path, disk_bytes: int) -> bool:
        if self.config.warm_pool_size <= 0 or disk_bytes != self.config.warm_disk_bytes:
            return False
        while self._pool:
            candidate = self._pool.pop(0)
            try:
                os.replace(candidate, target)
            except FileNotFoundError:
                continue
            self.pool_hits += 1
            return True
        self.pool_misses += 1
        return False

    def _schedule_pool_refill(self) -> None:
        if self.config.warm_pool_size <= 0 or (self._pool_task is not None and not self._pool_task.done()):
            return
        self._pool_task = asyncio.create_task(self.fill_pool(), name="firecracker-warm-pool")

    async def fill_pool(self) -> int:
        """Clone disks until the pool holds ``warm_pool_size``; return how many are ready."""
        base, key = self.config.readiness.rootfs_path, self._pool_key()
        if base is None or key is None or self.config.warm_pool_size <= 0:
            return len(self._pool)
        self.pool_dir.mkdir(parents=True, exist_ok=True)
        if not self._pool:
            self._scan_pool()
        while len(self._pool) < self.config.warm_pool_size:
            path = self.pool_dir / f"{key}-{uuid.uuid4().hex[:8]}.ext4"
            try:
                await disks.clone(base, path, self.config.warm_disk_bytes)
            except (disks.DiskError, ResourceLimitError, OSError) as exc:
                self._error(f"warm pool refill failed: {exc}")
                break
            self._pool.append(path)
        return len(self._pool)

    async def clone_method(self) -> str:
        """``"reflink"`` when clones share blocks with the base (copy-on-write), else ``"sparse-copy"``."""
        if self._clone_method is None:
            try:
                ok = await disks.reflink_supported(self.config.state_dir)
            except OSError:
                ok = False
            self._clone_method = "reflink" if ok else "sparse-copy"
        return self._clone_method

    # --- health -----------------------------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """KVM availability and why, VMs, warm pool, host resources and recent errors (no side effects)."""
        readiness = await self.readiness()
        await self.start()
        for record in self.vms.values():
            self._refresh(record)
        running = [r for r in self.vms.values() if r.state == "running"]
        mem = _meminfo()
        resources: dict[str, Any] = {
            "cpu_count": os.cpu_count(),
            "memory_total_bytes": mem.get("MemTotal"),
            "memory_available_bytes": mem.get("MemAvailable"),
            "allocated_vcpus": sum(r.vcpu_count for r in running),
            "allocated_memory_bytes": sum(r.mem_size_mib for r in running) * MIB,
        }
        existing = next((p for p in (self.config.state_dir, *self.config.state_dir.parents) if p.exists()), None)
        if existing is not None:
            with contextlib.suppress(OSError):
                resources["disk_free_bytes"] = shutil.disk_usage(existing).free
        network: dict[str, Any] = {
            "subnet": str(self.network.allocator.network),
            "capacity": self.network.allocator.capacity,
            "leases": self.network.allocator.in_use,
        }
        if readiness.usable:  # only a host that can run VMs is asked about forwarding and routes
            network = await self.network.status()
        return {
            "status": "healthy" if readiness.usable else "unhealthy",
            "kvm": {
                "available": readiness.usable,
                "reason": readiness.reason,
                "checks": [
                    {"name": c.name, "ok": c.ok, "detail": c.detail, "skipped": c.skipped} for c in readiness.checks
                ],
            },
            "active_vms": len(running),
            "stopped_vms": sum(1 for r in self.vms.values() if r.state == "stopped"),
            "paused_vms": sum(1 for r in self.vms.values() if r.state == "paused"),
            "snapshots": len(self.list_snapshots()),
            "max_vms": self.config.max_vms,
            "warm_pool": {
                "target": self.config.warm_pool_size,
                "ready": len(self._pool),
                "disk_bytes": self.config.warm_disk_bytes,
                "hits": self.pool_hits,
                "misses": self.pool_misses,
            },
            "resources": resources,
            "network": network,
            "state_dir": str(self.config.state_dir),
            "errors": list(self.errors),
        }

    async def aclose(self) -> None:
        """Stop background work. VMs keep running; a later manager re-adopts them from their metadata."""
        if self._pool_task is not None:
            self._pool_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pool_task

    async def destroy_all(self) -> None:
        """Destroy every VM (tests and operators draining a host)."""
        for vm_id in list(self.vms):
            await self.destroy(vm_id)

    def with_config(self, **changes: Any) -> FirecrackerManager:
        """A new manager over the same state with some settings changed (used to simulate restarts)."""
        return FirecrackerManager(replace(self.config, **changes), probe=self._probe, clock=self._clock)


def readiness_config_from_settings(settings: Settings) -> ReadinessConfig:
    """``CORRAL_FIRECRACKER_BIN``, ``_KERNEL`` and ``_ROOTFS`` as a readiness config (defaults when unset)."""
    kernel = getattr(settings, "firecracker_kernel", None)
    rootfs = getattr(settings, "firecracker_rootfs", None)
    return ReadinessConfig(
        firecracker_bin=getattr(settings, "firecracker_bin", "firecracker"),
        kernel_path=str(kernel) if kernel is not None else None,
        rootfs_path=str(rootfs) if rootfs is not None else None,
    )


def config_from_settings(settings: Settings) -> ManagerConfig:
    """The manager's configuration from Corral's settings; fields not (yet) in Settings take their defaults.

    Reads ``firecracker_state_dir`` (default ``<data_dir>/firecracker``), ``firecracker_subnet``,
    ``firecracker_egress_interface``, ``firecracker_dns`` (comma-separated), ``firecracker_netns``,
    ``firecracker_max_vms``, ``firecracker_warm_pool_size`` and ``default_disk`` (the warm disks' size).
    """
    state_dir = getattr(settings, "firecracker_state_dir", None)
    if state_dir is None:
        state_dir = Path(getattr(settings, "data_dir", Path("./data"))) / "firecracker"
    dns = getattr(settings, "firecracker_dns", "") or ""
    return ManagerConfig(
        state_dir=Path(state_dir).resolve(),
        readiness=readiness_config_from_settings(settings),
        network=NetworkConfig(
            subnet=getattr(settings, "firecracker_subnet", None) or DEFAULT_SUBNET,
            egress_interface=getattr(settings, "firecracker_egress_interface", None),
            netns=getattr(settings, "firecracker_netns", None),
            dns=tuple(d.strip() for d in dns.split(",") if d.strip()),
        ),
        max_vms=int(getattr(settings, "firecracker_max_vms", 32)),
        warm_pool_size=int(getattr(settings, "firecracker_warm_pool_size", 0)),
        warm_disk_bytes=parse_size(getattr(settings, "default_disk", "10G"), field_name="default_disk"),
    )
