"""Firecracker's API state machine: paths and methods, pre-boot and post-boot rules, TAP attachment, the boot of the
guest at ``InstanceStart``, pause and resume, snapshot create and load, with Firecracker's own fault messages.

Snapshots: ``PUT /snapshot/create`` (post-boot, only while ``Paused``) writes the two files it is given, a JSON
microVM state file (:data:`STATE_FORMAT`; the devices as configured, paths as given) and a memory file of the guest's
size (sparse: the double has no guest memory to write). ``PUT /snapshot/load`` is accepted only by a fresh process
before any boot-specific configuration (logger and metrics are allowed); it reopens every device the state file
names, as Firecracker does (backing files relative to the process's working directory, the TAP devices, with
``network_overrides`` applied, and the vsock socket, which must be free), and boots the guest again when it resumes.
A load that fails after its body was accepted ends the process (:attr:`ApiDouble.fatal`), as in Firecracker.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.testing.firecracker.guest import Guest, NoGuest
from corral.testing.firecracker.schema import (
    BOOT_SOURCE,
    CREATE_SNAPSHOT,
    DESERIALIZE,
    DRIVE,
    INTERNAL,
    LOAD_SNAPSHOT,
    LOGGER,
    MACHINE,
    METRICS,
    NETWORK,
    START,
    VSOCK,
    ApiFault,
    validate,
    variant,
)
from corral.testing.firecracker.schema import VMM_VERSION as API_VERSION
from corral.testing.firecracker.vsock import VsockRelay

__all__ = [
    "LOAD_MISSING_MEMORY",
    "LOAD_NOT_ALLOWED",
    "LOAD_TOO_MANY_MEMORY",
    "POST_BOOT_ONLY",
    "PRE_BOOT_ONLY",
    "STATE_FORMAT",
    "VMM_VERSION",
    "ApiDouble",
    "attach_tap",
]

VMM_VERSION = f"{API_VERSION}-corral-double"
"""What ``GET /version`` and ``GET /`` report: the API version enforced, marked as the double."""
PRE_BOOT_ONLY = "The requested operation is not supported after starting the microVM."
POST_BOOT_ONLY = "The requested operation is not supported before starting the microVM."
LOAD_NOT_ALLOWED = f"{LOAD_SNAPSHOT}Loading a microVM snapshot not allowed after configuring boot-specific resources."
LOAD_MISSING_MEMORY = "missing field: either `mem_backend` or `mem_file_path` is required"
LOAD_TOO_MANY_MEMORY = "too many fields: either `mem_backend` or `mem_file_path` exclusively is required"
STATE_FORMAT = "corral-firecracker-double-state/1"
"""Marks a state file the double wrote (Firecracker's own format is binary and versioned; this one is JSON)."""
RUNNING_ONLY_SNAPSHOT = (
    f"{CREATE_SNAPSHOT}Cannot save the microVM state: Operation not allowed: save/restore unavailable while running"
)
MIB = 1024 * 1024

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_OS_ERROR_PREFIX = {
    "machine-config": MACHINE,
    "boot-source": BOOT_SOURCE,
    "drives": DRIVE,
    "network-interfaces": NETWORK,
    "vsock": VSOCK,
    "actions": START,
    "logger": LOGGER,
    "metrics": METRICS,
}


def _id_mismatch(path_id: str, body_id: str) -> ApiFault:
    return ApiFault(f"The id from the path [{path_id}] does not match the id from the body [{body_id}]!")


def _os(exc: OSError) -> str:
    """Rust's rendering of an io::Error: ``No such file or directory (os error 2)``."""
    return f"{os.strerror(exc.errno)} (os error {exc.errno})" if exc.errno else str(exc)


def attach_tap(name: str) -> int:
    """Open the existing TAP device ``name`` like Firecracker does; return the queue's file descriptor."""
    try:
        socket.if_nametoindex(name)
    except OSError as exc:
        raise ApiFault(
            f"{NETWORK}Could not create the network device: Open tap device failed: Error while creating ifreq "
            f"structure: No such device (os error 19). Invalid TUN/TAP Backend provided by {name}. Check our "
            "documentation on setting up the network devices."
        ) from exc
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    ifreq = struct.pack("16sH22x", name.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
    try:
        fcntl.ioctl(fd, TUNSETIFF, ifreq)
    except OSError as exc:
        os.close(fd)
        raise ApiFault(
            f"{NETWORK}Could not create the network device: Open tap device failed: Error while creating ifreq "
            f"structure: {_os(exc)}. Invalid TUN/TAP Backend provided by {name}."
        ) from exc
    return fd


@dataclass
class ApiDouble:
    """Firecracker's API state machine. ``handle`` takes one request and returns (status, JSON body or None)."""

    instance_id: str = "anonymous-instance"
    guest: Guest = field(default_factory=NoGuest)
    tap_opener: Callable[[str], int] = attach_tap
    run_on_main: Callable[[Callable[[], None]], None] = lambda fn: fn()
    """Runs the guest's start; ``serve`` routes it to the main thread, so the guest dies with the process."""

    started: bool = False
    """Past ``InstanceStart`` or a successful snapshot load: the post-boot API applies."""
    paused: bool = False
    restored: bool = False
    boot_path: bool = False
    """A boot-specific resource was configured, so a snapshot can no longer be loaded."""
    guest_booted: bool = False
    fatal: bool = False
    """A snapshot load failed half-way: Firecracker ends the process after answering."""
    machine: dict[str, Any] = field(default_factory=lambda: {"vcpu_count": 1, "mem_size_mib": 128, "smt": False})
    boot_source: dict[str, Any] | None = None
    boot_args: str = ""
    drives: dict[str, dict[str, Any]] = field(default_factory=dict)
    interfaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    vsock: dict[str, Any] | None = None
    relay: VsockRelay | None = None
    metrics: dict[str, Any] | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)
    tap_fds: dict[str, int] = field(default_factory=dict)
    pending_keys: int = 0
    """Ctrl-Alt-Del presses made while paused: the i8042 buffer holds them until the guest runs."""
    lost_keys: int = 0
    """Ctrl-Alt-Del presses the guest never saw (its keyboard driver was not up)."""

    def handle(self, method: str, path: str, raw: bytes) -> tuple[int, dict[str, Any] | None]:
        """Serve one call; faults (and the double's own I/O errors) become ``400 {"fault_message": ...}``."""
        self.calls.append((method, path))
        try:
            body: object = None
            if method in ("PUT", "PATCH"):
                try:
                    body = json.loads(raw or b"null")
                except ValueError as exc:
                    raise ApiFault(f"{DESERIALIZE}{exc}") from exc
            return self._route(method, path, body)
        except ApiFault as fault:
            return fault.status, {"fault_message": fault.message}
        except OSError as exc:  # a file or device the request named; Firecracker answers these too
            first = path.strip("/").split("/")[0]
            prefix = _OS_ERROR_PREFIX.get(first, INTERNAL)
            return 400, {"fault_message": f"{prefix}{_os(exc)}"}

    def _route(self, method: str, path: str, body: object) -> tuple[int, dict[str, Any] | None]:
        parts = path.rstrip("/").split("/")[1:] if path != "/" else []
        key = (method, parts[0] if parts else "")
        if key == ("GET", "") and not parts:
            return 200, self.describe()
        if key == ("GET", "version") and len(parts) == 1:
            return 200, {"firecracker_version": VMM_VERSION}
        if key == ("GET", "machine-config") and len(parts) == 1:
            return 200, dict(self.machine)
        if key == ("GET", "vm") and parts == ["vm", "config"]:
            return 200, self.full_config()
        handlers: dict[tuple[str, str], Callable[[list[str], object], None]] = {
            ("PUT", "machine-config"): self.put_machine_config,
            ("PATCH", "machine-config"): self.patch_machine_config,
            ("PUT", "boot-source"): self.put_boot_source,
            ("PUT", "drives"): self.put_drive,
            ("PATCH", "drives"): self.patch_drive,
            ("PUT", "network-interfaces"): self.put_interface,
            ("PATCH", "network-interfaces"): self.patch_interface,
            ("PUT", "vsock"): self.put_vsock,
            ("PUT", "actions"): self.put_action,
            ("PATCH", "vm"): self.patch_vm,
            ("PUT", "logger"): self.put_logger,
            ("PUT", "metrics"): self.put_metrics,
            ("PUT", "snapshot"): self.put_snapshot,
        }
        handler = handlers.get(key)
        with_id = {"drives", "network-interfaces", "snapshot"}
        if (
            handler is None
            or (key[1] in with_id) != (len(parts) == 2)
            or len(parts) > 2
            or (key[1] == "snapshot" and parts[1] not in ("create", "load"))
        ):
            raise ApiFault(f"Invalid request method and/or path: {method} {path}.")
        handler(parts, body)
        return 204, None

    # -- views --
    def describe(self) -> dict[str, Any]:
        """``InstanceInfo``."""
        state = "Not started" if not self.started else ("Paused" if self.paused else "Running")
        return {"id": self.instance_id, "state": state, "vmm_version": VMM_VERSION, "app_name": "Firecracker"}

    def full_config(self) -> dict[str, Any]:
        """``FullVmConfiguration`` (the parts this double supports); a restored VM has no boot source."""
        return {
            "machine-config": dict(self.machine),
            "boot-source": {} if self.restored else (self.boot_source or {}),
            "drives": list(self.drives.values()),
            "network-interfaces": list(self.interfaces.values()),
            "vsock": self.vsock,
        }

    def guest_running(self) -> bool:
        """Guest code runs: booted (or restored and resumed) and not paused."""
        return self.started and self.guest_booted and not self.paused

    # -- guards --
    def _pre_boot(self) -> None:
        if self.started:
            raise ApiFault(PRE_BOOT_ONLY)

    def _post_boot(self) -> None:
        if not self.started:
            raise ApiFault(POST_BOOT_ONLY)

    def _configure(self) -> None:
        """A pre-boot call that configures a boot-specific resource: no snapshot load after it."""
        self._pre_boot()
        self.boot_path = True

    # -- handlers --
    def put_machine_config(self, parts: list[str], body: object) -> None:
        """Pre-boot: vCPUs in 1..32 (1 or even with SMT), memory above zero."""
        del parts
        self._configure()
        config = validate("MachineConfiguration", body)
        self._check_machine(config)
        self.machine = {"smt": False, **config}

    def patch_machine_config(self, parts: list[str], body: object) -> None:
        """Pre-boot partial update."""
        del parts
        self._configure()
        if not isinstance(body, dict):
            validate("MachineConfiguration", body)
        assert isinstance(body, dict)
        merged = {**self.machine, **body}
        validate("MachineConfiguration", merged)
        self._check_machine(merged)
        self.machine = merged

    @staticmethod
    def _check_machine(config: dict[str, Any]) -> None:
        vcpus, smt = config["vcpu_count"], config.get("smt", False)
        huge = variant(config.get("huge_pages", "None"), ("None", "2M"))
        if not 1 <= vcpus <= 32 or (smt and vcpus > 1 and vcpus % 2):
            raise ApiFault(
                f"{MACHINE}The number of vCPUs must be greater than 0, less than 32 and must be 1 or an even "
                "number if SMT is enabled."
            )
        if config["mem_size_mib"] == 0 or (huge == "2M" and config["mem_size_mib"] % 2):
            raise ApiFault(
                f"{MACHINE}The memory size (MiB) is either 0, or not a multiple of the configured page size."
            )

    def put_boot_source(self, parts: list[str], body: object) -> None:
        """Pre-boot: the kernel image must be openable."""
        del parts
        self._configure()
        config = validate("BootSource", body)
        if not os.path.isfile(config["kernel_image_path"]):
            raise ApiFault(f"{BOOT_SOURCE}The kernel file cannot be opened: No such file or directory (os error 2)")
        self.boot_source = config
        self.boot_args = config.get("boot_args", "")

    def put_drive(self, parts: list[str], body: object) -> None:
        """Pre-boot: ids agree, a virtio-block drive has ``path_on_host`` and ``is_read_only``, one root device.

        ``path_on_host`` may be relative: it is opened from the process's working directory, like every path.
        """
        self._configure()
        drive = validate("Drive", body)
        if drive["drive_id"] != parts[1]:
            raise _id_mismatch(parts[1], drive["drive_id"])
        for required in ("path_on_host", "is_read_only"):
            if required not in drive and "socket" not in drive:
                raise ApiFault(f"{DESERIALIZE}missing field `{required}`")
        if drive["is_root_device"] and any(
            d["is_root_device"] for i, d in self.drives.items() if i != drive["drive_id"]
        ):
            raise ApiFault(f"{DRIVE}A root block device already exists!")
        path = drive.get("path_on_host")
        if path is not None and not os.path.isfile(path):
            raise ApiFault(
                f"{DRIVE}Unable to create the virtio block device: VirtioBlock: Error manipulating the backing "
                f"file: No such file or directory (os error 2) {path}"
            )
        self.drives[drive["drive_id"]] = drive

    def patch_drive(self, parts: list[str], body: object) -> None:
        """Post-boot: point an existing drive at another file."""
        self._post_boot()
        update = validate("PartialDrive", body)
        if update["drive_id"] != parts[1]:
            raise _id_mismatch(parts[1], update["drive_id"])
        if parts[1] not in self.drives:
            raise ApiFault(
                f"{DRIVE}Unable to patch the block device: Device manager error: no block device with id "
                f"{parts[1]} Please verify the request arguments."
            )
        path = update.get("path_on_host")
        if path is not None and not os.path.isfile(path):
            raise ApiFault(
                f"{DRIVE}Unable to patch the block device: VirtioBlock: Error manipulating the backing file: "
                f"No such file or directory (os error 2) {path} Please verify the request arguments."
            )
        self.drives[parts[1]].update(update)

    def put_interface(self, parts: list[str], body: object) -> None:
        """Pre-boot: ids agree, a valid MAC, a TAP device not used by another interface, attached now."""
        self._configure()
        iface = validate("NetworkInterface", body)
        if iface["iface_id"] != parts[1]:
            raise _id_mismatch(parts[1], iface["iface_id"])
        mac = iface.get("guest_mac")
        if mac is not None and not _MAC_RE.match(mac):
            raise ApiFault(f"{DESERIALIZE}invalid MAC address {mac}")
        for other_id, other in self.interfaces.items():
            if other_id != iface["iface_id"] and other["host_dev_name"] == iface["host_dev_name"]:
                raise ApiFault(
                    f"{NETWORK}Could not create the network device: The host device name "
                    f"{iface['host_dev_name']} is already in use."
                )
        old = self.tap_fds.pop(iface["iface_id"], None)
        if old is not None:
            with contextlib.suppress(OSError):
                os.close(old)
        self.tap_fds[iface["iface_id"]] = self.tap_opener(iface["host_dev_name"])
        self.interfaces[iface["iface_id"]] = iface

    def patch_interface(self, parts: list[str], body: object) -> None:
        """Post-boot: rate limiters only."""
        self._post_boot()
        update = validate("PartialNetworkInterface", body)
        if parts[1] not in self.interfaces:
            raise ApiFault(f"{NETWORK}Invalid interface ID - not found: {parts[1]}")
        self.interfaces[parts[1]].update(update)

    def put_vsock(self, parts: list[str], body: object) -> None:
        """Pre-boot: ``guest_cid >= 3``; the host-side socket is bound now and must not exist."""
        del parts
        self._configure()
        config = validate("Vsock", body)
        if config["guest_cid"] < 3:
            raise ApiFault(f"{VSOCK}Cannot create backend for vsock device: invalid guest CID {config['guest_cid']}")
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        self.relay = VsockRelay(config["uds_path"], self.guest, self.guest_running)
        self.vsock = config

    def _root_drive(self) -> str | None:
        return next((d.get("path_on_host") for d in self.drives.values() if d["is_root_device"]), None)

    def _run_guest(self) -> None:
        """Let guest code run: boot it the first time (at InstanceStart, or at the first resume after a load),
        else continue its stopped processes; then deliver keystrokes that waited in the i8042 buffer."""
        if not self.guest_booted:
            failure: list[BaseException] = []
            root, boot_args = self._root_drive(), self.boot_args

            def boot() -> None:
                try:
                    self.guest.start(root, boot_args)
                except BaseException as exc:
                    failure.append(exc)

            self.run_on_main(boot)
            if failure:
                raise failure[0]
            self.guest_booted = True
        else:
            self.guest.resume()
        self.paused = False
        while self.pending_keys:
            self.pending_keys -= 1
            self._press_ctrl_alt_del()

    def _press_ctrl_alt_del(self) -> None:
        """Key codes into the i8042 device: seen by a guest whose keyboard driver is up, else lost."""
        if self.guest.keyboard_ready():
            self.guest.ctrl_alt_del()
        else:
            self.lost_keys += 1
            sys.stderr.write("fake-firecracker: Ctrl-Alt-Del lost: the guest's keyboard driver is not up\n")

    def put_action(self, parts: list[str], body: object) -> None:
        """``InstanceStart`` (pre-boot, needs a kernel), ``SendCtrlAltDel`` (post-boot), ``FlushMetrics``."""
        del parts
        action = validate("InstanceActionInfo", body)["action_type"]
        if action == "InstanceStart":
            self._pre_boot()
            if self.boot_source is None:
                raise ApiFault(f"{START}Cannot start microvm without kernel configuration.")
            self._run_guest()
            self.started = True
        elif action == "SendCtrlAltDel":
            # Accepted whatever the guest does with it: Firecracker only injects the key codes.
            self._post_boot()
            if self.paused:
                self.pending_keys += 1
            else:
                self._press_ctrl_alt_del()
        elif action == "FlushMetrics":
            if self.metrics is None:
                raise ApiFault(f"{INTERNAL}Metrics error: the metrics system is not initialized.")
        else:
            variant(action, ("FlushMetrics", "InstanceStart", "SendCtrlAltDel"))

    def patch_vm(self, parts: list[str], body: object) -> None:
        """Post-boot: ``Paused`` stops guest code, ``Resumed`` runs it (boots a loaded snapshot's guest). Both are
        idempotent, as in Firecracker."""
        del parts
        self._post_boot()
        state = variant(validate("Vm", body)["state"], ("Paused", "Resumed"))
        if state == "Paused" and not self.paused:
            self.guest.pause()
            self.paused = True
        elif state == "Resumed" and self.paused:
            self._run_guest()

    def put_logger(self, parts: list[str], body: object) -> None:
        """Accepted and ignored (the double logs to stderr); allowed before a snapshot load."""
        del parts
        validate("Logger", body)

    def put_metrics(self, parts: list[str], body: object) -> None:
        """Accepted once; allowed before a snapshot load."""
        del parts
        if self.metrics is not None:
            raise ApiFault(f"{METRICS}Reinitialization of metrics not allowed.")
        self.metrics = validate("Metrics", body)

    def put_snapshot(self, parts: list[str], body: object) -> None:
        """``PUT /snapshot/create`` and ``PUT /snapshot/load``."""
        if parts[1] == "create":
            self.create_snapshot(body)
        else:
            self.load_snapshot(body)

    # -- snapshots --
    def create_snapshot(self, body: object) -> None:
        """Post-boot, paused only: the guest's writes reach its disk, vsock connections are reset, and the state
        and memory files are written (created, or truncated)."""
        self._post_boot()
        params = validate("SnapshotCreateParams", body)
        kind = variant(params.get("snapshot_type", "Full"), ("Full", "Diff"))
        if not self.paused:
            raise ApiFault(RUNNING_ONLY_SNAPSHOT)
        if kind == "Diff" and not self.machine.get("track_dirty_pages"):
            raise ApiFault(
                "The requested operation is not supported: Diff snapshots are not allowed on uVMs with dirty page "
                "tracking disabled."
            )
        if self.relay is not None:
            self.relay.reset()
        self.guest.flush()
        state = {
            "format": STATE_FORMAT,
            "vmm_version": VMM_VERSION,
            "machine-config": self.machine,
            "boot_args": self.boot_args,
            "drives": list(self.drives.values()),
            "network-interfaces": list(self.interfaces.values()),
            "vsock": self.vsock,
        }
        try:
            with open(params["snapshot_path"], "w", encoding="utf-8") as fh:
                json.dump(state, fh)
        except OSError as exc:
            raise ApiFault(f"{CREATE_SNAPSHOT}Cannot perform open on the snapshot backing file: {_os(exc)}") from exc
        try:
            fd = os.open(params["mem_file_path"], os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise ApiFault(f"{CREATE_SNAPSHOT}Cannot perform open on the memory backing file: {_os(exc)}") from exc
        try:  # the guest's memory, full size; no page is written (the double has none), so it stays sparse
            os.ftruncate(fd, 0)
            os.ftruncate(fd, int(self.machine["mem_size_mib"]) * MIB)
        finally:
            os.close(fd)

    def load_snapshot(self, body: object) -> None:
        """A fresh process only (logger and metrics may be configured first). Failures past the body checks end
        the process, as Firecracker's do."""
        self._pre_boot()
        params = validate("SnapshotLoadParams", body)
        if ("mem_file_path" in params) == ("mem_backend" in params):
            raise ApiFault(LOAD_TOO_MANY_MEMORY if "mem_file_path" in params else LOAD_MISSING_MEMORY)
        if "mem_backend" in params:
            backend = validate("MemoryBackend", params["mem_backend"])
            variant(backend["backend_type"], ("File", "Uffd"))
        else:
            backend = {"backend_type": "File", "backend_path": params["mem_file_path"]}
        overrides = {}
        for raw in params.get("network_overrides", []):
            override = validate("NetworkOverride", raw)
            overrides[override["iface_id"]] = override["host_dev_name"]
        if self.boot_path:
            raise ApiFault(LOAD_NOT_ALLOWED)
        try:
            self._restore(params["snapshot_path"], backend, overrides)
            if params.get("resume_vm", False):
                self._run_guest()
        except BaseException:
            self.fatal = True
            raise

    def _restore(self, snapshot_path: str, backend: dict[str, str], overrides: dict[str, str]) -> None:
        failed = f"{LOAD_SNAPSHOT}Failed to restore from snapshot: "
        try:
            with open(snapshot_path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise ApiFault(
                f"{failed}Failed to get snapshot state from file: Failed to open snapshot file: {_os(exc)}"
            ) from exc
        try:
            state = json.loads(text)
        except ValueError:
            state = None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ApiFault(
                f"{failed}Failed to get snapshot state from file: Failed to load snapshot state from file: "
                f"{snapshot_path} is not a microVM state file"
            )
        if backend["backend_type"] == "Uffd":
            raise ApiFault(
                f"{failed}Failed to load guest memory: Error creating guest memory from uffd: the test double "
                "loads guest memory only from a file"
            )
        try:
            with open(backend["backend_path"], "rb"):
                pass
        except OSError as exc:
            raise ApiFault(
                f"{failed}Failed to load guest memory: Error creating guest memory from file: Failed to load guest "
                f"memory: {_os(exc)}"
            ) from exc
        build = f"{failed}Failed to build microVM from snapshot: "
        drives = {d["drive_id"]: d for d in state["drives"]}
        for drive in drives.values():
            path = drive.get("path_on_host")
            if path is not None and not os.path.isfile(path):
                raise ApiFault(
                    f"{build}Cannot restore devices: VirtioBlock: Error manipulating the backing file: "
                    f"No such file or directory (os error 2) {path}"
                )
        interfaces = {i["iface_id"]: dict(i) for i in state["network-interfaces"]}
        unknown = set(overrides) - set(interfaces)
        if unknown:
            raise ApiFault(f"{build}Invalid network override: no network interface {sorted(unknown)[0]} to override")
        for iface_id, iface in interfaces.items():
            iface["host_dev_name"] = overrides.get(iface_id, iface["host_dev_name"])
            try:
                self.tap_fds[iface_id] = self.tap_opener(iface["host_dev_name"])
            except ApiFault as fault:
                raise ApiFault(f"{build}Cannot restore devices: {fault.message.removeprefix(NETWORK)}") from fault
        vsock = state["vsock"]
        if vsock is not None:
            # Bound again at the path the snapshot names (relative to the working directory): it must be free.
            try:
                self.relay = VsockRelay(vsock["uds_path"], self.guest, self.guest_running)
            except ApiFault as fault:
                raise ApiFault(f"{build}Cannot restore devices: {fault.message.removeprefix(VSOCK)}") from fault
        self.machine, self.boot_args, self.vsock = dict(state["machine-config"]), state["boot_args"], vsock
        self.drives, self.interfaces = drives, interfaces
        self.started = self.restored = self.paused = True

    def close(self) -> None:
        """Stop the vsock relay and release the TAP queues."""
        if self.relay is not None:
            self.relay.close()
        for fd in self.tap_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.tap_fds.clear()
