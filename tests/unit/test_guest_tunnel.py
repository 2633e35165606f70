"""The agent's ``tunnel`` operation, with the agent run on the host against servers this test starts on loopback:
bytes both ways, half-close, flow control in both directions, a clear refusal when nothing listens, and the host
side's checks of what the agent sends about a tunnel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import corral.guest.agent as agent_module
import corral.guest.client as client_module
from corral.errors import FileOperationError, InvalidRequestError, TooManyRequestsError
from corral.guest.agent import CHUNK, FRAME_COST, TUNNEL_WINDOW, WINDOW, encode_frame
from corral.guest.client import GuestConnection, GuestConnectionLost, GuestProtocolError, GuestTunnel
from corral.providers.agent_backed import MAX_TUNNELS_PER_WORKSPACE, AgentBackedProvider, TunnelSlots

pytestmark = [pytest.mark.unit]

DEADLINE_S = 10.0
MiB = 1024 * 1024


@pytest.fixture
async def conn() -> AsyncIterator[GuestConnection]:
    """The real agent, run on the host (its loopback is the test's), over pipes."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_SPAWNER_SOCKET"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, agent_module.__file__, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    connection = GuestConnection(proc.stdout, proc.stdin, label="host agent")
    await connection.wait_ready(DEADLINE_S)
    try:
        yield connection
    finally:
        await connection.aclose()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def _server(handler: Handler) -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 running ``handler`` per connection; yields its port."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def _read_all(tunnel: GuestTunnel) -> bytes:
    out = bytearray()
    while data := await asyncio.wait_for(tunnel.read(), DEADLINE_S):
        out += data
    return bytes(out)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {DEADLINE_S} s"
        await asyncio.sleep(0.01)


async def test_bytes_flow_both_ways_and_half_close_reaches_the_server(conn: GuestConnection) -> None:
    """The server gets what the host writes, sees end of stream after write_eof, and its answer written after that
    (then its close) reaches the host in full, ending with b""."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = await reader.read()  # until the host's eof
        writer.write(b"got " + str(len(got)).encode() + b": " + got[:5])
        await writer.drain()
        writer.close()

    async with _server(answer) as port:
        tunnel = await conn.open_tunnel(port)
        try:
            await tunnel.write(b"hello")
            await tunnel.write(b" world" * 1000)
            await tunnel.write_eof()
            assert await _read_all(tunnel) == b"got 6005: hello"
            assert await tunnel.read() == b""  # stays at end of stream
        finally:
            await tunnel.aclose()
    assert (await conn.call("ping"))["version"] == agent_module.PROTOCOL_VERSION  # the agent serves on


async def test_large_streams_arrive_whole_in_both_directions(conn: GuestConnection) -> None:
    """16 MiB up and 16 MiB down at once through one tunnel arrive byte for byte (the windows refill as consumed)."""
    size = 16 * MiB
    pattern = bytes(range(256)) * (MiB // 256)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        writer.close()

    async with _server(echo) as port:
        tunnel = await conn.open_tunnel(port)
        try:

            async def upload() -> None:
                for _ in range(size // MiB):
                    await tunnel.write(pattern)
                await tunnel.write_eof()

            sending = asyncio.create_task(upload())
            received = await _read_all(tunnel)
            await sending
        finally:
            await tunnel.aclose()
    assert len(received) == size
    assert received == pattern * (size // MiB)


async def test_a_server_that_does_not_read_stalls_the_writer_not_memory(conn: GuestConnection) -> None:
    """While the server reads nothing, the host's writer runs out of credit and waits (the agent holds at most a
    window); once the server reads, every byte arrives and the writer finishes."""
    size = 32 * MiB
    start_reading = asyncio.Event()
    received = 0

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal received
        await start_reading.wait()
        while data := await reader.read(CHUNK):
            received += len(data)
        writer.close()

    async with _server(slow) as port:
        tunnel = await conn.open_tunnel(port)
        try:

            async def upload() -> None:
                piece = b"z" * MiB
                for _ in range(size // MiB):
                    await tunnel.write(piece)
                await tunnel.write_eof()

            sending = asyncio.create_task(upload())
            request = tunnel._request
            await _until(lambda: request.send_credit == 0, "the writer running out of credit")
            assert not sending.done()  # blocked on credit: 32 MiB do not fit a window plus the socket's buffers
            start_reading.set()
            await asyncio.wait_for(sending, DEADLINE_S * 3)
            await _until(lambda: received == size, f"the server reading all {size} bytes")
        finally:
            await tunnel.aclose()


async def test_nothing_listening_is_refused_with_a_clear_error(conn: GuestConnection) -> None:
    """A port with no listener (bound here, never listening) raises ConnectionRefusedError naming the port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        with pytest.raises(ConnectionRefusedError, match=f"nothing listens on port {port}"):
            await conn.open_tunnel(port)
    assert (await conn.call("ping"))["version"] == agent_module.PROTOCOL_VERSION


@pytest.mark.parametrize("port", [0, 65536, -1, "80", True, None])
async def test_a_port_outside_1_to_65535_is_invalid(conn: GuestConnection, port: object) -> None:
    """The agent checks the port itself (the request may come from anything speaking the protocol)."""
    with pytest.raises(InvalidRequestError, match="port must be a number from 1 to 65535"):
        await conn.open_tunnel(port)  # type: ignore[arg-type]


async def test_closing_the_tunnel_closes_the_servers_connection(conn: GuestConnection) -> None:
    """aclose (a kill) makes the agent close its socket: the server reads end of stream."""
    closed = asyncio.Event()

    async def wait_for_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        closed.set()
        writer.close()

    async with _server(wait_for_close) as port:
        tunnel = await conn.open_tunnel(port)
        await tunnel.write(b"x")
        await tunnel.aclose()
        await asyncio.wait_for(closed.wait(), DEADLINE_S)


async def test_a_host_that_ignores_credit_breaks_only_its_tunnel(conn: GuestConnection) -> None:
    """Data past the window the agent granted fails that tunnel with an error (the agent's memory stays bounded);
    the agent and its other requests carry on."""
    release = asyncio.Event()

    async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    async with _server(stuck) as port:
        tunnel = await conn.open_tunnel(port)
        try:
            chunk = b"q" * CHUNK
            with contextlib.suppress(GuestConnectionLost):
                for _ in range(WINDOW // CHUNK + 64):  # far past the window and the socket's buffers
                    await conn._send({"id": tunnel.target, "op": "data"}, chunk)
            with pytest.raises(InvalidRequestError, match=f"more than {WINDOW} bytes"):
                await _read_all(tunnel)
        finally:
            release.set()
            await tunnel.aclose()
    assert (await conn.call("ping"))["version"] == agent_module.PROTOCOL_VERSION


async def test_tunnels_beyond_the_cap_are_refused_and_commands_still_run(conn: GuestConnection) -> None:
    """At most MAX_TUNNELS connections are open at once (each holds a worker thread); one more is refused as busy,
    commands still run meanwhile, and closing one makes room again."""
    release = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    async with _server(hold) as port:
        tunnels = [await conn.open_tunnel(port) for _ in range(agent_module.MAX_TUNNELS)]
        try:
            with pytest.raises(TooManyRequestsError, match=f"{agent_module.MAX_TUNNELS} connections to ports"):
                await conn.open_tunnel(port)
            frames = [frame async for frame in conn.exec(["echo", "hi"], cwd="/", env={}, timeout_s=10)]
            assert frames[-1][0]["code"] == 0
            await tunnels.pop().aclose()

            async def reopen() -> GuestTunnel:
                deadline = time.monotonic() + DEADLINE_S
                while True:  # the agent forgets the closed tunnel once its thread has seen the kill
                    try:
                        return await conn.open_tunnel(port)
                    except TooManyRequestsError:
                        assert time.monotonic() < deadline, "a closed tunnel never made room"
                        await asyncio.sleep(0.01)

            tunnels.append(await reopen())
        finally:
            release.set()
            for tunnel in tunnels:
                await tunnel.aclose()


# --- the host side's checks, against a scripted agent --------------------------------------------------------------


class _Sink:
    def write(self, data: bytes) -> None:
        del data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


async def _scripted() -> tuple[GuestConnection, asyncio.StreamReader, list[str]]:
    reader = asyncio.StreamReader()
    reader.feed_data(encode_frame({"id": 0, "ev": "hello", "version": 2, "features": ["tunnel"]}))
    violations: list[str] = []
    conn = GuestConnection(reader, _Sink(), label="test", on_violation=violations.append)
    await conn.wait_ready(1)
    return conn, reader, violations


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        ({"id": 1, "ev": "credit", "bytes": WINDOW + 1}, "a credit frame of"),
        ({"id": 1, "ev": "credit", "bytes": -5}, "a credit frame of"),
        ({"id": 1, "ev": "credit", "bytes": "lots"}, "a credit frame of"),
        ({"id": 1, "ev": "credit"}, "a credit frame of"),
    ],
    ids=["past-window", "negative", "text", "missing"],
)
async def test_a_tunnels_credit_frames_are_checked(frame: dict[str, object], reason: str) -> None:
    """Credit the agent grants must be a positive count within one window; anything else ends the connection."""
    conn, reader, violations = await _scripted()
    opening = asyncio.create_task(conn.open_tunnel(80))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "open"}))
    tunnel = await opening
    reader.feed_data(encode_frame(frame))
    with pytest.raises(GuestProtocolError, match=reason):
        await asyncio.wait_for(tunnel.read(), 2)
    assert conn.closed and reason in violations[0]
    await conn.aclose()


async def test_credit_for_a_request_that_sends_nothing_is_a_violation() -> None:
    """Only a tunnel takes credit from the agent; credit on a read is a protocol error."""
    conn, reader, violations = await _scripted()
    opening = asyncio.create_task(conn.open_read("/x"))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "open", "size": 0}))
    await opening
    reader.feed_data(encode_frame({"id": 1, "ev": "credit", "bytes": 10}))
    await _until(lambda: conn.closed, "the connection closing")
    assert "a credit frame for a request that sends no data" in violations[0]
    await conn.aclose()


async def test_a_writer_waiting_for_credit_wakes_when_the_tunnel_fails() -> None:
    """A writer out of credit does not wait forever once the agent reports the tunnel failed: it gets
    BrokenPipeError, and the reader gets the agent's error."""
    conn, reader, _ = await _scripted()
    opening = asyncio.create_task(conn.open_tunnel(80))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "open"}))
    tunnel = await opening
    writing = asyncio.create_task(tunnel.write(b"w" * (WINDOW + 1)))
    await _until(lambda: tunnel._request.send_credit == 0, "the writer running out of credit")
    reader.feed_data(encode_frame({"id": 1, "ev": "error", "kind": "os", "message": "reset by peer"}))
    with pytest.raises(BrokenPipeError):
        await asyncio.wait_for(writing, 2)
    with pytest.raises(FileOperationError, match="reset by peer"):
        await tunnel.read()
    await conn.aclose()


async def test_an_unknown_tunnel_frame_breaks_the_connection() -> None:
    """A frame a tunnel never gets (here an exec's exit) is a protocol violation: reported, and the connection
    closed."""
    conn, reader, violations = await _scripted()
    opening = asyncio.create_task(conn.open_tunnel(80))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "open"}))
    tunnel = await opening
    reader.feed_data(encode_frame({"id": 1, "ev": "exit", "code": 0}))
    with pytest.raises(GuestProtocolError, match="a tunnel frame 'exit'"):
        await tunnel.read()
    assert conn.closed
    assert violations == ["the agent sent a tunnel frame 'exit'"]


# --- what a tunnel may hold on the host, how long it may idle, and the host's own caps -----------------------------


class _ScriptedAgent:
    """A hostile agent: the connection's writer, which reads the host's frames and answers every ``tunnel`` with
    ``open`` (it never says ``busy``, whatever the count; port 1 is refused); it records every frame the host sent."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.sent: list[dict[str, object]] = []

    def write(self, data: bytes) -> None:
        head_len = int.from_bytes(data[:4], "big")
        header = json.loads(data[4 : 4 + head_len])
        self.sent.append(header)
        if header.get("op") == "tunnel" and header.get("port") == 1:
            self.reader.feed_data(encode_frame({"id": header["id"], "ev": "error", "kind": "refused"}))
        elif header.get("op") == "tunnel":
            self.reader.feed_data(encode_frame({"id": header["id"], "ev": "open"}))

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None

    def ops(self, op: str) -> list[dict[str, object]]:
        return [header for header in self.sent if header.get("op") == op]


async def _hostile() -> tuple[GuestConnection, _ScriptedAgent, list[str]]:
    reader = asyncio.StreamReader()
    reader.feed_data(encode_frame({"id": 0, "ev": "hello", "version": 2, "features": ["tunnel", "tunnel_window"]}))
    agent = _ScriptedAgent(reader)
    violations: list[str] = []
    conn = GuestConnection(reader, agent, label="hostile", on_violation=violations.append)
    await conn.wait_ready(1)
    return conn, agent, violations


class _HostileProvider(AgentBackedProvider):
    """The provider half that caps tunnels, over one scripted agent per workspace."""

    name = "hostile"

    def __init__(self, slots: TunnelSlots) -> None:
        self.tunnel_slots = slots  # type: ignore[misc]  # per instance here, so tests do not share the count
        self.agents: dict[str, tuple[GuestConnection, _ScriptedAgent]] = {}

    async def _agent(self, workspace_id: str) -> GuestConnection:
        if workspace_id not in self.agents:
            conn, agent, _ = await _hostile()
            self.agents[workspace_id] = (conn, agent)
        return self.agents[workspace_id][0]

    async def _require_running(self, workspace_id: str) -> None:
        del workspace_id

    async def aclose(self) -> None:
        for conn, _ in self.agents.values():
            await conn.aclose()


@pytest.fixture
async def hostile_provider() -> AsyncIterator[_HostileProvider]:
    """A provider whose agents ignore every cap, with the real per-workspace cap and a global cap of 40."""
    provider = _HostileProvider(TunnelSlots(MAX_TUNNELS_PER_WORKSPACE, 40))
    try:
        yield provider
    finally:
        await provider.aclose()


async def test_the_host_caps_tunnels_per_workspace_whatever_the_agent_answers(
    hostile_provider: _HostileProvider,
) -> None:
    """An agent that opens every tunnel asked for still gets at most MAX_TUNNELS_PER_WORKSPACE: the next is refused
    with 429 before the host asks the agent, and closing one makes room again at once."""
    streams = [await hostile_provider.open_port("w1", 80) for _ in range(MAX_TUNNELS_PER_WORKSPACE)]
    try:
        with pytest.raises(TooManyRequestsError, match=f"has {MAX_TUNNELS_PER_WORKSPACE} connections to its ports"):
            await hostile_provider.open_port("w1", 80)
        agent = hostile_provider.agents["w1"][1]
        assert len(agent.ops("tunnel")) == MAX_TUNNELS_PER_WORKSPACE  # the refused one never reached the agent
        await streams.pop().aclose()
        streams.append(await hostile_provider.open_port("w1", 80))
        assert hostile_provider.tunnel_slots.open == {"w1": MAX_TUNNELS_PER_WORKSPACE}
    finally:
        for stream in streams:
            await stream.aclose()
    assert hostile_provider.tunnel_slots.in_use == 0


async def test_the_host_caps_tunnels_into_all_workspaces(hostile_provider: _HostileProvider) -> None:
    """Past the global cap (40 here) a tunnel into any workspace is refused with 429, though each workspace is under
    its own cap; a tunnel whose opening fails gives its slot back."""
    streams = [await hostile_provider.open_port("w1", 80) for _ in range(30)]
    streams += [await hostile_provider.open_port("w2", 80) for _ in range(10)]
    try:
        with pytest.raises(TooManyRequestsError, match="the server has 40 connections to ports"):
            await hostile_provider.open_port("w3", 80)
        with pytest.raises(InvalidRequestError):
            await hostile_provider.open_port("w3", 0)
        await streams.pop().aclose()
        for _ in range(3):  # more failures than free slots: each gives its slot back
            with pytest.raises(ConnectionRefusedError):
                await hostile_provider.open_port("w3", 1)
        assert hostile_provider.tunnel_slots.in_use == 39
        streams.append(await hostile_provider.open_port("w3", 80))
    finally:
        for stream in streams:
            await stream.aclose()
    assert hostile_provider.tunnel_slots.in_use == 0


async def test_a_tunnel_holds_at_most_its_window_on_the_host_with_a_frame_in_hand() -> None:
    """An agent may have TUNNEL_WINDOW bytes of a tunnel on the host, counting the frame its reader holds: credit
    goes back only when the reader comes back for more, and data past the window ends the connection."""
    conn, agent, violations = await _hostile()
    tunnel = await conn.open_tunnel(80)
    piece = b"d" * (TUNNEL_WINDOW // 2 - FRAME_COST)
    agent.reader.feed_data(encode_frame({"id": tunnel.target, "ev": "data"}, piece))
    agent.reader.feed_data(encode_frame({"id": tunnel.target, "ev": "data"}, piece))
    assert await tunnel.read() == piece
    assert agent.ops("credit") == []  # the first piece is in the reader's hand: not passed on yet
    assert await tunnel.read() == piece
    assert agent.ops("credit") == [{"id": 0, "op": "credit", "target": tunnel.target, "bytes": TUNNEL_WINDOW // 2}]
    # The second piece is still in hand and uncredited: one byte more than the half window just granted is too much.
    agent.reader.feed_data(encode_frame({"id": tunnel.target, "ev": "data"}, piece + b"!"))
    await _until(lambda: conn.closed, "the connection closing")
    assert f"more than {TUNNEL_WINDOW} bytes of unread data" in violations[0]
    await tunnel.aclose()
    await conn.aclose()


async def test_a_slow_reader_holds_at_most_one_tunnel_window_from_the_real_agent(conn: GuestConnection) -> None:
    """A server that sends 8 MiB to a reader that takes one piece and stops fills the tunnel's window on the host
    and no more: queued plus in hand stays within TUNNEL_WINDOW, and the rest waits in the sandbox."""
    size = 8 * MiB

    async def flood(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            writer.write(b"f" * size)
            await writer.drain()
        writer.close()

    async with _server(flood) as port:
        tunnel = await conn.open_tunnel(port)
        try:
            first = await tunnel.read()
            assert 0 < len(first) <= agent_module.TUNNEL_CHUNK
            request = tunnel._request

            def held() -> int:
                return request.queued_data + request.consumed

            await _until(lambda: held() > TUNNEL_WINDOW - agent_module.TUNNEL_CHUNK, "the window filling up")
            assert held() <= TUNNEL_WINDOW
            got = len(first)
            while data := await asyncio.wait_for(tunnel.read(), DEADLINE_S):
                got += len(data)
                assert held() <= TUNNEL_WINDOW
            assert got == size
        finally:
            await tunnel.aclose()


async def test_an_idle_tunnel_is_closed_and_gives_its_slot_back(
    conn: GuestConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tunnel that carries nothing either way for TUNNEL_IDLE_S is closed: its reader and writer get
    TimeoutError, on_close runs once, and the server inside sees its connection end."""
    monkeypatch.setattr(client_module, "TUNNEL_IDLE_S", 0.3)
    closed = asyncio.Event()
    released: list[int] = []

    async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        closed.set()
        writer.close()

    async with _server(idle) as port:
        tunnel = await conn.open_tunnel(port, on_close=lambda: released.append(1))
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"carried nothing either way for 0\.3 s"):
            await asyncio.wait_for(tunnel.read(), DEADLINE_S)
        assert time.monotonic() - started >= 0.2  # not at once (the clock starts when the tunnel opens)
        await asyncio.wait_for(closed.wait(), DEADLINE_S)
        with pytest.raises(TimeoutError):
            await tunnel.write(b"late")
        await tunnel.aclose()
        assert released == [1]
    assert (await conn.call("ping"))["version"] == agent_module.PROTOCOL_VERSION


async def test_a_tunnel_with_bytes_flowing_outlives_the_idle_timeout(
    conn: GuestConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bytes either way reset the idle clock: a server that sends a byte every 0.05 s for five idle timeouts is
    read to its end."""
    monkeypatch.setattr(client_module, "TUNNEL_IDLE_S", 0.2)

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(20):
            writer.write(b".")
            await writer.drain()
            await asyncio.sleep(0.05)  # the pace of the stream under test, not a wait for anything
        writer.close()

    async with _server(trickle) as port:
        tunnel = await conn.open_tunnel(port)
        try:
            assert await _read_all(tunnel) == b"." * 20
        finally:
            await tunnel.aclose()


async def test_an_idle_tunnel_frees_its_providers_slot(
    hostile_provider: _HostileProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tunnels a visitor opened and left idle give their slots back by themselves: after the idle timeout a full
    workspace takes new tunnels again, nobody having closed the old ones."""
    monkeypatch.setattr(client_module, "TUNNEL_IDLE_S", 0.1)
    streams = [await hostile_provider.open_port("w1", 80) for _ in range(MAX_TUNNELS_PER_WORKSPACE)]
    await _until(lambda: hostile_provider.tunnel_slots.in_use == 0, "the idle tunnels closing")
    streams.append(await hostile_provider.open_port("w1", 80))
    for stream in streams:
        await stream.aclose()
