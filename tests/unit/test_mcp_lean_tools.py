"""``corral mcp``'s lean tool calls (:class:`corral.mcp_server.LeanTools`) against a real HTTP/1.1 server on
loopback: one keep-alive connection for many calls, answers and errors read as the SDK reads them, a connection the
server closed while idle replaced, and clear errors for a server that is down or too slow."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import h11
import pytest

import corral.client._api as api
from corral.client._errors import CorralConnectionError, CorralTimeoutError
from corral.errors import ToolNotAllowedError
from corral.mcp_server import LeanTools

pytestmark = pytest.mark.unit

Handler = Callable[[str, dict[str, str], bytes], tuple[int, bytes]]


@dataclass
class Server:
    """A loopback HTTP/1.1 server answering with ``handler``; it counts connections and can drop idle ones."""

    handler: Handler
    connections: int = 0
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)
    close_after_each: bool = False
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                target, headers, body = "", {}, b""
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        data = await reader.read(65536)
                        if not data:
                            return
                        conn.receive_data(data)
                    elif isinstance(event, h11.Request):
                        target = event.target.decode()
                        headers = {k.decode(): v.decode() for k, v in event.headers}
                    elif isinstance(event, h11.Data):
                        body += bytes(event.data)
                    elif isinstance(event, h11.EndOfMessage):
                        break
                self.requests.append((target, headers, body))
                status, payload = self.handler(target, headers, body)
                head = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
                writer.write(conn.send(h11.Response(status_code=status, headers=head)) or b"")
                writer.write(conn.send(h11.Data(data=payload)) or b"")
                writer.write(conn.send(h11.EndOfMessage()) or b"")
                await writer.drain()
                if self.close_after_each:
                    return
                conn.start_next_cycle()
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    def answer(target: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if target.endswith("/tools/write"):
            error = {"code": "tool_not_allowed", "message": "Tool 'write' is not enabled for this agent type"}
            return 403, json.dumps({"error": error}).encode()
        return 200, json.dumps({"tool": target.rsplit("/", 1)[1], "args": json.loads(body)}).encode()

    state = Server(answer)
    listener = await asyncio.start_server(state.serve, "127.0.0.1", 0)
    state.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield state


async def test_calls_share_one_connection_and_carry_the_token_and_path(server: Server) -> None:
    tools = LeanTools(f"http://127.0.0.1:{server.port}/prefix/", "secret", "s1")
    try:
        for i in range(3):
            assert await tools.call("bash", {"command": f"echo {i}"}) == {
                "tool": "bash",
                "args": {"command": f"echo {i}"},
            }
    finally:
        await tools.aclose()
    assert server.connections == 1
    target, headers, _ = server.requests[0]
    assert target == "/prefix/api/v1/agent/sessions/s1/tools/bash"
    assert headers["authorization"] == "Bearer secret"


async def test_errors_are_the_sdks_typed_errors(server: Server) -> None:
    tools = LeanTools(f"http://127.0.0.1:{server.port}", None, "s1")
    try:
        with pytest.raises(ToolNotAllowedError, match="Tool 'write' is not enabled for this agent type"):
            await tools.call("write", {"path": "a", "content": "b"})
        assert (await tools.call("read", {"path": "a"}))["tool"] == "read"  # the connection is still usable
    finally:
        await tools.aclose()
    assert "authorization" not in server.requests[0][1]


async def test_a_connection_the_server_closed_is_replaced(server: Server) -> None:
    server.close_after_each = True
    tools = LeanTools(f"http://127.0.0.1:{server.port}", "t", "s1")
    try:
        for _ in range(3):
            await tools.call("bash", {"command": "true"})
    finally:
        await tools.aclose()
    assert server.connections == 3


async def test_a_server_that_is_down_or_silent_is_a_clear_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens once it is closed
    tools = LeanTools(f"http://127.0.0.1:{port}", "t", "s1")
    with pytest.raises(
        CorralConnectionError, match=f"cannot reach Corral at http://127.0.0.1:{port}: connection refused"
    ):
        await tools.call("bash", {"command": "true"})

    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await release.wait()
        writer.close()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    tools = LeanTools(f"http://127.0.0.1:{port}", "t", "s1")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "DEFAULT_TIMEOUT_S", 0.2)  # the floor of a tool call's wait
        with pytest.raises(CorralTimeoutError, match="no answer from Corral"):
            await tools.call("bash", {"command": "true", "timeout_s": 0.01})
    await tools.aclose()
    release.set()
    listener.close()
    await listener.wait_closed()


def test_only_plain_http_servers_are_served() -> None:
    assert LeanTools.serves("http://127.0.0.1:8000")
    assert not LeanTools.serves("https://corral.example")
    with pytest.raises(ValueError, match="plain http://"):
        LeanTools("https://corral.example", "t", "s1")
