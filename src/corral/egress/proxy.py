"""The name-checking egress proxy: lets a redirected TCP connection through when it names an allowed host.

The packet filter hands it TCP connections to denied addresses (see :func:`corral.egress.policy.render_rules`). For
each one it reads the client's first bytes, at most :data:`MAX_HELLO` of them within :data:`HELLO_TIMEOUT_S`, and
takes the host name from a TLS ClientHello's SNI or an HTTP request's ``Host`` header. If that name is allowed, it
resolves the *name* (not the address the client dialled, which the client chose) and connects to it on the original
port from inside the workspace's namespace, with the mark that lets it out; otherwise it closes the connection.
Bytes are relayed in bounded chunks with backpressure, at most :data:`MAX_CONNECTIONS` at once per workspace: what
a workspace sends never grows the server's memory beyond that.

Name resolution asks the host's resolver, after a hosts file when ``CORRAL_EGRESS_HOSTS_FILE`` names one (the
operator's overrides for internal names, and how the tests point names at addresses they created).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
from collections.abc import Sequence
from pathlib import Path

from corral.egress import netns
from corral.egress.policy import EgressPolicy, Network, host_allowed

__all__ = ["EgressProxy", "Resolver", "hello_host"]

log = logging.getLogger(__name__)

MAX_HELLO = 16 * 1024
HELLO_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 256
CHUNK = 64 * 1024


_LOOKUPS = asyncio.Semaphore(4)


class Resolver:
    """Host names to addresses: a hosts file first (re-read when it changes), then the host's resolver."""

    def __init__(self, hosts_file: Path | None = None) -> None:
        self.hosts_file = hosts_file
        self._hosts: dict[str, list[str]] = {}
        self._stamp: float | None = None

    def _overrides(self) -> dict[str, list[str]]:
        if self.hosts_file is None:
            return {}
        try:
            stamp = self.hosts_file.stat().st_mtime
        except OSError:
            return {}
        if stamp != self._stamp:
            hosts: dict[str, list[str]] = {}
            for line in self.hosts_file.read_text(errors="replace").splitlines():
                fields = line.split("#", 1)[0].split()
                if len(fields) < 2:
                    continue
                with contextlib.suppress(ValueError):
                    ipaddress.ip_address(fields[0])
                    for name in fields[1:]:
                        hosts.setdefault(name.lower().rstrip("."), []).append(fields[0])
            self._hosts, self._stamp = hosts, stamp
        return self._hosts

    async def resolve(self, name: str, port: int) -> list[tuple[int, tuple[str, int]]]:
        """``(family, (address, port))`` for ``name``, IPv4 first."""
        name = name.lower().rstrip(".")
        overrides = self._overrides().get(name)
        if overrides:
            return [(_family(a), (a, port)) for a in overrides]
        # Names come from workspaces: a few lookups at a time, so slow DNS cannot fill the default executor.
        async with _LOOKUPS:
            infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        ordered = sorted(infos, key=lambda info: info[0] != socket.AF_INET)
        return [(int(info[0]), (str(info[4][0]), int(info[4][1]))) for info in ordered]


class EgressProxy:
    """One workspace's proxy: a listener on its loopback, served by this process's event loop."""

    def __init__(
        self,
        workspace_id: str,
        ns_fd: int,
        policy: EgressPolicy,
        resolver: Resolver,
        base_deny: Sequence[Network] = (),
    ) -> None:
        self.workspace_id = workspace_id
        self.ns_fd = ns_fd
        self.policy = policy
        self.resolver = resolver
        self.base_deny = tuple(base_deny)
        self._server: asyncio.Server | None = None
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Listen inside the workspace; return the port (on its 127.0.0.1) the filter redirects to."""
        sock = await asyncio.to_thread(netns.listen_loopback, self.ns_fd)
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=CHUNK)
        return int(sock.getsockname()[1])

    async def aclose(self) -> None:
        """Stop listening and cut every relayed connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._slots.locked():
                log.info("workspace %s: egress proxy full (%d connections)", self.workspace_id, MAX_CONNECTIONS)
                return
            async with self._slots:
                await self._serve(reader, writer)
        except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("workspace %s: egress connection ended: %s", self.workspace_id, exc)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        destination = netns.original_destination(writer.get_extra_info("socket"))
        if destination is None:
            return
        hello = await asyncio.wait_for(_read_hello(reader), HELLO_TIMEOUT_S)
        name = hello_host(hello)
        if name is None or not host_allowed(self.policy, name):
            log.info(
                "workspace %s: egress to %s:%d denied (%s)",
                self.workspace_id,
                destination[0],
                destination[1],
                f"host {name!r} not allowed" if name else "no host name in the first bytes",
            )
            return
        upstream = await self._dial(name, destination[1])
        try:
            up_reader, up_writer = await asyncio.open_connection(sock=upstream, limit=CHUNK)
        except BaseException:
            upstream.close()
            raise
        try:
            up_writer.write(hello)
            await up_writer.drain()
            await _relay(reader, writer, up_reader, up_writer)
        finally:
            up_writer.close()

    async def _dial(self, name: str, port: int) -> socket.socket:
        last: OSError | None = None
        for family, address in await self.resolver.resolve(name, port):
            if not self._dialable(address[0]):
                # An allowed name that resolves to another workspace, the host or a metadata service: the proxy's
                # own connections pass the filter, so it must refuse what the filter would have.
                log.info("workspace %s: %s resolves to %s, which is always denied", self.workspace_id, name, address[0])
                last = OSError(f"{name} resolves to {address[0]}, which workspaces may not reach")
                continue
            try:
                return await netns.connect_marked(self.ns_fd, address, family, CONNECT_TIMEOUT_S)
            except OSError as exc:
                last = exc
        raise last or OSError(f"{name} has no address")

    def _dialable(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        if any(ip in network for network in self.policy.allow_networks if network.version == ip.version):
            return True
        return not any(ip in network for network in self.base_deny if network.version == ip.version)


async def _read_hello(reader: asyncio.StreamReader) -> bytes:
    """The client's first bytes: a whole TLS record or HTTP header block, or whatever came before the bound."""
    data = b""
    while len(data) < MAX_HELLO:
        chunk = await reader.read(MAX_HELLO - len(data))
        if not chunk:
            break
        data += chunk
        if data[:1] == b"\x16" and len(data) >= 5:
            if len(data) >= 5 + struct.unpack_from("!H", data, 3)[0]:
                break
        elif b"\r\n\r\n" in data:
            break
    return data


def hello_host(data: bytes) -> str | None:
    """The host name a connection's first bytes name: a TLS ClientHello's SNI, or an HTTP/1 ``Host`` header (port
    dropped). None when there is neither."""
    if data[:1] == b"\x16":
        return _sni(data)
    head = data.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"host":
            host = value.strip().decode("ascii", errors="replace")
            if host.startswith("["):
                return host[1 : host.find("]")] or None
            return host.rsplit(":", 1)[0] or None
    return None


def _sni(data: bytes) -> str | None:
    try:
        # record(5) handshake type(1) length(3) version(2) random(32)
        pos = 5 + 4 + 2 + 32
        if data[5] != 1:
            return None
        pos += 1 + data[pos]  # session id
        pos += 2 + struct.unpack_from("!H", data, pos)[0]  # cipher suites
        pos += 1 + data[pos]  # compression methods
        end = pos + 2 + struct.unpack_from("!H", data, pos)[0]
        pos += 2
        while pos + 4 <= end:
            kind, length = struct.unpack_from("!HH", data, pos)
            pos += 4
            if kind == 0:  # server_name: list length(2), then type(1) length(2) name
                name_type, name_len = struct.unpack_from("!BH", data, pos + 2)
                if name_type == 0:
                    return data[pos + 5 : pos + 5 + name_len].decode("ascii")
                return None
            pos += length
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return None


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        while chunk := await src.read(CHUNK):
            dst.write(chunk)
            await dst.drain()
        with contextlib.suppress(OSError):
            if dst.can_write_eof():
                dst.write_eof()

    tasks = [asyncio.ensure_future(pump(reader, up_writer)), asyncio.ensure_future(pump(up_reader, writer))]
    try:
        # A direction that ends cleanly half-closes and the other carries on; one that fails ends both.
        pending: set[asyncio.Future[None]] = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(task.exception() is not None for task in done):
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _family(address: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
