"""The hybrid-vsock handshake: CONNECT/OK, retries while the guest boots, and a deadline with the last failure."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from corral.microvm.vsock import VsockConnectError, connect
from corral.testing.firecracker import VsockRelay

pytestmark = pytest.mark.unit


class Vmm:
    """A Unix listener speaking Firecracker's host side of vsock; ``answer`` decides each connection's reply."""

    def __init__(self, path: str, answer: Callable[[int, bytes], bytes | None]) -> None:
        self.path = path
        self.answer = answer
        self.attempts = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._serve, self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.attempts += 1
        line = await reader.readline()
        self.requests.append(line)
        reply = self.answer(self.attempts, line)
        if reply is None:  # nothing listens in the guest yet: Firecracker closes the connection
            writer.close()
            return
        writer.write(reply + b"echo:")
        await writer.drain()
        data = await reader.read(100)
        writer.write(data)
        await writer.drain()
        writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def vmm_factory(tmp_path: Path) -> AsyncIterator[Callable[[Callable[[int, bytes], bytes | None]], Vmm]]:
    """Makes started VMM doubles on a socket in tmp_path; closes them afterwards."""
    made: list[Vmm] = []

    def make(answer: Callable[[int, bytes], bytes | None]) -> Vmm:
        vmm = Vmm(str(tmp_path / "v.sock"), answer)
        made.append(vmm)
        return vmm

    yield make
    for vmm in made:
        await vmm.close()


async def test_connect_sends_connect_and_returns_the_stream(vmm_factory: Callable[..., Vmm]) -> None:
    """The host sends CONNECT <port>, gets OK, and the same stream then carries the guest's bytes both ways."""
    vmm = vmm_factory(lambda n, line: b"OK 1073741824\n")
    await vmm.start()
    reader, writer = await connect(vmm.path, 1024, timeout_s=5)
    assert vmm.requests == [b"CONNECT 1024\n"]
    assert await reader.readexactly(5) == b"echo:"
    writer.write(b"ping")
    await writer.drain()
    assert await reader.readexactly(4) == b"ping"
    writer.close()
    await writer.wait_closed()


async def test_connect_retries_while_the_guest_boots(vmm_factory: Callable[..., Vmm]) -> None:
    """Connections closed without an answer (guest not listening yet) are retried until one gets OK."""
    vmm = vmm_factory(lambda n, line: b"OK 1\n" if n >= 4 else None)
    await vmm.start()
    reader, writer = await connect(vmm.path, 52, timeout_s=10, retry_interval_s=0.01)
    assert vmm.attempts == 4
    assert set(vmm.requests) == {b"CONNECT 52\n"}
    writer.close()
    await writer.wait_closed()
    del reader


async def test_connect_retries_until_the_socket_appears(tmp_path: Path, vmm_factory: Callable[..., Vmm]) -> None:
    """A socket that does not exist yet (VMM still starting) is waited for."""
    vmm = vmm_factory(lambda n, line: b"OK 7\n")

    async def start_later() -> None:
        await asyncio.sleep(0.2)
        await vmm.start()

    starter = asyncio.create_task(start_later())
    _, writer = await connect(vmm.path, 1024, timeout_s=10, retry_interval_s=0.01)
    await starter
    writer.close()
    await writer.wait_closed()


async def test_deadline_reports_the_last_failure(tmp_path: Path, vmm_factory: Callable[..., Vmm]) -> None:
    """Past the deadline VsockConnectError says how many attempts were made and what the last one saw."""
    with pytest.raises(VsockConnectError, match=r"does not exist") as missing:
        await connect(str(tmp_path / "absent.sock"), 1024, timeout_s=0.3, retry_interval_s=0.05)
    assert missing.value.details["attempts"] >= 2
    vmm = vmm_factory(lambda n, line: b"NOPE\n")
    await vmm.start()
    with pytest.raises(VsockConnectError, match=r"answered b'NOPE\\n' instead of OK"):
        await connect(vmm.path, 1024, timeout_s=0.3, retry_interval_s=0.05)
    assert vmm.attempts >= 2


# --- against the Firecracker double's relay: its hang, its 2000 ms drop, its reset -----------------------------------


class SlowGuest:
    """A guest for the double's :class:`VsockRelay` whose vsock driver comes up ``boot_s`` after creation (never,
    with None); then port 1024 echoes through a socket pair and other ports are refused."""

    def __init__(self, boot_s: float | None) -> None:
        self.ready_at = None if boot_s is None else time.monotonic() + boot_s
        self.accepted: list[socket.socket] = []

    def start(self, root_drive: str | None, boot_args: str) -> None:
        del root_drive, boot_args

    def vsock_ready(self) -> bool:
        return self.ready_at is not None and time.monotonic() >= self.ready_at

    def connect(self, port: int) -> socket.socket | None:
        if port != 1024:
            return None
        host_end, guest_end = socket.socketpair()
        self.accepted.append(guest_end)
        return host_end

    def keyboard_ready(self) -> bool:
        return False

    def ctrl_alt_del(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def exited(self) -> bool:
        return False

    def cleanup(self) -> None:
        for sock in self.accepted:
            sock.close()


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[Callable[..., VsockRelay]]:
    """Makes the double's relays on sockets in tmp_path; closes them and their guests afterwards."""
    made: list[tuple[VsockRelay, SlowGuest]] = []

    def make(guest: SlowGuest, running: Callable[[], bool] = lambda: True) -> VsockRelay:
        relay = VsockRelay(str(tmp_path / f"r{len(made)}.sock"), guest, running)
        made.append((relay, guest))
        return relay

    yield make
    for relay, guest in made:
        relay.close()
        guest.cleanup()


async def test_connect_times_out_when_the_guest_never_answers(relays: Callable[..., VsockRelay]) -> None:
    """A guest whose driver never comes up leaves CONNECT unanswered: the client waits its 2 s handshake timeout,
    retries, and past its deadline reports the timeout; the relay drops each request it could not answer."""
    relay = relays(SlowGuest(boot_s=None))
    started = time.monotonic()
    with pytest.raises(VsockConnectError, match=r"no answer to CONNECT 1024 within 2 s") as caught:
        await connect(relay.uds_path, 1024, timeout_s=3.0, retry_interval_s=0.02)
    elapsed = time.monotonic() - started
    assert 2.9 <= elapsed < 4.5
    assert caught.value.details["attempts"] == 2
    deadline = time.monotonic() + 3
    while relay.dropped < 1:  # the relay gives up on the first request at its own 2000 ms
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_connect_waits_for_the_guest_driver_on_one_request(relays: Callable[..., VsockRelay]) -> None:
    """CONNECT hangs (not refused) while the guest boots and is answered as soon as its driver is up."""
    relay = relays(SlowGuest(boot_s=0.5))
    started = time.monotonic()
    reader, writer = await connect(relay.uds_path, 1024, timeout_s=5.0)
    assert time.monotonic() - started >= 0.45
    assert (relay.dropped, relay.refused) == (0, 0), "one request, answered"
    writer.close()
    await writer.wait_closed()
    del reader


async def test_paused_guest_does_not_answer_and_an_unlistened_port_is_refused(
    relays: Callable[..., VsockRelay],
) -> None:
    """A paused VM answers nothing (dropped after 2 s); a running one refuses a port nobody listens on at once."""
    paused = relays(SlowGuest(boot_s=0), running=lambda: False)
    with pytest.raises(VsockConnectError, match=r"within 2 s|closed the connection"):
        await connect(paused.uds_path, 1024, timeout_s=2.5, retry_interval_s=0.02)
    assert paused.refused == 0
    running = relays(SlowGuest(boot_s=0))
    with pytest.raises(VsockConnectError, match=r"the VMM closed the connection") as caught:
        await connect(running.uds_path, 52, timeout_s=0.3, retry_interval_s=0.02)
    assert caught.value.details["attempts"] >= 2
    assert running.refused >= 2


async def test_reset_ends_open_connections(relays: Callable[..., VsockRelay]) -> None:
    """The transport reset a snapshot causes closes a connected stream: the host reads end of file."""
    relay = relays(SlowGuest(boot_s=0))
    reader, writer = await connect(relay.uds_path, 1024, timeout_s=5.0)
    relay.reset()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await writer.wait_closed()
