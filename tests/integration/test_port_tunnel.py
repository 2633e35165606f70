"""Ports of isolated Docker and gVisor workspaces, reached through the guest agent's tunnel: the provider's
``open_port`` connects to the workspace's own loopback (no network exists), relays bytes both ways with half-close,
and says clearly when nothing listens or the port is out of range."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from corral.errors import InvalidRequestError
from corral.providers._docker_engine import DockerEngine
from corral.providers.agent_backed import AgentPortStream
from corral.providers.base import ExecRequest, PortTunnel, WorkspaceSpec
from corral.providers.docker import DockerProvider
from corral.providers.gvisor import GVisorProvider
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0
# Listens on the loopback only (an isolated workspace has nothing else), then says so in a file; reads until the
# client's end of stream, then answers how many bytes it read and closes.
COUNTING_SERVER = b"""
import socket
server = socket.create_server(("127.0.0.1", 4000))
open("/tmp/count.ready", "w").close()
while True:
    conn, _ = server.accept()
    seen = 0
    while data := conn.recv(65536):
        seen += len(data)
    conn.sendall(f"n={seen}".encode())
    conn.close()
"""


@pytest.fixture(params=["gvisor", "docker"])
async def provider(request: pytest.FixtureRequest, docker_engine: DockerEngine) -> AsyncIterator[DockerProvider]:
    """An isolated-workspace-capable provider: gVisor (runsc) or plain Docker (runc)."""
    engine = DockerEngine(docker_engine.socket_path)
    made = GVisorProvider(engine) if request.param == "gvisor" else DockerProvider(engine)
    yield made
    for workspace_id in await made.list_workspaces():
        if workspace_id.startswith("t"):
            await made.destroy(workspace_id)
    await made.aclose()


async def _read_all(stream: AgentPortStream) -> bytes:
    out = bytearray()
    while data := await stream.read():
        out += data
    return bytes(out)


async def test_an_isolated_workspaces_loopback_server_is_reached_through_the_agent(provider: DockerProvider) -> None:
    """With no network at all, open_port reaches a server on the workspace's 127.0.0.1: 8 MiB go in, the server sees
    end of stream after write_eof, and its answer comes back; a port nobody listens on is ConnectionRefusedError and
    a port out of range InvalidRequestError."""
    assert isinstance(provider, PortTunnel)
    spec = WorkspaceSpec(id=f"t{uuid.uuid4().hex[:15]}", image=BASE_IMAGE, network="isolated")
    await provider.create(spec)
    await provider.write_file(spec.id, "/tmp/count.py", COUNTING_SERVER)
    # The agent ends an exec's process group with it: the server leaves it with setsid, and the exec waits until
    # it listens (else the group could be killed before setsid ran).
    started = await provider.exec(
        spec.id,
        ExecRequest(
            "setsid python3 /tmp/count.py >/tmp/count.log 2>&1 < /dev/null & "
            "while [ ! -e /tmp/count.ready ]; do sleep 0.01; done",
            timeout_s=DEADLINE_S,
        ),
    )
    assert started.exit_code == 0

    with pytest.raises(ConnectionRefusedError, match="nothing listens on port 4001"):
        await provider.open_port(spec.id, 4001)
    for bad in (0, 65536):
        with pytest.raises(InvalidRequestError, match="port must be a number from 1 to 65535"):
            await provider.open_port(spec.id, bad)

    stream = await provider.open_port(spec.id, 4000)
    try:
        piece = b"p" * (1024 * 1024)
        for _ in range(8):
            await stream.write(piece)
        await stream.write_eof()
        assert await _read_all(stream) == f"n={8 * len(piece)}".encode()
    finally:
        await stream.aclose()
    # The workspace's commands still run: the tunnel held one worker, and gave it back.
    assert (await provider.exec(spec.id, ExecRequest("echo ok"))).stdout == b"ok\n"
