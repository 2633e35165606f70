#!/usr/bin/python3 -I
"""``/sbin/corral-init``: PID 1 of a Corral microVM. Standard library only; it runs on the rootfs's Python.

The rootfs builder (:mod:`corral.microvm.rootfs`) installs this file as ``/sbin/corral-init`` and the guest agent
(:mod:`corral.guest.agent`) as ``/usr/lib/corral/agent.py``; the manager boots the kernel with
``init=/sbin/corral-init``. At boot it:

1. mounts ``/proc``, ``/sys``, ``/dev`` (devtmpfs), ``/dev/pts``, ``/dev/shm`` and ``/run``;
2. disables the immediate Ctrl-Alt-Del reboot, so ``SendCtrlAltDel`` reaches it as SIGINT and shuts down cleanly;
3. brings up ``lo`` and, when the kernel did not already do it (no ``CONFIG_IP_PNP``), configures the interface
   named in the kernel's ``ip=<client>::<gateway>:<netmask>:<hostname>:<device>:off[:<dns0>[:<dns1>]]`` argument
   with ioctls (address, netmask, up, default route), sets the hostname and writes ``/etc/resolv.conf``;
4. listens on vsock port ``corral.agent_port`` (default 1024) and, for every connection the host opens through
   Firecracker's hybrid vsock, starts one agent whose stdin/stdout is that connection;
5. reaps orphans, and on SIGINT/SIGTERM stops every process, syncs, remounts ``/`` read-only and reboots (which
   ends the Firecracker process, as the guest is booted with ``reboot=k``).

Emulated guests (the test double :mod:`corral.testing.firecracker`, which cannot boot a kernel) set
``CORRAL_GUEST_EMULATED=1``, pass the command line in ``CORRAL_CMDLINE`` and ask for Unix sockets under
``CORRAL_VSOCK_UDS_DIR`` instead of AF_VSOCK. In that mode the init never touches anything the host shares with
it: no hostname, no network configuration (it shares the double's network namespace), a private ``/dev`` with
only the basic nodes, and an exit instead of a reboot.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

__all__ = [
    "DEFAULT_AGENT_PORT",
    "IpConfig",
    "configure_interface",
    "main",
    "parse_cmdline",
    "parse_ip_arg",
]

DEFAULT_AGENT_PORT = 1024
AGENT_PATH = "/usr/lib/corral/agent.py"
WORKSPACE = "/workspace"
AGENT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
}
STOP_GRACE_S = 2.0

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
SIOCGIFADDR = 0x8915
SIOCSIFADDR = 0x8916
SIOCSIFNETMASK = 0x891C
SIOCADDRT = 0x890B
IFF_UP = 0x1
RTF_UP = 0x1
RTF_GATEWAY = 0x2
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
LINUX_REBOOT_CMD_CAD_OFF = 0
RB_AUTOBOOT = 0x01234567


def log(message: str) -> None:
    """One line on the console (the serial port in a VM, the double's log when emulated)."""
    sys.stderr.write(f"corral-init: {message}\n")
    sys.stderr.flush()


# --- kernel command line ----------------------------------------------------------------------------------------


def parse_cmdline(text: str) -> dict[str, str]:
    """``key=value`` words of a kernel command line (bare words map to ``""``; the last one wins)."""
    args: dict[str, str] = {}
    for word in text.split():
        key, _, value = word.partition("=")
        args[key] = value
    return args


@dataclass(frozen=True)
class IpConfig:
    """The kernel's ``ip=`` argument (Documentation/admin-guide/nfs/nfsroot.rst), static form."""

    address: str
    gateway: str | None
    netmask: str
    hostname: str | None
    device: str
    dns: tuple[str, ...] = ()

    @property
    def prefixlen(self) -> int:
        """The netmask as a prefix length."""
        return bin(struct.unpack("!I", socket.inet_aton(self.netmask))[0]).count("1")


def parse_ip_arg(value: str) -> IpConfig | None:
    """Parse ``<client>:<server>:<gw>:<netmask>:<hostname>:<device>:<autoconf>:<dns0>:<dns1>``; None for
    ``dhcp``, ``off`` or anything without a client address and netmask."""
    fields = value.split(":")
    fields += [""] * (9 - len(fields))
    client, _server, gateway, netmask, hostname, device, _autoconf, dns0, dns1 = fields[:9]
    if not client or not netmask:
        return None
    for address in (client, netmask, gateway, dns0, dns1):
        if address:
            socket.inet_aton(address)  # raises OSError for a malformed one
    return IpConfig(
        address=client,
        gateway=gateway or None,
        netmask=netmask,
        hostname=hostname or None,
        device=device or "eth0",
        dns=tuple(d for d in (dns0, dns1) if d),
    )


# --- network, by ioctl (no iproute2 needed in the image) --------------------------------------------------------


def _sockaddr_in(address: str) -> bytes:
    return struct.pack("=H2s4s8x", socket.AF_INET, b"\0\0", socket.inet_aton(address))


def _ifreq(name: str, payload: bytes = b"") -> bytes:
    return struct.pack("16s", name.encode()) + payload.ljust(24, b"\0")


class _RtEntry(ctypes.Structure):
    _fields_ = (
        ("rt_pad1", ctypes.c_ulong),
        ("rt_dst", ctypes.c_ubyte * 16),
        ("rt_gateway", ctypes.c_ubyte * 16),
        ("rt_genmask", ctypes.c_ubyte * 16),
        ("rt_flags", ctypes.c_ushort),
        ("rt_pad2", ctypes.c_short),
        ("rt_pad3", ctypes.c_ulong),
        ("rt_pad4", ctypes.c_void_p),
        ("rt_metric", ctypes.c_short),
        ("rt_dev", ctypes.c_char_p),
        ("rt_mtu", ctypes.c_ulong),
        ("rt_window", ctypes.c_ulong),
        ("rt_irtt", ctypes.c_ushort),
    )


def _set_up(sock: socket.socket, name: str) -> None:
    flags = struct.unpack("16sH22x", fcntl.ioctl(sock, SIOCGIFFLAGS, _ifreq(name)))[1]
    fcntl.ioctl(sock, SIOCSIFFLAGS, _ifreq(name, struct.pack("H", flags | IFF_UP)))


def _has_ipv4(sock: socket.socket, name: str) -> bool:
    try:
        fcntl.ioctl(sock, SIOCGIFADDR, _ifreq(name))
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            return False
        raise
    return True


def configure_interface(config: IpConfig) -> bool:
    """Give ``config.device`` its address, netmask and a default route, and bring it up.

    Returns False (and changes nothing) when the interface already has an IPv4 address, which is what a kernel
    built with ``CONFIG_IP_PNP`` does by itself from the same ``ip=`` argument.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        _set_up(sock, "lo")
        if _has_ipv4(sock, config.device):
            _set_up(sock, config.device)
            return False
        fcntl.ioctl(sock, SIOCSIFADDR, _ifreq(config.device, _sockaddr_in(config.address)))
        fcntl.ioctl(sock, SIOCSIFNETMASK, _ifreq(config.device, _sockaddr_in(config.netmask)))
        _set_up(sock, config.device)
        if config.gateway:
            route = _RtEntry()
            ctypes.memmove(route.rt_dst, _sockaddr_in("0.0.0.0"), 16)
            ctypes.memmove(route.rt_gateway, _sockaddr_in(config.gateway), 16)
            ctypes.memmove(route.rt_genmask, _sockaddr_in("0.0.0.0"), 16)
            route.rt_flags = RTF_UP | RTF_GATEWAY
            route.rt_dev = config.device.encode()
            fcntl.ioctl(sock, SIOCADDRT, bytes(memoryview(route).cast("B")))
    return True


# --- mounts, reboot ---------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str, flags: int = 0, data: str | None = None) -> None:
    os.makedirs(target, exist_ok=True)
    if _libc.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode() if data else None):
        err = ctypes.get_errno()
        if err != errno.EBUSY:
            log(f"mount {fstype} on {target} failed: {os.strerror(err)}")


def mount_basics(emulated: bool) -> None:
    """The pseudo file systems every program expects."""
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if emulated:  # a private /dev: never the host's devtmpfs
        _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=0755")
        for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8),
                                   ("urandom", 1, 9), ("tty", 5, 0)):  # fmt: skip
            with contextlib.suppress(FileExistsError):
                os.mknod(f"/dev/{name}", 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(f"/dev/{name}", 0o666)  # noqa: S103 - /dev/null and friends are world-writable
    else:
        _mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755")
    _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "ptmxmode=0666,mode=0620")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV)  # noqa: S108 - mounting it, not using it
    _mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    for link, target in (("/dev/fd", "/proc/self/fd"), ("/dev/stdin", "/proc/self/fd/0"),
                         ("/dev/stdout", "/proc/self/fd/1"), ("/dev/stderr", "/proc/self/fd/2")):  # fmt: skip
        with contextlib.suppress(OSError):
            os.symlink(target, link)


# --- the agent listener -----------------------------------------------------------------------------------------


class AgentListener:
    """Accepts host connections on the agent port and runs one agent per connection."""

    def __init__(self, port: int, uds_dir: str | None) -> None:
        if uds_dir is None:
            self.sock = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
            self.sock.bind((socket.VMADDR_CID_ANY, port))
            where = f"vsock port {port}"
        else:
            os.makedirs(uds_dir, exist_ok=True)
            path = os.path.join(uds_dir, f"{port}.sock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(path)
            where = path
        self.sock.listen(64)
        self.agents: list[subprocess.Popen[bytes]] = []
        log(f"agent listening on {where}")

    def serve_forever(self) -> None:
        """Accept until the socket is closed."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                self.agents.append(
                    subprocess.Popen(
                        [sys.executable, "-I", "-S", AGENT_PATH],
                        stdin=conn.fileno(),
                        stdout=conn.fileno(),
                        cwd=WORKSPACE if os.path.isdir(WORKSPACE) else "/",
                        env=AGENT_ENV,
                    )
                )
            except OSError as exc:
                log(f"cannot start the agent: {exc}")
            finally:
                conn.close()
            self.agents = [a for a in self.agents if a.poll() is None]

    def close(self) -> None:
        """Stop accepting."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# --- PID 1 ------------------------------------------------------------------------------------------------------


class _Shutdown(Exception):
    pass


def _request_shutdown(signum: int, frame: object) -> None:
    del frame
    raise _Shutdown(signal.Signals(signum).name)


def _reap(deadline: float | None) -> None:
    """Reap children until none is left (or ``deadline`` passes)."""
    while deadline is None or time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.02)


def _stop_everything() -> None:
    """SIGTERM to every process but this one, a grace period, then SIGKILL (PID 1 only: never on a host)."""
    if os.getpid() != 1:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGTERM)
    _reap(time.monotonic() + STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    _reap(time.monotonic() + STOP_GRACE_S)


def main() -> int:
    """Boot, serve the agent, shut down on SIGINT (Ctrl-Alt-Del) or SIGTERM."""
    emulated = os.environ.get("CORRAL_GUEST_EMULATED") == "1"
    if os.getpid() != 1 and not emulated:
        log("refusing to run: not PID 1 (set CORRAL_GUEST_EMULATED=1 for an emulated guest)")
        return 2
    shutdown_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, shutdown_signals)  # a shutdown asked for during boot waits for it
    mount_basics(emulated)
    if emulated:
        cmdline = os.environ.get("CORRAL_CMDLINE", "")
    else:
        _libc.reboot(LINUX_REBOOT_CMD_CAD_OFF)
        with open("/proc/cmdline", encoding="utf-8") as fh:
            cmdline = fh.read()
    args = parse_cmdline(cmdline)
    if not emulated:
        _setup_network(args)
    port = int(args.get("corral.agent_port") or DEFAULT_AGENT_PORT)
    os.makedirs(WORKSPACE, exist_ok=True)
    listener = AgentListener(port, os.environ.get("CORRAL_VSOCK_UDS_DIR") if emulated else None)
    for sig in shutdown_signals:
        signal.signal(sig, _request_shutdown)
    try:
        # Unblocked before the listener thread exists, so agents and their commands get a clean signal mask.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, shutdown_signals)
        threading.Thread(target=listener.serve_forever, name="agent-listener", daemon=True).start()
        log("ready")
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(0.2)
    except _Shutdown as why:
        log(f"shutting down ({why})")
    listener.close()
    _stop_everything()
    os.sync()
    if _libc.mount(None, b"/", None, MS_REMOUNT | MS_RDONLY, None):
        log(f"remounting / read-only failed: {os.strerror(ctypes.get_errno())}")
    if not emulated and os.getpid() == 1:
        _libc.reboot(RB_AUTOBOOT)
    log("halted")
    return 0


def _setup_network(args: dict[str, str]) -> None:
    try:
        config = parse_ip_arg(args.get("ip", ""))
    except OSError as exc:
        log(f"ignoring malformed ip= argument: {exc}")
        return
    if config is None:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            _set_up(sock, "lo")
        return
    try:
        changed = configure_interface(config)
        how = "configured" if changed else "already configured by the kernel"
        log(f"{config.device}: {config.address}/{config.prefixlen} via {config.gateway} ({how})")
    except OSError as exc:
        log(f"cannot configure {config.device}: {exc}")
    if config.hostname:
        with contextlib.suppress(OSError):
            socket.sethostname(config.hostname)
    if config.dns:
        with contextlib.suppress(OSError), open("/etc/resolv.conf", "w", encoding="ascii") as fh:
            fh.writelines(f"nameserver {server}\n" for server in config.dns)


if __name__ == "__main__":
    sys.exit(main())
