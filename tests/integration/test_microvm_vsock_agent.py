"""The guest agent behind Firecracker's hybrid vsock, with a local process as the guest.

The double's :class:`~corral.testing.firecracker.VsockRelay` plays Firecracker's side (Unix socket,
``CONNECT``/``OK``, then bytes); the "guest" answers only after a simulated boot delay (a request waits for it) and
then runs the unchanged agent as a subprocess per connection, so the handshake and the agent protocol run for
real.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.guest import agent
from corral.guest.client import GuestConnection
from corral.microvm.vsock import connect
from corral.testing.firecracker import VsockRelay

pytestmark = pytest.mark.integration


class LocalAgentGuest:
    """A guest whose vsock driver is up after ``boot_s`` seconds, then serves port 1024 with a local agent."""

    def __init__(self, boot_s: float) -> None:
        self.ready_at = time.monotonic() + boot_s
        self.refused = 0
        self.agents: list[subprocess.Popen[bytes]] = []

    def start(self, root_drive: str | None, boot_args: str) -> None:
        del root_drive, boot_args

    def vsock_ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def connect(self, port: int) -> socket.socket | None:
        if port != 1024:
            self.refused += 1
            return None
        host_end, guest_end = socket.socketpair()
        self.agents.append(
            subprocess.Popen(
                [sys.executable, "-I", "-S", agent.__file__], stdin=guest_end.fileno(), stdout=guest_end.fileno()
            )
        )
        guest_end.close()
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
        for proc in self.agents:
            proc.kill()
            proc.wait()


@pytest.fixture
def guest() -> Iterator[LocalAgentGuest]:
    """The simulated guest; its agents are killed afterwards."""
    g = LocalAgentGuest(boot_s=0.5)
    yield g
    g.cleanup()


async def test_agent_over_hybrid_vsock_after_boot(tmp_path: Path, guest: LocalAgentGuest) -> None:
    """The host's CONNECT waits while the guest boots, then commands and file calls run through the agent."""
    relay = VsockRelay(str(tmp_path / "v.sock"), guest)
    try:
        started = time.monotonic()
        reader, writer = await connect(relay.uds_path, 1024, timeout_s=10, retry_interval_s=0.02)
        assert time.monotonic() - started >= 0.4
        assert (relay.dropped, relay.refused) == (0, 0), "one request, held until the guest's driver was up"
        conn = GuestConnection(reader, writer, label="local guest")
        hello = await conn.wait_ready(10)
        assert hello["version"] == agent.PROTOCOL_VERSION
        frames = [f async for f in conn.exec(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], cwd=str(tmp_path),
                                             env={}, timeout_s=10)]  # fmt: skip
        assert [(h["ev"], h.get("fd"), p) for h, p in frames[:-1]] in (
            [("out", 1, b"out\n"), ("out", 2, b"err\n")],
            [("out", 2, b"err\n"), ("out", 1, b"out\n")],
        )
        assert frames[-1][0]["code"] == 3
        target = str(tmp_path / "sub" / "file.bin")
        assert await conn.write(target, bytes(range(256)) * 100, mode=0o600) == 25600
        chunks = [c async for c in await conn.open_read(target)]
        assert b"".join(chunks) == bytes(range(256)) * 100
        assert (await conn.call("stat", path=target))["mode"] == 0o600
        await conn.aclose()
    finally:
        relay.close()
    assert not (tmp_path / "v.sock").exists()


async def test_two_connections_get_two_agents(tmp_path: Path) -> None:
    """Each host connection gets its own agent process, as the VM's init does."""
    guest = LocalAgentGuest(boot_s=0)
    relay = VsockRelay(str(tmp_path / "v.sock"), guest)
    try:
        conns = []
        for _ in range(2):
            reader, writer = await connect(relay.uds_path, 1024, timeout_s=10)
            conns.append(GuestConnection(reader, writer, label="local guest"))
        pids = {(await c.wait_ready(10))["pid"] for c in conns}
        assert len(pids) == 2
        for c in conns:
            await c.aclose()
    finally:
        relay.close()
        guest.cleanup()
