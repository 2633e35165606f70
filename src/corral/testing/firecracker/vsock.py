"""Firecracker's host side of hybrid vsock (``CONNECT <port>\\n`` -> ``OK <host_port>\\n``, then raw bytes),
relayed to the emulated guest's listeners.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import threading

from corral.testing.firecracker.guest import Guest
from corral.testing.firecracker.schema import ApiFault

__all__ = ["VsockRelay"]


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
