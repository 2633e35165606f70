"""Host side of the guest agent protocol (see :mod:`corral.guest.agent` for the frames).

A :class:`GuestConnection` wraps one byte stream to one agent (a hijacked ``docker exec`` socket, a Firecracker vsock
connection, a local pipe) and multiplexes many concurrent requests over it. It raises Corral's typed errors for
file problems and :class:`GuestConnectionLost` when the stream ends; providers decide what a lost connection means
for their workspace (stopped, destroyed, or just an agent that must be restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import struct
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator
from typing import Any, Protocol

from corral.errors import FileOperationError, InvalidRequestError, ResourceLimitError, WorkspaceFileNotFoundError
from corral.guest.agent import encode_frame

__all__ = ["GuestConnection", "GuestConnectionLost", "Writer"]

log = logging.getLogger(__name__)
_LEN = struct.Struct(">I")
_WRITE_CHUNK = 256 * 1024


class GuestConnectionLost(ConnectionError):
    """The stream to the agent ended; every request in flight fails with this."""


class Writer(Protocol):
    """The part of :class:`asyncio.StreamWriter` the connection uses."""

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...


Frame = tuple[dict[str, Any], bytes]


class GuestConnection:
    """Many concurrent requests over one agent stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: Writer, *, label: str) -> None:
        self._reader = reader
        self._writer = writer
        self._label = label
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Queue[Frame | None]] = {}
        self._closed = False
        self._hello: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read_loop(), name=f"guest-reader-{label}")

    @property
    def closed(self) -> bool:
        """True once the stream has ended or :meth:`aclose` was called."""
        return self._closed

    async def wait_ready(self, timeout: float) -> dict[str, Any]:
        """Wait for the agent's hello frame (it sends one as soon as it starts)."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._hello), timeout)
        except TimeoutError as exc:
            raise GuestConnectionLost(f"agent in {self._label} did not start within {timeout:g} s") from exc

    async def aclose(self) -> None:
        """Close the stream; the agent sees end of input, kills its commands and exits."""
        self._closed = True
        with contextlib.suppress(Exception):
            self._writer.close()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._fail_pending()

    # --- plumbing ---------------------------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            while True:
                head = await self._reader.readexactly(_LEN.size)
                header: dict[str, Any] = json.loads(await self._reader.readexactly(_LEN.unpack(head)[0]))
                payload = await self._reader.readexactly(_LEN.unpack(await self._reader.readexactly(_LEN.size))[0])
                rid = header.get("id", 0)
                if rid == 0 and header.get("ev") == "hello":
                    if not self._hello.done():
                        self._hello.set_result(header)
                    continue
                queue = self._pending.get(rid)
                if queue is not None:
                    queue.put_nowait((header, payload))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError) as exc:
            log.debug("agent stream of %s ended: %s", self._label, exc)
        finally:
            self._closed = True
            self._fail_pending()

    def _fail_pending(self) -> None:
        if not self._hello.done():
            self._hello.set_exception(GuestConnectionLost(f"agent in {self._label} exited before it was ready"))
            self._hello.exception()  # mark retrieved: nobody may be waiting
        for queue in self._pending.values():
            queue.put_nowait(None)

    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        if self._closed:
            raise GuestConnectionLost(f"connection to the agent in {self._label} is closed")
        self._writer.write(encode_frame(header, payload))
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise GuestConnectionLost(f"connection to the agent in {self._label} broke: {exc}") from exc

    def _open(self) -> tuple[int, asyncio.Queue[Frame | None]]:
        rid = next(self._ids)
        queue: asyncio.Queue[Frame | None] = asyncio.Queue()
        self._pending[rid] = queue
        return rid, queue

    async def _next(self, queue: asyncio.Queue[Frame | None]) -> Frame:
        frame = await queue.get()
        if frame is None:
            raise GuestConnectionLost(f"connection to the agent in {self._label} was lost")
        header = frame[0]
        if header.get("ev") == "error":
            raise _agent_error(header)
        return frame

    # --- requests ---------------------------------------------------------------------------------------------------

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Send one request and return its ``result`` object."""
        rid, queue = self._open()
        try:
            await self._send({"id": rid, "op": op, **args})
            header, _ = await self._next(queue)
            result: dict[str, Any] = header.get("result", {})
            return result
        finally:
            self._pending.pop(rid, None)

    async def exec(
        self, argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float | None
    ) -> AsyncGenerator[Frame]:
        """Start a command; yields ``out`` frames and finally the ``exit`` frame. Closing early kills it."""
        rid, queue = self._open()
        finished = False
        try:
            await self._send({"id": rid, "op": "exec", "argv": argv, "cwd": cwd, "env": env, "timeout_s": timeout_s})
            while True:
                frame = await self._next(queue)
                if frame[0].get("ev") == "exit":
                    finished = True
                yield frame
                if finished:
                    return
        finally:
            self._pending.pop(rid, None)
            if not finished and not self._closed:
                with contextlib.suppress(Exception):
                    await self._send({"id": next(self._ids), "op": "kill", "target": rid})

    async def open_read(self, path: str) -> AsyncIterator[bytes]:
        """Open ``path`` for reading: path errors are raised now; returns the chunk iterator."""
        rid, queue = self._open()
        try:
            await self._send({"id": rid, "op": "read", "path": path})
            await self._next(queue)  # "open", or an error
        except BaseException:
            self._pending.pop(rid, None)
            raise
        return self._chunks(rid, queue)

    async def _chunks(self, rid: int, queue: asyncio.Queue[Frame | None]) -> AsyncIterator[bytes]:
        try:
            while True:
                header, payload = await self._next(queue)
                if header.get("ev") == "end":
                    return
                yield payload
        finally:
            self._pending.pop(rid, None)

    async def write(self, path: str, data: bytes | AsyncIterable[bytes], *, mode: int | None) -> int:
        """Stream ``data`` into ``path`` (parents created); returns the bytes written."""
        rid, queue = self._open()
        try:
            await self._send({"id": rid, "op": "write", "path": path, "mode": mode})
            await self._next(queue)  # "ready", or an error such as "is a directory"
            if isinstance(data, bytes | bytearray | memoryview):
                view = memoryview(data)
                for start in range(0, len(view), _WRITE_CHUNK):
                    await self._send({"id": rid, "op": "data"}, bytes(view[start : start + _WRITE_CHUNK]))
                    self._raise_early_error(queue)
            else:
                async for chunk in data:
                    if chunk:
                        await self._send({"id": rid, "op": "data"}, bytes(chunk))
                        self._raise_early_error(queue)
            await self._send({"id": rid, "op": "end"})
            header, _ = await self._next(queue)
            return int(header["result"]["bytes_written"])
        finally:
            self._pending.pop(rid, None)

    @staticmethod
    def _raise_early_error(queue: asyncio.Queue[Frame | None]) -> None:
        """A write that failed mid-stream (disk full) answers at once; stop sending instead of streaming on."""
        if not queue.empty():
            frame = queue.get_nowait()
            if frame is None:
                raise GuestConnectionLost("connection to the agent was lost during a write")
            if frame[0].get("ev") == "error":
                raise _agent_error(frame[0])


def _agent_error(header: dict[str, Any]) -> Exception:
    kind, message = header.get("kind", "os"), str(header.get("message", "operation failed"))
    if kind == "not_found":
        return WorkspaceFileNotFoundError(message)
    if kind == "invalid":
        return InvalidRequestError(message)
    if kind == "no_space":
        return ResourceLimitError(f"workspace disk is full: {message}")
    return FileOperationError(message, details={"kind": kind})
