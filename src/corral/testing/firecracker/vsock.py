"""Firecracker's host side of hybrid vsock (``CONNECT <port>\\n`` -> ``OK <host_port>\\n``, then raw bytes),
relayed to the emulated guest's listeners, with Firecracker's timing:

* a ``CONNECT`` is forwarded to the guest as a connection request and **waits** for its answer: while the guest's
  vsock driver is not up, or the VM is paused, nothing answers, and Firecracker drops the request (closes the host
  connection) after :data:`CONN_REQUEST_TIMEOUT_S` (``CONN_REQUEST_TIMEOUT_MS = 2000`` in its vsock muxer);
* a guest whose driver is up resets a request for a port nobody listens on: the host connection closes at once;
* taking a snapshot sends the guest ``VIRTIO_VSOCK_EVENT_TRANSPORT_RESET``, which ends every open connection
  (:meth:`VsockRelay.reset`); the host must connect again afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import threading
import time
from collections.abc import Callable

from corral.testing.firecracker.guest import Guest
from corral.testing.firecracker.schema import VSOCK, ApiFault

__all__ = ["CONN_REQUEST_TIMEOUT_S", "VsockRelay"]

CONN_REQUEST_TIMEOUT_S = 2.0
"""How long Firecracker keeps a host-initiated connection request the guest has not answered."""
_POLL_S = 0.01


class VsockRelay:
    """Firecracker's host side of vsock: a Unix listener at ``uds_path`` that forwards ``CONNECT <port>``.

    ``running`` tells whether guest code runs (booted and not paused); a guest that does not run answers nothing.
    """

    FIRST_HOST_PORT = 1 << 30

    def __init__(self, uds_path: str, guest: Guest, running: Callable[[], bool] = lambda: True) -> None:
        self.uds_path = uds_path
        self.guest = guest
        self.running = running
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(uds_path)
        except OSError as exc:
            self.listener.close()
            raise ApiFault(
                f"{VSOCK}Cannot create backend for vsock device: Error binding to the host-side Unix socket: "
                f"{os.strerror(exc.errno or errno.EADDRINUSE)} (os error {exc.errno})"
            ) from exc
        self.listener.listen(64)
        self._ports = iter(range(self.FIRST_HOST_PORT, 1 << 31))
        self._closed = False
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.dropped = 0
        """Connection requests dropped unanswered after :data:`CONN_REQUEST_TIMEOUT_S`."""
        self.refused = 0
        """Connection requests the guest reset (nothing listening on the port)."""
        threading.Thread(target=self._accept_loop, name="vsock-accept", daemon=True).start()

    def close(self) -> None:
        """Stop listening, end every connection and remove the socket file."""
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.reset()
        with contextlib.suppress(OSError):
            os.unlink(self.uds_path)

    def reset(self) -> None:
        """``VIRTIO_VSOCK_EVENT_TRANSPORT_RESET``: end every open connection (Firecracker does it at snapshot
        creation, so a restored guest does not wait on connections whose host end is gone)."""
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="vsock-conn", daemon=True).start()

    def _answer(self, port: int) -> socket.socket | None:
        """Wait for the guest to answer a connection request: its listener's stream, or None (reset or dropped)."""
        deadline = time.monotonic() + CONN_REQUEST_TIMEOUT_S
        while not self._closed:
            if self.running() and self.guest.vsock_ready():
                upstream = self.guest.connect(port)
                if upstream is None:
                    self.refused += 1
                return upstream
            if time.monotonic() >= deadline:
                self.dropped += 1
                return None
            time.sleep(_POLL_S)
        return None

    def _serve(self, conn: socket.socket) -> None:
        line = b""
        with contextlib.suppress(OSError):
            while not line.endswith(b"\n") and len(line) < 64:
                chunk = conn.recv(1)
                if not chunk:
                    break
                line += chunk
        match = re.fullmatch(rb"CONNECT (\d+)\n", line)
        upstream = self._answer(int(match.group(1))) if match else None
        if upstream is None:
            conn.close()
            return
        with self._lock:  # before OK: a reset right after the host got its answer must reach this connection
            self._open.update((conn, upstream))
        try:
            conn.sendall(b"OK %d\n" % next(self._ports))
        except OSError:
            conn.close()
            upstream.close()
        else:
            _pipe(conn, upstream)
        finally:
            with self._lock:
                self._open.difference_update((conn, upstream))


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
