"""What the double runs at InstanceStart in place of a guest kernel: the :class:`Guest` interface, :class:`NoGuest`
for API-only tests, and :class:`ChrootGuest`, the rootfs's own init chrooted on the root drive.

A guest kernel comes up in stages the host can observe only indirectly, and two of them matter to the API:

* the **keyboard**: ``SendCtrlAltDel`` injects i8042 key codes; a guest whose i8042 driver is not loaded yet (or
  a kernel without one, or an ACPI kernel booted with ``i8042.nopnp``) loses them, and the call still answers 204;
* the **vsock driver**: until it is up, a host ``CONNECT <port>`` gets no answer at all; once it is up, a port
  nobody listens on is refused at once (the guest resets the connection).

For the emulated guest both are "its init has started". A paused VM runs no guest code: the emulation stops every
guest process (SIGSTOP) until it is resumed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
from typing import Protocol

from corral.testing.firecracker.schema import START, ApiFault

__all__ = ["ChrootGuest", "Guest", "NoGuest", "enter_private_mount_namespace"]


class Guest(Protocol):
    """What the double runs at InstanceStart (or at snapshot load) in place of a guest kernel."""

    def start(self, root_drive: str | None, boot_args: str) -> None:
        """Boot: make the root drive's init run."""

    def vsock_ready(self) -> bool:
        """Whether the guest's vsock driver answers connection requests (it has booted far enough)."""

    def connect(self, port: int) -> socket.socket | None:
        """A stream to the guest's listener on vsock ``port``, or None when nothing listens there."""

    def keyboard_ready(self) -> bool:
        """Whether the guest's i8042 keyboard driver is up, so an injected Ctrl-Alt-Del reaches it."""

    def ctrl_alt_del(self) -> None:
        """Deliver Ctrl-Alt-Del to a guest whose keyboard is up."""

    def pause(self) -> None:
        """Stop running guest code (``PATCH /vm Paused``)."""

    def resume(self) -> None:
        """Run guest code again (``PATCH /vm Resumed``)."""

    def flush(self) -> None:
        """Make the root drive's backing file hold what the guest wrote (taken before a snapshot)."""

    def exited(self) -> bool:
        """True once the guest has shut down (the double then exits, as Firecracker does)."""

    def cleanup(self) -> None:
        """Release what ``start`` acquired."""


class NoGuest:
    """A guest that boots instantly and listens on nothing (API-only tests).

    With ``keyboard=True`` it halts at Ctrl-Alt-Del; with ``keyboard=False`` it models a guest whose i8042 driver
    never came up, which loses the keystroke and keeps running.
    """

    def __init__(self, *, keyboard: bool = True) -> None:
        self.keyboard = keyboard
        self.started = False
        self.boots = 0
        self.paused = False
        self.halted = False
        self.lost_keys = 0
        self.flushes = 0

    def start(self, root_drive: str | None, boot_args: str) -> None:
        """Record the boot."""
        del root_drive, boot_args
        self.started = True
        self.boots += 1

    def vsock_ready(self) -> bool:
        """Up as soon as it booted."""
        return self.started and not self.halted

    def connect(self, port: int) -> socket.socket | None:
        """Nothing listens."""
        del port
        return None

    def keyboard_ready(self) -> bool:
        """Up once booted, unless built without a keyboard."""
        return self.keyboard and self.started

    def ctrl_alt_del(self) -> None:
        """Halt at once."""
        self.halted = True

    def pause(self) -> None:
        """Record it."""
        self.paused = True

    def resume(self) -> None:
        """Record it."""
        self.paused = False

    def flush(self) -> None:
        """Count it."""
        self.flushes += 1

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


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (through each thread's ``children`` list), ``root`` excluded."""
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as fh:
                    children = [int(c) for c in fh.read().split()]
                    found.extend(children)
                    todo.extend(children)
    return found


class ChrootGuest:
    """The emulated guest: the root drive loop-mounted, its ``/sbin/corral-init`` chrooted as PID 1 of a new PID
    namespace, and vsock ports served by Unix sockets under ``/run/corral-vsock/<port>.sock`` inside it.

    Needs root and a private mount namespace (:func:`enter_private_mount_namespace`), which ``serve`` sets up.
    ``keyboard=False`` models a guest kernel without an i8042 driver: Ctrl-Alt-Del never reaches it.
    """

    INIT = "/sbin/corral-init"
    UDS_DIR = "/run/corral-vsock"

    def __init__(self, mountpoint: str, *, keyboard: bool = True) -> None:
        self.mountpoint = mountpoint
        self.keyboard = keyboard
        self.mounted = False
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, root_drive: str | None, boot_args: str) -> None:
        """Mount the drive and start its init."""
        if root_drive is None:
            raise ApiFault(f"{START}Cannot start microvm without a root block device (the emulated guest needs one).")
        os.makedirs(self.mountpoint, exist_ok=True)
        done = subprocess.run(
            ["mount", "-o", "loop,rw", root_drive, self.mountpoint], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise ApiFault(f"{START}Failed to mount the root drive {root_drive}: {done.stderr.strip()}")
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

    def _uds_dir(self) -> str:
        return os.path.join(self.mountpoint, self.UDS_DIR.lstrip("/"))

    def vsock_ready(self) -> bool:
        """The init has created its socket directory (its tmpfs ``/run`` is new at every boot)."""
        return self.process is not None and self.process.poll() is None and os.path.isdir(self._uds_dir())

    def connect(self, port: int) -> socket.socket | None:
        """Connect to the guest's listener for ``port``; None while it is not listening."""
        try:  # through /proc/self/fd: the mount point's path may be longer than a socket address allows
            dirfd = os.open(self._uds_dir(), os.O_PATH | os.O_CLOEXEC)
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

    def keyboard_ready(self) -> bool:
        """The guest's init runs (the emulation has no earlier stage), unless the guest has no keyboard."""
        return self.keyboard and self._init_pid() is not None

    def ctrl_alt_del(self) -> None:
        """SIGINT to the guest's init: what a Linux kernel does with Ctrl-Alt-Del once init has disabled the
        immediate reboot. The init blocks SIGINT while it boots, so a keypress during boot waits for it."""
        pid = self._init_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def _signal_all(self, sig: signal.Signals) -> None:
        if self.process is None:
            return
        for pid in _descendants(self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def pause(self) -> None:
        """SIGSTOP every guest process. Three passes: a process forked while the tree was walked is stopped by
        the next one (its parent, found in the first pass, is stopped by then)."""
        for _ in range(3):
            self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT every guest process (a stopped PID 1 of a namespace resumes too: SIGCONT wakes before the
        signal itself is discarded)."""
        self._signal_all(signal.SIGCONT)

    def flush(self) -> None:
        """``syncfs`` on the mounted root drive, so its backing file holds every write.

        A real guest keeps unwritten pages in its own memory, which the memory snapshot carries; the emulation
        cannot restore memory, so it writes them to the disk instead.
        """
        if not self.mounted:
            return
        fd = os.open(self.mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _check(_libc.syncfs(fd), f"syncfs({self.mountpoint})")
        finally:
            os.close(fd)

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
