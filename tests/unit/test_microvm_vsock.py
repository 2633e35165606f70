"""The hybrid-vsock handshake: CONNECT/OK, retries while the guest boots, and a deadline with the last failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from corral.microvm.vsock import VsockConnectError, connect

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
