"""Firecracker's API state machine: paths and methods, pre-boot and post-boot rules, TAP attachment, and the boot of
the guest at ``InstanceStart``, with Firecracker's own fault messages.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.testing.firecracker.guest import Guest, NoGuest
from corral.testing.firecracker.schema import DESERIALIZE, ApiFault, validate
from corral.testing.firecracker.vsock import VsockRelay

__all__ = ["POST_BOOT_ONLY", "PRE_BOOT_ONLY", "VMM_VERSION", "ApiDouble", "attach_tap"]

VMM_VERSION = "1.7.0-corral-double"
PRE_BOOT_ONLY = "The requested operation is not supported after starting the microVM."
POST_BOOT_ONLY = "The requested operation is not supported before starting the microVM."

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


def _id_mismatch(path_id: str, body_id: str) -> ApiFault:
    return ApiFault(f"The id from the path [{path_id}] does not match the id from the body [{body_id}]!")


def attach_tap(name: str) -> int:
    """Open the existing TAP device ``name`` like Firecracker does; return the queue's file descriptor."""
    try:
        socket.if_nametoindex(name)
    except OSError as exc:
        raise ApiFault(
            f"Could not create the network device: Open tap device failed: Error while creating ifreq "
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
            f"Could not create the network device: Open tap device failed: Error while creating ifreq structure: "
            f"{os.strerror(exc.errno or 0)} (os error {exc.errno}). Invalid TUN/TAP Backend provided by {name}."
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
    paused: bool = False
    machine: dict[str, Any] = field(default_factory=lambda: {"vcpu_count": 1, "mem_size_mib": 128, "smt": False})
    boot_source: dict[str, Any] | None = None
    drives: dict[str, dict[str, Any]] = field(default_factory=dict)
    interfaces: dict[str, dict[str, Any]] = field(default_factory=dict)
    vsock: dict[str, Any] | None = None
    relay: VsockRelay | None = None
    metrics: dict[str, Any] | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)
    tap_fds: dict[str, int] = field(default_factory=dict)

    def handle(self, method: str, path: str, raw: bytes) -> tuple[int, dict[str, Any] | None]:
        """Serve one call; faults become ``400 {"fault_message": ...}`` like Firecracker's."""
        self.calls.append((method, path))
        try:
            body: object = None
            if method in ("PUT", "PATCH"):
                try:
                    body = json.loads(raw or b"null")
                except ValueError as exc:
                    raise ApiFault(f"An error occurred when deserializing the json body of a request: {exc}") from exc
            return self._route(method, path, body)
        except ApiFault as fault:
            return fault.status, {"fault_message": fault.message}

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
        }
        handler = handlers.get(key)
        with_id = {"drives", "network-interfaces"}
        if handler is None or (key[1] in with_id) != (len(parts) == 2) or len(parts) > 2:
            raise ApiFault(f"Invalid request method and/or path: {method} {path}.")
        handler(parts, body)
        return 204, None

    # -- views --
    def describe(self) -> dict[str, Any]:
        """``InstanceInfo``."""
        state = "Not started" if not self.started else ("Paused" if self.paused else "Running")
        return {"id": self.instance_id, "state": state, "vmm_version": VMM_VERSION, "app_name": "Firecracker"}

    def full_config(self) -> dict[str, Any]:
        """``FullVmConfiguration`` (the parts this double supports)."""
        return {
            "machine-config": dict(self.machine),
            "boot-source": self.boot_source or {},
            "drives": list(self.drives.values()),
            "network-interfaces": list(self.interfaces.values()),
            "vsock": self.vsock,
        }

    # -- guards --
    def _pre_boot(self) -> None:
        if self.started:
            raise ApiFault(PRE_BOOT_ONLY)

    def _post_boot(self) -> None:
        if not self.started:
            raise ApiFault(POST_BOOT_ONLY)

    # -- handlers --
    def put_machine_config(self, parts: list[str], body: object) -> None:
        """Pre-boot: vCPUs in 1..32 (1 or even with SMT), memory above zero."""
        del parts
        self._pre_boot()
        config = validate("MachineConfiguration", body)
        self._check_machine(config)
        self.machine = {"smt": False, **config}

    def patch_machine_config(self, parts: list[str], body: object) -> None:
        """Pre-boot partial update."""
        del parts
        self._pre_boot()
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
        if not 1 <= vcpus <= 32 or (smt and vcpus > 1 and vcpus % 2):
            raise ApiFault(
                "The vCPU number is invalid! The vCPU number can only be 1 or an even number when SMT is enabled."
            )
        if config["mem_size_mib"] == 0:
            raise ApiFault("The memory size (MiB) is invalid.")
        if config.get("huge_pages") not in (None, "None", "Transparent", "2M"):
            raise ApiFault(f"Invalid huge pages configuration: {config['huge_pages']}")

    def put_boot_source(self, parts: list[str], body: object) -> None:
        """Pre-boot: the kernel image must be openable."""
        del parts
        self._pre_boot()
        config = validate("BootSource", body)
        if not os.path.isfile(config["kernel_image_path"]):
            raise ApiFault("The kernel file cannot be opened: No such file or directory (os error 2)")
        self.boot_source = config

    def put_drive(self, parts: list[str], body: object) -> None:
        """Pre-boot: ids agree, a virtio-block drive has ``path_on_host`` and ``is_read_only``, one root device."""
        self._pre_boot()
        drive = validate("Drive", body)
        if drive["drive_id"] != parts[1]:
            raise _id_mismatch(parts[1], drive["drive_id"])
        for required in ("path_on_host", "is_read_only"):
            if required not in drive and "socket" not in drive:
                raise ApiFault(
                    f"An error occurred when deserializing the json body of a request: missing field `{required}`"
                )
        if drive["is_root_device"] and any(
            d["is_root_device"] for i, d in self.drives.items() if i != drive["drive_id"]
        ):
            raise ApiFault("A root block device already exists!")
        path = drive.get("path_on_host")
        if path is not None and not os.path.isfile(path):
            raise ApiFault(
                "Unable to create the block device: BackingFile(Os { code: 2, kind: NotFound, message: "
                f'"No such file or directory" }}, "{path}")'
            )
        self.drives[drive["drive_id"]] = drive

    def patch_drive(self, parts: list[str], body: object) -> None:
        """Post-boot: point an existing drive at another file."""
        self._post_boot()
        update = validate("PartialDrive", body)
        if update["drive_id"] != parts[1]:
            raise _id_mismatch(parts[1], update["drive_id"])
        if parts[1] not in self.drives:
            raise ApiFault(f"Invalid block device ID: {parts[1]}")
        path = update.get("path_on_host")
        if path is not None and not os.path.isfile(path):
            raise ApiFault(f"Unable to patch the block device: No such file or directory (os error 2): {path}")
        self.drives[parts[1]].update(update)

    def put_interface(self, parts: list[str], body: object) -> None:
        """Pre-boot: ids agree, a valid MAC, a TAP device not used by another interface, attached now."""
        self._pre_boot()
        iface = validate("NetworkInterface", body)
        if iface["iface_id"] != parts[1]:
            raise _id_mismatch(parts[1], iface["iface_id"])
        mac = iface.get("guest_mac")
        if mac is not None and not _MAC_RE.match(mac):
            raise ApiFault(f"{DESERIALIZE}invalid MAC address {mac}")
        for other_id, other in self.interfaces.items():
            if other_id != iface["iface_id"] and other["host_dev_name"] == iface["host_dev_name"]:
                raise ApiFault(
                    f"Could not create the network device: The host device name {iface['host_dev_name']} is "
                    "already in use."
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
            raise ApiFault(f"Invalid interface ID - not found: {parts[1]}")
        self.interfaces[parts[1]].update(update)

    def put_vsock(self, parts: list[str], body: object) -> None:
        """Pre-boot: ``guest_cid >= 3``; the host-side socket is bound now and must not exist."""
        del parts
        self._pre_boot()
        config = validate("Vsock", body)
        if config["guest_cid"] < 3:
            raise ApiFault(f"Cannot create backend for vsock device: invalid guest CID {config['guest_cid']}")
        if self.relay is not None:
            self.relay.close()
            self.relay = None
        self.relay = VsockRelay(config["uds_path"], self.guest)
        self.vsock = config

    def put_action(self, parts: list[str], body: object) -> None:
        """``InstanceStart`` (pre-boot, needs a kernel), ``SendCtrlAltDel`` (post-boot), ``FlushMetrics``."""
        del parts
        action = validate("InstanceActionInfo", body)["action_type"]
        if action == "InstanceStart":
            self._pre_boot()
            if self.boot_source is None:
                raise ApiFault("Cannot start microvm without kernel configuration.")
            root = next((d.get("path_on_host") for d in self.drives.values() if d["is_root_device"]), None)
            boot_args = self.boot_source.get("boot_args", "")
            failure: list[BaseException] = []

            def boot() -> None:
                try:
                    self.guest.start(root, boot_args)
                except BaseException as exc:
                    failure.append(exc)

            self.run_on_main(boot)
            if failure:
                raise failure[0]
            self.started = True
        elif action == "SendCtrlAltDel":
            self._post_boot()
            self.guest.ctrl_alt_del()
        elif action == "FlushMetrics":
            if self.metrics is None:
                raise ApiFault("The metrics system is not initialized.")
        else:
            raise ApiFault(
                "An error occurred when deserializing the json body of a request: unknown variant "
                f"`{action}`, expected one of `FlushMetrics`, `InstanceStart`, `SendCtrlAltDel`"
            )

    def patch_vm(self, parts: list[str], body: object) -> None:
        """Post-boot: Paused or Resumed."""
        del parts
        self._post_boot()
        state = validate("Vm", body)["state"]
        if state not in ("Paused", "Resumed"):
            raise ApiFault(f"{DESERIALIZE}unknown variant `{state}`, expected `Paused` or `Resumed`")
        self.paused = state == "Paused"

    def put_logger(self, parts: list[str], body: object) -> None:
        """Accepted and ignored (the double logs to stderr)."""
        del parts
        validate("Logger", body)

    def put_metrics(self, parts: list[str], body: object) -> None:
        """Accepted once."""
        del parts
        if self.metrics is not None:
            raise ApiFault("Reinitialization of metrics not allowed.")
        self.metrics = validate("Metrics", body)

    def close(self) -> None:
        """Stop the vsock relay and release the TAP queues."""
        if self.relay is not None:
            self.relay.close()
        for fd in self.tap_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.tap_fds.clear()
