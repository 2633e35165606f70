"""A TEST DOUBLE of the ``firecracker`` binary: its published API, enforced, with a guest emulated without KVM.

Corral's machines cannot boot a microVM (PVM KVM, no firecracker binary; see the README), so the manager, the VM
driver and the provider are exercised against this stand-in. It is never selected by any production path: it runs
only where a test (or an operator experimenting) points the manager's ``firecracker_cmd`` at
``python -m corral.microvm.fake_firecracker``. It takes the same arguments as the real binary
(``--api-sock PATH --id ID``) and serves the same API on the Unix socket, checking what Firecracker checks:

* paths and methods of ``firecracker.yaml``; anything else is ``400 {"fault_message": "Invalid request method
  and/or path: ..."}``;
* bodies: JSON objects with the required fields, the right types and no unknown fields (Firecracker's structs
  deny unknown fields), ``vcpu_count`` in 1..32 (1 or even with SMT), ``guest_cid >= 3``, path ids equal to body
  ids, one root drive, backing files and the kernel that exist, a TAP device that exists and can be attached
  (``TUNSETIFF`` on ``/dev/net/tun``, as Firecracker does), a vsock ``uds_path`` that is free (bound at
  ``PUT /vsock``);
* the boot state machine: ``boot-source``, ``machine-config``, ``drives``, ``network-interfaces`` and ``vsock``
  are pre-boot only, ``PATCH`` of drives and network interfaces and ``SendCtrlAltDel`` are post-boot only,
  ``InstanceStart`` needs a kernel and happens once. Errors use Firecracker's own messages with status 400.

What the double cannot do is run a guest kernel. At ``InstanceStart`` it emulates the guest instead (the
:class:`ChrootGuest`): it loop-mounts the root drive read-write in a private mount namespace, starts the
rootfs's own ``/sbin/corral-init`` chrooted into it as PID 1 of a new PID namespace, and relays Firecracker's
hybrid vsock (``CONNECT <port>\\n`` -> ``OK <host_port>\\n``, then raw bytes) to the Unix sockets the emulated init
listens on. ``SendCtrlAltDel`` becomes SIGINT to that init (what a Linux guest's kernel does with Ctrl-Alt-Del once
init has disabled the immediate reboot); when the guest's init exits, the double exits, as Firecracker does when
its guest reboots. So the disk file, the init script, the agent and the vsock protocol are all the real ones; the
CPU virtualisation, the guest kernel and virtio are not.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import queue
import re
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

__all__ = [
    "ApiDouble",
    "ChrootGuest",
    "Guest",
    "NoGuest",
    "VsockRelay",
    "main",
    "serve",
]

VMM_VERSION = "1.7.0-corral-double"
DESERIALIZE = "An error occurred when deserializing the json body of a request: "
PRE_BOOT_ONLY = "The requested operation is not supported after starting the microVM."
POST_BOOT_ONLY = "The requested operation is not supported before starting the microVM."

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")

# name -> (python type, required)
Schema = dict[str, tuple[type, bool]]
SCHEMAS: dict[str, Schema] = {
    "MachineConfiguration": {
        "vcpu_count": (int, True),
        "mem_size_mib": (int, True),
        "smt": (bool, False),
        "track_dirty_pages": (bool, False),
        "cpu_template": (str, False),
        "huge_pages": (str, False),
    },
    "BootSource": {"kernel_image_path": (str, True), "boot_args": (str, False), "initrd_path": (str, False)},
    "Drive": {
        "drive_id": (str, True),
        "is_root_device": (bool, True),
        "path_on_host": (str, False),
        "is_read_only": (bool, False),
        "partuuid": (str, False),
        "cache_type": (str, False),
        "io_engine": (str, False),
        "rate_limiter": (dict, False),
        "socket": (str, False),
    },
    "PartialDrive": {"drive_id": (str, True), "path_on_host": (str, False), "rate_limiter": (dict, False)},
    "NetworkInterface": {
        "iface_id": (str, True),
        "host_dev_name": (str, True),
        "guest_mac": (str, False),
        "mtu": (int, False),
        "rx_rate_limiter": (dict, False),
        "tx_rate_limiter": (dict, False),
    },
    "PartialNetworkInterface": {
        "iface_id": (str, True),
        "rx_rate_limiter": (dict, False),
        "tx_rate_limiter": (dict, False),
    },
    "Vsock": {"guest_cid": (int, True), "uds_path": (str, True), "vsock_id": (str, False)},
    "InstanceActionInfo": {"action_type": (str, True)},
    "Vm": {"state": (str, True)},
    "Logger": {
        "level": (str, False),
        "log_path": (str, False),
        "show_level": (bool, False),
        "show_log_origin": (bool, False),
        "module": (str, False),
    },
    "Metrics": {"metrics_path": (str, True)},
}


class ApiFault(Exception):
    """A request Firecracker would refuse: status and ``fault_message``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _id_mismatch(path_id: str, body_id: str) -> ApiFault:
    return ApiFault(f"The id from the path [{path_id}] does not match the id from the body [{body_id}]!")


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if value is None:
        return "null"
    return "map" if isinstance(value, dict) else "sequence"


def validate(schema_name: str, body: object) -> dict[str, Any]:
    """Check a body against one of Firecracker's definitions, the way serde with ``deny_unknown_fields`` does."""
    prefix = DESERIALIZE
    if not isinstance(body, dict):
        raise ApiFault(f"{prefix}invalid type: {_type_name(body)}, expected struct {schema_name}")
    schema = SCHEMAS[schema_name]
    for key in body:
        if key not in schema:
            expected = ", ".join(f"`{k}`" for k in schema)
            raise ApiFault(f"{prefix}unknown field `{key}`, expected one of {expected}")
    for key, (kind, required) in schema.items():
        if key not in body:
            if required:
                raise ApiFault(f"{prefix}missing field `{key}`")
            continue
        value = body[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is int and ok and value < 0:
            ok = False
        if not ok:
            wanted = {int: "u64", bool: "a boolean", str: "a string", dict: "struct"}[kind]
            raise ApiFault(f"{prefix}invalid type: {_type_name(value)}, expected {wanted}")
    return body


# --- the guest --------------------------------------------------------------------------------------------------


class Guest(Protocol):
    """What the double runs at InstanceStart in place of a guest kernel."""

    def start(self, root_drive: str | None, boot_args: str) -> None:
        """Boot: make the root drive's init run."""

    def connect(self, port: int) -> socket.socket | None:
        """A stream to the guest's listener on vsock ``port``, or None when nothing listens there (yet)."""

    def ctrl_alt_del(self) -> None:
        """Deliver Ctrl-Alt-Del."""

    def exited(self) -> bool:
        """True once the guest has shut down (the double then exits, as Firecracker does)."""

    def cleanup(self) -> None:
        """Release what ``start`` acquired."""


class NoGuest:
    """A guest that boots instantly, listens on nothing and halts at Ctrl-Alt-Del (API-only tests)."""

    def __init__(self) -> None:
        self.started = False
        self.halted = False

    def start(self, root_drive: str | None, boot_args: str) -> None:
        """Record the boot."""
        del root_drive, boot_args
        self.started = True

    def connect(self, port: int) -> socket.socket | None:
        """Nothing listens."""
        del port
        return None

    def ctrl_alt_del(self) -> None:
        """Halt at once."""
        self.halted = True

    def exited(self) -> bool:
        """Halted by Ctrl-Alt-Del."""
        return self.halted

    def cleanup(self) -> None:
        """Nothing to release."""


_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter_private_mount_namespace() -> None:
    """Give this process its own mount namespace, so the guest's mounts vanish with it and never reach the host."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")


def _die_with_parent() -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ChrootGuest:
    """The emulated guest: the root drive loop-mounted, its ``/sbin/corral-init`` chrooted as PID 1 of a new PID
    namespace, and vsock ports served by Unix sockets under ``/run/corral-vsock/<port>.sock`` inside it.

    Needs root and a private mount namespace (:func:`enter_private_mount_namespace`), which ``serve`` sets up.
    """

    INIT = "/sbin/corral-init"
    UDS_DIR = "/run/corral-vsock"

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        self.mounted = False
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, root_drive: str | None, boot_args: str) -> None:
        """Mount the drive and start its init."""
        if root_drive is None:
            raise ApiFault("Cannot start microvm without a root block device (the emulated guest needs one).")
        os.makedirs(self.mountpoint, exist_ok=True)
        done = subprocess.run(
            ["mount", "-o", "loop,rw", root_drive, self.mountpoint], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise ApiFault(f"Failed to mount the root drive {root_drive}: {done.stderr.strip()}")
        self.mounted = True
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "CORRAL_GUEST_EMULATED": "1",
            "CORRAL_CMDLINE": boot_args,
            "CORRAL_VSOCK_UDS_DIR": self.UDS_DIR,
        }
        self.process = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", "chroot", self.mountpoint, self.INIT],
            env=env,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - the whole point: the guest dies with its VMM
        )

    def connect(self, port: int) -> socket.socket | None:
        """Connect to the guest's listener for ``port``; None while it is not listening."""
        try:  # through /proc/self/fd: the mount point's path may be longer than a socket address allows
            dirfd = os.open(os.path.join(self.mountpoint, self.UDS_DIR.lstrip("/")), os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(f"/proc/self/fd/{dirfd}/{port}.sock")
        except OSError:
            sock.close()
            return None
        finally:
            os.close(dirfd)
        return sock

    def _init_pid(self) -> int | None:
        if self.process is None:
            return None
        try:
            with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children", encoding="ascii") as fh:
                children = fh.read().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def ctrl_alt_del(self) -> None:
        """SIGINT to the guest's init, as the kernel does when init disabled the immediate Ctrl-Alt-Del reboot.

        Right after InstanceStart the init process may not exist yet; the keypress then waits for it (a real
        kernel would see it as soon as it booted far enough).
        """
        deadline = time.monotonic() + 3.0
        pid = self._init_pid()
        while pid is None and not self.exited() and time.monotonic() < deadline:
            time.sleep(0.01)
            pid = self._init_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def exited(self) -> bool:
        """True once the PID namespace's init is gone."""
        return self.process is not None and self.process.poll() is not None

    def cleanup(self) -> None:
        """Kill what is left of the guest and unmount its root."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.mounted:
            subprocess.run(["umount", "-l", self.mountpoint], capture_output=True, check=False)
            self.mounted = False
        with contextlib.suppress(OSError):
            os.rmdir(self.mountpoint)


# --- hybrid vsock -------------------------------------------------------------------------------------------------


class VsockRelay:
    """Firecracker's host side of vsock: a Unix listener at ``uds_path`` that forwards ``CONNECT <port>``."""

    FIRST_HOST_PORT = 1 << 30

    def __init__(self, uds_path: str, guest: Guest) -> None:
        self.uds_path = uds_path
        self.guest = guest
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(uds_path)
        except OSError as exc:
            self.listener.close()
            raise ApiFault(
                "Cannot create backend for vsock device: Error binding to the host-side Unix socket: "
                f"{os.strerror(exc.errno or errno.EADDRINUSE)} (os error {exc.errno})"
            ) from exc
        self.listener.listen(64)
        self._ports = iter(range(self.FIRST_HOST_PORT, 1 << 31))
        self._closed = False
        threading.Thread(target=self._accept_loop, name="vsock-accept", daemon=True).start()

    def close(self) -> None:
        """Stop listening and remove the socket file."""
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.uds_path)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="vsock-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        line = b""
        with contextlib.suppress(OSError):
            while not line.endswith(b"\n") and len(line) < 64:
                chunk = conn.recv(1)
                if not chunk:
                    break
                line += chunk
        match = re.fullmatch(rb"CONNECT (\d+)\n", line)
        upstream = self.guest.connect(int(match.group(1))) if match else None
        if upstream is None:  # no listener in the guest (yet): Firecracker resets the connection
            conn.close()
            return
        try:
            conn.sendall(b"OK %d\n" % next(self._ports))
        except OSError:
            conn.close()
            upstream.close()
            return
        _pipe(conn, upstream)


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions are done, then close both sockets."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(256 * 1024)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=copy, args=(b, a), daemon=True)
    other.start()
    copy(a, b)
    other.join()
    a.close()
    b.close()


# --- the API ------------------------------------------------------------------------------------------------------


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


# --- HTTP over the Unix socket ------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ApiServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        with self.server.lock:
            status, body = self.server.api.handle(self.command, self.path, raw)
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if data:
            self.wfile.write(data)

    do_GET = do_PUT = do_PATCH = do_POST = do_DELETE = _serve

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write("fake-firecracker: " + (format % args) + "\n")


class _ApiServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, api: ApiDouble) -> None:
        self.api = api
        self.lock = threading.Lock()
        super().__init__(path, _Handler)


def start_api_server(path: str, api: ApiDouble) -> tuple[_ApiServer, threading.Thread]:
    """Serve ``api`` on the Unix socket ``path`` from a background thread (for in-process tests)."""
    server = _ApiServer(path, api)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    return server, thread


def serve(api_sock: str, instance_id: str, guest_mode: str) -> int:
    """Run like ``firecracker --api-sock PATH --id ID`` until the guest halts or a signal arrives."""
    main_jobs: queue.Queue[tuple[Callable[[], None], Future[None]]] = queue.Queue()

    def run_on_main(fn: Callable[[], None]) -> None:
        done: Future[None] = Future()
        main_jobs.put((fn, done))
        done.result()

    guest: Guest
    if guest_mode == "chroot":
        enter_private_mount_namespace()
        guest = ChrootGuest(os.path.abspath(api_sock) + ".root")
    else:
        guest = NoGuest()
    api = ApiDouble(instance_id=instance_id, guest=guest, run_on_main=run_on_main)
    server, thread = start_api_server(api_sock, api)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    try:
        while not stop.is_set():
            try:
                fn, done = main_jobs.get(timeout=0.05)
            except queue.Empty:
                if api.started and guest.exited():
                    break
                continue
            try:
                fn()
                done.set_result(None)
            except BaseException as exc:
                done.set_exception(exc)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=2)
        api.close()
        guest.cleanup()
        with contextlib.suppress(OSError):
            os.unlink(api_sock)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m corral.microvm.fake_firecracker --api-sock PATH [--id ID] [--guest chroot|none]``."""
    parser = argparse.ArgumentParser(description="Test double of the firecracker binary (no KVM needed).")
    parser.add_argument("--api-sock", required=True)
    parser.add_argument("--id", default="anonymous-instance")
    parser.add_argument("--guest", choices=("chroot", "none"), default=os.environ.get("CORRAL_FAKE_GUEST", "chroot"))
    parser.add_argument("--version", action="version", version=f"Firecracker v{VMM_VERSION}")
    args = parser.parse_args(argv)
    if os.path.exists(args.api_sock):
        sys.stderr.write(f"fake-firecracker: API socket {args.api_sock} already exists\n")
        return 1
    started = time.monotonic()
    code = serve(args.api_sock, args.id, args.guest)
    sys.stderr.write(f"fake-firecracker: {args.id} exited after {time.monotonic() - started:.2f} s\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
