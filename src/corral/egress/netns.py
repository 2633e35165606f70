"""Sockets and packet filters inside another process's network namespace, made from the host.

A network namespace is per thread: :func:`in_namespace` runs a function in a fresh thread that joins the namespace,
so the server's own threads never leave the host's. A socket keeps the namespace it was made in for its whole life,
so the proxy's listening socket sits on the workspace's loopback and its outgoing sockets leave through the
workspace's interface (and its packet filter), while the event loop that serves them runs on the host.

This needs CAP_SYS_ADMIN (``setns``) and CAP_NET_ADMIN (``iptables``, ``SO_MARK``) on the host: Corral's server runs
as root wherever Docker does.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

from corral.egress.policy import EGRESS_MARK

__all__ = ["apply_rules", "connect_marked", "in_namespace", "listen_loopback", "original_destination"]

_T = TypeVar("_T")
_CLONE_NEWNET = 0x40000000
_SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
_libc = ctypes.CDLL(None, use_errno=True)


def in_namespace(ns_fd: int, fn: Callable[[], _T]) -> _T:
    """Run ``fn`` in a new thread that has joined the network namespace open at ``ns_fd``; return its result."""
    result: list[_T] = []
    failure: list[BaseException] = []

    def run() -> None:
        # The thread ends with fn: whatever namespace it is left in dies with it.
        try:
            _join(ns_fd)
            result.append(fn())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, name="corral-netns", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _join(ns_fd: int) -> None:
    if _libc.setns(ns_fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into the workspace's network namespace: {os.strerror(err)}")


def listen_loopback(ns_fd: int) -> socket.socket:
    """A non-blocking TCP socket listening on 127.0.0.1 (a port the kernel picks) inside the namespace."""

    def make() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    return in_namespace(ns_fd, make)


async def connect_marked(ns_fd: int, address: tuple[str, int], family: int, timeout_s: float) -> socket.socket:
    """A TCP connection from inside the namespace, carrying :data:`EGRESS_MARK` so its packet filter lets it out."""

    def make() -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, EGRESS_MARK)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    sock = await asyncio.to_thread(in_namespace, ns_fd, make)
    try:
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, address), timeout_s)
    except BaseException:
        sock.close()
        raise
    return sock


def original_destination(sock: socket.socket) -> tuple[str, int] | None:
    """Where a connection the packet filter redirected was going (``SO_ORIGINAL_DST``); None for one that was not
    redirected (a client that dialled the proxy's port itself)."""
    try:
        raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    except OSError:
        return None
    port, packed = struct.unpack_from("!2xH4s", raw)
    address = socket.inet_ntoa(packed)
    local = sock.getsockname()
    if (address, port) == (local[0], local[1]):
        return None
    return address, port


async def apply_rules(ns_fd: int, command: str, rules: str) -> None:
    """Replace the namespace's tables with ``rules`` through ``command`` (``iptables-restore`` or
    ``ip6tables-restore``), atomically per table.

    Raises:
        OSError: The command is missing or refused the rules (its message included).
    """
    process = await asyncio.create_subprocess_exec(
        "nsenter",
        f"--net=/proc/self/fd/{ns_fd}",
        command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        pass_fds=(ns_fd,),
    )
    _, stderr = await process.communicate(rules.encode())
    if process.returncode != 0:
        raise OSError(f"{command} exited with {process.returncode}: {stderr.decode(errors='replace').strip()[:500]}")
