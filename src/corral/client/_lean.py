"""A lean HTTP/1.1 client: one keep-alive connection, h11 for the protocol, nothing else.

httpx's async client spends about 2 ms of client-side CPU per request on these machines (its connection pool and
anyio plumbing), as much as the API itself takes for a tool call. ``corral mcp`` sends its tool calls through this
client when the server is plain ``http://`` (a proxy, TLS and the rest stay with httpx), and the benchmarks time the
API through it so that httpx's cost is not charged to the server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import h11

__all__ = ["LeanClient", "LeanResponse"]

READ_SIZE = 256 * 1024


class _StaleConnection(ConnectionError):
    """The connection was closed before any byte of the response arrived."""


@dataclass(frozen=True, slots=True)
class LeanResponse:
    """Status, headers and the whole body."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


class LeanClient:
    """Sequential requests over one keep-alive connection to ``host:port`` (reconnects when the server closes)."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host = host
        self.port = port
        self.headers = [("Host", f"{host}:{port}"), *headers.items()]
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._conn = h11.Connection(h11.CLIENT)
        self._lock = asyncio.Lock()
        self._received = False

    async def aclose(self) -> None:
        """Close the connection."""
        if self._writer is not None:
            self._writer.close()
            self._reader = self._writer = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json_body: Any = None,
        content: bytes = b"",
    ) -> LeanResponse:
        """Send one request and read the whole response."""
        if json_body is not None:
            content = json.dumps(json_body).encode()
        target = path + ("?" + urlencode(params) if params else "")
        headers = [*self.headers, ("Content-Length", str(len(content)))]
        if json_body is not None:
            headers.append(("Content-Type", "application/json"))
        events: list[h11.Event] = [h11.Request(method=method, target=target, headers=headers)]
        if content:
            events.append(h11.Data(data=content))
        events.append(h11.EndOfMessage())
        async with self._lock:
            reused = not self._needs_connect()
            if not reused:
                await self._connect()
            try:
                return await self._exchange(events)
            except _StaleConnection:
                # The server closed the idle keep-alive connection (uvicorn does after 5 s) before reading the
                # request: nothing was processed, so sending it again on a new connection is safe.
                if not reused:
                    raise
            await self._connect()
            return await self._exchange(events)

    def _needs_connect(self) -> bool:
        return (
            self._writer is None
            or self._reader is None
            or self._reader.at_eof()
            or self._conn.our_state is not h11.IDLE
        )

    async def _exchange(self, events: list[h11.Event]) -> LeanResponse:
        """Write one request and read its response. Raises _StaleConnection when the connection turned out dead
        before any byte of a response arrived."""
        assert self._writer is not None
        self._received = False
        try:
            for event in events:
                self._writer.write(self._conn.send(event) or b"")
            await self._writer.drain()
            response = await self._read_response()
        except (ConnectionError, h11.RemoteProtocolError) as exc:
            await self.aclose()
            if not self._received:
                raise _StaleConnection(str(exc)) from exc
            raise
        if self._conn.our_state is h11.DONE and self._conn.their_state is h11.DONE:
            self._conn.start_next_cycle()
        else:
            await self.aclose()
        return response

    async def _read_response(self) -> LeanResponse:
        assert self._reader is not None
        status, chunks = 0, []
        headers: tuple[tuple[bytes, bytes], ...] = ()
        while True:
            event = self._conn.next_event()
            if event is h11.NEED_DATA:
                data = await self._reader.read(READ_SIZE)
                self._received = self._received or bool(data)
                self._conn.receive_data(data)
            elif isinstance(event, h11.Response):
                status, headers = event.status_code, tuple(event.headers)
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return LeanResponse(status, b"".join(chunks), headers)
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError(f"{self.host}:{self.port} closed the connection mid-response")

    async def _connect(self) -> None:
        await self.aclose()
        self._conn = h11.Connection(h11.CLIENT)
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
