"""What the double runs at InstanceStart in place of a guest kernel: the :class:`Guest` interface, :class:`NoGuest`
for API-only tests, and :class:`ChrootGuest`, the rootfs's own init chrooted on the root drive.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from typing import Protocol

from corral.testing.firecracker.schema import ApiFault

__all__ = ["ChrootGuest", "Guest", "NoGuest", "enter_private_mount_namespace"]


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
