"""Host side of the guest agent protocol (see :mod:`corral.guest.agent` for the frames).

A :class:`GuestConnection` wraps one byte stream to one agent (a hijacked ``docker exec`` socket, a Firecracker vsock
connection, a local pipe) and multiplexes many concurrent requests over it. It raises Corral's typed errors for
file problems and :class:`GuestConnectionLost` when the stream ends; providers decide what a lost connection means
for their workspace (stopped, destroyed, or just an agent that must be restarted).

Everything the agent sends is treated as written by an attacker: root inside the workspace can replace or drive the
agent. So the host's memory never depends on what the agent sends:

* a frame's header may hold at most :data:`~corral.guest.agent.MAX_HEADER` bytes and its payload
  :data:`~corral.guest.agent.MAX_PAYLOAD`; the lengths are checked before anything is read or allocated;
* streamed data (exec output, file reads) is flow-controlled: the agent may have at most
  :data:`~corral.guest.agent.WINDOW` bytes in flight per request and sends more only after the host grants credit,
  which it does as its consumer takes data, so a slow HTTP client slows the agent, not the server's memory;
* a streamed frame costs its payload plus :data:`~corral.guest.agent.FRAME_COST` of the window and may have a header
  of at most 256 bytes; any other answer counts against a handful per request; a frame for a request the host
  never made, or already finished, is a violation too (an abandoned request's last frames are tolerated up to a
  window), so a flood of small or unsolicited frames costs nothing either;
* a tunnel's bytes from the agent have a window of their own, :data:`~corral.guest.agent.TUNNEL_WINDOW` (a small
  fraction of the above, since a server holds one per visitor), and its credit is granted only once the consumer
  comes back for more, i.e. after it has passed the previous bytes on: what a tunnel holds on the host, queued or
  in hand, stays within that window however slowly its visitor reads;
* a tunnel's bytes toward the agent are flow-controlled the other way round: the host sends at most
  :data:`~corral.guest.agent.WINDOW` bytes the agent has not granted back with ``credit`` frames (each checked: a
  positive count within one window, for a tunnel only), so a server that does not read slows the client;
* a frame that breaks these rules (too long, not JSON, not an object, data beyond the window) ends the connection
  with :class:`GuestProtocolError`, whose message says what the agent did; every request in flight fails with it;
* every wait for the agent has a deadline (:data:`ANSWER_TIMEOUT_S`, longer for walks of the whole workspace; exec
  output has its command's own deadline), so a stopped agent (``kill -STOP``) costs a request a bounded wait: the
  connection is then closed, and the next call starts a fresh agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import struct
from collections.abc import AsyncGenerator, AsyncIterable, Callable
from typing import Any, NoReturn, Protocol

from corral.errors import (
    FileOperationError,
    InvalidRequestError,
    ResourceLimitError,
    TooManyRequestsError,
    WorkspaceFileNotFoundError,
)
from corral.guest.agent import FRAME_COST, MAX_HEADER, MAX_PAYLOAD, TUNNEL_WINDOW, WINDOW, encode_frame

__all__ = [
    "ByteReader",
    "GuestConnection",
    "GuestConnectionLost",
    "GuestProtocolError",
    "GuestTerminal",
    "GuestTunnel",
    "WatchBatch",
    "Writer",
]

log = logging.getLogger(__name__)
_LEN = struct.Struct(">I")
_WRITE_CHUNK = 256 * 1024
_STREAM_EVENTS = frozenset({"out", "data"})
_MAX_QUEUED_FRAMES = 4
"""Besides streamed data, a request has a couple of frames queued at most (open or ready, then exit, end or result)."""
_MAX_STREAM_HEADER = 256
_MAX_ABANDONED = 4096
ANSWER_TIMEOUT_S = 60.0
"""How long the host waits for any answer of the agent (a stat, the next chunk of a file, a write's acknowledgement)
before it gives the connection up as stuck."""
TUNNEL_IDLE_S = 300.0
"""A tunnel that carries no byte either way for this long is closed (a visitor that stopped reading, or holds an idle
connection, gives its slot back). Long enough for a quiet WebSocket or a long poll; short enough that 32 abandoned
connections do not hold a workspace's ports for good."""


class GuestConnectionLost(ConnectionError):
    """The stream to the agent ended; every request in flight fails with this."""


class GuestProtocolError(GuestConnectionLost):
    """The agent broke the protocol (an oversized or garbage frame, data past its flow-control window).

    The connection is closed; the workspace should be treated as broken: something inside it drives the agent.
    """


class ByteReader(Protocol):
    """The part of :class:`asyncio.StreamReader` the connection uses."""

    async def readexactly(self, n: int) -> bytes: ...


class Writer(Protocol):
    """The part of :class:`asyncio.StreamWriter` the connection uses."""

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...


Frame = tuple[dict[str, Any], bytes]


class _Request:
    """One request in flight: its frames, and the flow-control books of its streamed data."""

    __slots__ = (
        "consumed",
        "credit_ready",
        "deferred_credit",
        "queue",
        "queued_data",
        "queued_frames",
        "send_closed",
        "send_credit",
        "streaming",
        "window",
    )

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Frame | None] = asyncio.Queue()
        self.queued_data = 0  # streamed bytes waiting in the queue: never more than the window granted
        self.queued_frames = 0  # other frames waiting (open, exit, result...): a request takes a handful
        self.consumed = 0  # streamed bytes taken by the consumer since the last credit
        self.streaming = False  # exec and read answer with streamed frames; other requests never do
        self.window = WINDOW  # streamed bytes the agent may have in flight (queued, or taken but not yet credited)
        self.deferred_credit = False  # a tunnel: its consumer grants credit itself, once it has passed bytes on
        self.send_credit: int | None = None  # a tunnel: bytes the host may still send before the agent grants more
        self.credit_ready: asyncio.Event | None = None  # set when credit arrives or the tunnel can take no more
        self.send_closed = False  # a tunnel that ended or failed: the agent takes none of the host's bytes any more

    def grant(self, header: dict[str, Any]) -> None:
        """A tunnel's ``credit`` frame: the agent has passed that many of the host's bytes on to the server."""
        granted = header.get("bytes")
        if self.send_credit is None or self.credit_ready is None:
            raise GuestProtocolError("a credit frame for a request that sends no data")
        if isinstance(granted, bool) or not isinstance(granted, int) or not 0 < granted <= WINDOW:
            raise GuestProtocolError(f"a credit frame of {granted!r} bytes")
        self.send_credit = min(self.send_credit + granted, WINDOW)
        self.credit_ready.set()

    def enqueue(self, header: dict[str, Any], payload: bytes, header_size: int) -> None:
        """Queue a frame for the consumer; an agent that sends past its window breaks the protocol."""
        if header.get("ev") in _STREAM_EVENTS:
            if not self.streaming or not payload or header_size > _MAX_STREAM_HEADER:
                raise GuestProtocolError("a data frame that no request of this kind takes")
            self.queued_data += len(payload) + FRAME_COST
            # A tunnel's consumer still holds what it took and has not credited yet: that counts too.
            held = self.queued_data + (self.consumed if self.deferred_credit else 0)
            if held > self.window:
                raise GuestProtocolError(
                    f"more than {self.window} bytes of unread data for one request: it ignores flow control"
                )
        else:
            self.queued_frames += 1
            if self.queued_frames > _MAX_QUEUED_FRAMES:
                raise GuestProtocolError(f"more than {_MAX_QUEUED_FRAMES} unread answers to one request")
        self.queue.put_nowait((header, payload))


class GuestConnection:
    """Many concurrent requests over one agent stream."""

    def __init__(
        self,
        reader: ByteReader,
        writer: Writer,
        *,
        label: str,
        on_violation: Callable[[str], None] | None = None,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        self._reader = reader
        self._on_violation = on_violation
        self.answer_timeout_s = answer_timeout_s
        self._writer = writer
        self._label = label
        self._ids = itertools.count(1)
        self._pending: dict[int, _Request] = {}
        self._abandoned: dict[int, int] = {}  # request id -> bytes of late frames still tolerated
        self._closed = False
        self.violation: str | None = None
        """Why the connection was closed, when the agent broke the protocol."""
        self._hello: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._read_loop(), name=f"guest-reader-{label}")

    @property
    def closed(self) -> bool:
        """True once the stream has ended or :meth:`aclose` was called."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Requests still open: running commands, terminals, reads, watches and tunnels included."""
        return len(self._pending)

    @property
    def features(self) -> frozenset[str]:
        """What the agent's hello said it can do beyond its protocol version (empty until the hello arrived)."""
        if not self._hello.done() or self._hello.cancelled() or self._hello.exception() is not None:
            return frozenset()
        return frozenset(str(f) for f in self._hello.result().get("features") or ())

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

    async def _read_frame(self) -> tuple[dict[str, Any], bytes, int]:
        head_len = _LEN.unpack(await self._reader.readexactly(_LEN.size))[0]
        if head_len > MAX_HEADER:
            raise GuestProtocolError(f"a frame header of {head_len} bytes, over the {MAX_HEADER}-byte limit")
        raw = await self._reader.readexactly(head_len)
        try:
            header = json.loads(raw)
        except (ValueError, RecursionError):
            raise GuestProtocolError("a frame header that is not JSON") from None
        if not isinstance(header, dict) or not isinstance(header.get("id", 0), int):
            raise GuestProtocolError("a frame header that is not an object with an integer id")
        payload_len = _LEN.unpack(await self._reader.readexactly(_LEN.size))[0]
        if payload_len > MAX_PAYLOAD:
            raise GuestProtocolError(f"a frame payload of {payload_len} bytes, over the {MAX_PAYLOAD}-byte limit")
        return header, await self._reader.readexactly(payload_len), head_len

    async def _read_loop(self) -> None:
        try:
            while True:
                header, payload, header_size = await self._read_frame()
                rid = header.get("id", 0)
                request = self._pending.get(rid)
                if request is not None and header.get("ev") == "credit":
                    request.grant(header)
                elif request is not None:
                    request.enqueue(header, payload, header_size)
                    if request.credit_ready is not None and header.get("ev") in ("error", "end"):
                        request.send_closed = True
                        request.credit_ready.set()  # a writer waiting for credit would wait forever
                elif rid == 0 and header.get("ev") == "hello" and not self._hello.done():
                    self._hello.set_result(header)
                else:
                    self._late(rid, len(payload) + header_size)
        except GuestProtocolError as exc:
            self.violation = f"the agent in {self._label} sent {exc}"
            log.warning("%s; closing the connection", self.violation)
            if self._on_violation is not None:
                self._on_violation(self.violation)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            log.debug("agent stream of %s ended: %s", self._label, exc)
        finally:
            self._closed = True
            with contextlib.suppress(Exception):
                self._writer.close()
            self._fail_pending()

    def _late(self, rid: int, size: int) -> None:
        """A frame for no request in flight: tolerated for a request the host abandoned, up to a window's worth."""
        budget = self._abandoned.get(rid)
        if budget is None or budget < size:
            raise GuestProtocolError(f"a frame for request {rid}, which is not in flight")
        self._abandoned[rid] = budget - size

    def _finish(self, rid: int, *, done: bool) -> None:
        """The request is over: a finished one takes no more frames, an abandoned one its last few."""
        self._pending.pop(rid, None)
        if not done:
            self._abandoned[rid] = WINDOW + MAX_HEADER
            while len(self._abandoned) > _MAX_ABANDONED:
                self._abandoned.pop(next(iter(self._abandoned)))

    async def _kill(self, target: int) -> None:
        """Stop a request the host gave up on (its command is killed, its read ends); the answer is not awaited."""
        rid = next(self._ids)
        self._abandoned[rid] = MAX_HEADER  # the agent acknowledges the kill; that answer is expected and dropped
        await self._send({"id": rid, "op": "kill", "target": target})

    def _lost_error(self) -> GuestConnectionLost:
        if self.violation is not None:
            return GuestProtocolError(self.violation)
        return GuestConnectionLost(f"connection to the agent in {self._label} was lost")

    def _fail_pending(self) -> None:
        if not self._hello.done():
            self._hello.set_exception(
                GuestProtocolError(self.violation)
                if self.violation
                else GuestConnectionLost(f"agent in {self._label} exited before it was ready")
            )
            self._hello.exception()  # mark retrieved: nobody may be waiting
        for request in self._pending.values():
            request.queue.put_nowait(None)
            if request.credit_ready is not None:
                request.credit_ready.set()

    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        if self._closed:
            raise self._lost_error()
        self._writer.write(encode_frame(header, payload))
        try:
            await asyncio.wait_for(self._writer.drain(), self.answer_timeout_s)
        except TimeoutError:
            await self._give_up(
                f"the agent in {self._label} has not read what the host sent for {self.answer_timeout_s:g} s"
            )
        except (ConnectionError, OSError) as exc:
            raise GuestConnectionLost(f"connection to the agent in {self._label} broke: {exc}") from exc

    async def _give_up(self, reason: str) -> NoReturn:
        """The agent is stuck (stopped, or too slow to be trusted): close the connection; the next call starts a new
        agent."""
        log.warning("%s; closing the connection", reason)
        await self.aclose()
        raise GuestConnectionLost(reason)

    def _open(self, *, streaming: bool = False) -> tuple[int, _Request]:
        rid = next(self._ids)
        request = _Request()
        request.streaming = streaming
        self._pending[rid] = request
        return rid, request

    async def _next(self, rid: int, request: _Request, timeout: float | None = -1.0) -> Frame:
        """The request's next frame; ``timeout`` None waits as long as it takes, the default the connection's."""
        timeout = self.answer_timeout_s if timeout == -1.0 else timeout
        try:
            frame = await asyncio.wait_for(request.queue.get(), timeout)
        except TimeoutError:
            await self._give_up(f"the agent in {self._label} did not answer within {timeout:g} s")
        if frame is None:
            raise self._lost_error()
        header, payload = frame
        if header.get("ev") in _STREAM_EVENTS:
            request.queued_data -= len(payload) + FRAME_COST
        else:
            request.queued_frames -= 1
        if header.get("ev") == "error":
            raise _agent_error(header)
        if header.get("ev") in _STREAM_EVENTS:
            request.consumed += len(payload) + FRAME_COST
            if not request.deferred_credit:
                await self._grant(rid, request)
        return frame

    async def _grant(self, rid: int, request: _Request) -> None:
        """Give the agent back the window its consumed frames took, once that is half a window (fewer frames)."""
        if request.consumed >= request.window // 2 and not self._closed:
            granted, request.consumed = request.consumed, 0
            await self._send({"id": 0, "op": "credit", "target": rid, "bytes": granted})

    # --- requests ---------------------------------------------------------------------------------------------------

    async def call(self, op: str, *, timeout: float | None = None, **args: Any) -> dict[str, Any]:
        """Send one request and return its ``result`` object (``timeout``: the longest wait for the answer, by
        default the connection's ``answer_timeout_s``)."""
        return await self.call_with(op, b"", timeout=timeout, **args)

    async def call_with(self, op: str, payload: bytes, *, timeout: float | None = None, **args: Any) -> dict[str, Any]:
        """:meth:`call` with ``payload`` as the request frame's bytes."""
        rid, request = self._open()
        done = False
        try:
            await self._send({"id": rid, "op": op, **args}, payload)
            header, _ = await self._next(rid, request, -1.0 if timeout is None else timeout)
            done = True
            result = header.get("result", {})
            if not isinstance(result, dict):
                raise GuestProtocolError(f"the agent in {self._label} answered {op!r} with a non-object result")
            return result
        finally:
            self._finish(rid, done=done)

    async def exec(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        timeout_s: float | None,
        op: str = "exec",
        **args: Any,
    ) -> AsyncGenerator[Frame]:
        """Start a command (``args``: more request fields, e.g. ``user``); yields ``out`` frames and finally the
        ``exit`` frame. Closing early kills it. ``op`` ``shell`` runs ``args["command"]`` in the persistent shell
        ``args["key"]`` instead, started from ``argv`` when needed (the agent's ``shell`` feature)."""
        rid, request = self._open(streaming=True)
        finished = False
        try:
            await self._send(
                {"id": rid, "op": op, "argv": argv, "cwd": cwd, "env": env, "timeout_s": timeout_s, **args}
            )
            while True:
                frame = await self._next(rid, request, None)  # the command's own deadline applies (see remote.py)
                if frame[0].get("ev") == "exit":
                    finished = True
                yield frame
                if finished:
                    return
        finally:
            self._finish(rid, done=finished)
            if not finished and not self._closed:
                with contextlib.suppress(Exception):
                    await self._kill(rid)

    async def open_pty(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        rows: int,
        cols: int,
        timeout_s: float | None,
        **args: Any,
    ) -> GuestTerminal:
        """Start a command on a new pseudo-terminal of ``rows`` x ``cols`` (the agent's ``pty`` feature); ``args``:
        more request fields, e.g. ``user``."""
        rid, request = self._open(streaming=True)
        try:
            await self._send(
                {"id": rid, "op": "pty", "argv": argv, "cwd": cwd, "env": env, "rows": rows, "cols": cols}
                | {"timeout_s": timeout_s, **args}
            )
        except BaseException:
            self._finish(rid, done=False)
            raise
        return GuestTerminal(self, rid, request)

    async def open_read(self, path: str, **args: Any) -> AsyncGenerator[bytes]:
        """Open ``path`` for reading: path errors are raised now; returns the chunks (close early to stop the read)."""
        rid, request = self._open(streaming=True)
        try:
            await self._send({"id": rid, "op": "read", "path": path, **args})
            await self._next(rid, request)  # "open", or an error
        except BaseException:
            self._finish(rid, done=False)
            raise
        return self._chunks(rid, request)

    async def _chunks(self, rid: int, request: _Request) -> AsyncGenerator[bytes]:
        finished = False
        try:
            while True:
                header, payload = await self._next(rid, request)
                if header.get("ev") == "end":
                    finished = True
                    return
                yield payload
        finally:
            self._finish(rid, done=finished)
            if not finished and not self._closed:  # the reader stopped early: the agent stops reading the file
                with contextlib.suppress(Exception):
                    await self._kill(rid)

    async def open_watch(self, path: str, *, recursive: bool, **args: Any) -> AsyncGenerator[WatchBatch]:
        """Watch the directory ``path``: path errors are raised now; returns batches of ``(name, type)`` events and
        how many were dropped before each (close it to stop the watch)."""
        rid, request = self._open(streaming=True)
        try:
            await self._send({"id": rid, "op": "watch", "path": path, "recursive": recursive, **args})
            await self._next(rid, request)  # "open", or an error
        except BaseException:
            self._finish(rid, done=False)
            raise
        return self._watch_batches(rid, request)

    async def _watch_batches(self, rid: int, request: _Request) -> AsyncGenerator[WatchBatch]:
        finished = False
        try:
            while True:
                # A quiet directory sends nothing for as long as it stays quiet: no answer deadline here. A lost
                # connection still ends the wait (every pending request is woken with None).
                header, payload = await self._next(rid, request, None)
                if header.get("ev") == "end":
                    finished = True
                    return
                yield _watch_batch(payload)
        finally:
            self._finish(rid, done=finished)
            if not finished and not self._closed:  # the watcher stopped: so does the agent's inotify
                with contextlib.suppress(Exception):
                    await self._kill(rid)

    async def open_tunnel(
        self, port: int, *, idle_timeout_s: float | None = None, on_close: Callable[[], None] | None = None
    ) -> GuestTunnel:
        """Connect to ``port`` on the sandbox's loopback through the agent (its ``tunnel`` feature).

        Args:
            port: The port inside the sandbox.
            idle_timeout_s: Close the tunnel after this long without a byte either way (default
                :data:`TUNNEL_IDLE_S`).
            on_close: Called once when the tunnel is closed (by :meth:`GuestTunnel.aclose` or for idleness); not
                called when opening fails.

        Raises:
            ConnectionRefusedError: Nothing listens on the port.
        """
        rid, request = self._open(streaming=True)
        request.window = TUNNEL_WINDOW
        request.deferred_credit = True
        request.send_credit = WINDOW
        request.credit_ready = asyncio.Event()
        try:
            await self._send({"id": rid, "op": "tunnel", "port": port})
            header, _ = await self._next(rid, request)  # "open", or an error such as "refused"
        except BaseException:
            self._finish(rid, done=False)
            raise
        tunnel = GuestTunnel(
            self, rid, request, idle_timeout_s=TUNNEL_IDLE_S if idle_timeout_s is None else idle_timeout_s
        )
        if header.get("ev") != "open":
            await tunnel.aclose()
            raise GuestProtocolError(f"the agent in {self._label} answered a tunnel with {header.get('ev')!r}")
        tunnel.on_close = on_close
        return tunnel

    async def write(self, path: str, data: bytes | AsyncIterable[bytes], *, mode: int | None, **args: Any) -> int:
        """Stream ``data`` into ``path`` (parents created); returns the bytes written."""
        rid, request = self._open()
        done = False
        try:
            await self._send({"id": rid, "op": "write", "path": path, "mode": mode, **args})
            await self._next(rid, request)  # "ready", or an error such as "is a directory"
            if isinstance(data, bytes | bytearray | memoryview):
                view = memoryview(data)
                for start in range(0, len(view), _WRITE_CHUNK):
                    await self._send({"id": rid, "op": "data"}, bytes(view[start : start + _WRITE_CHUNK]))
                    self._raise_early_error(request)
            else:
                async for chunk in data:
                    for start in range(0, len(chunk), _WRITE_CHUNK):
                        await self._send({"id": rid, "op": "data"}, bytes(chunk[start : start + _WRITE_CHUNK]))
                        self._raise_early_error(request)
            await self._send({"id": rid, "op": "end"})
            header, _ = await self._next(rid, request)
            done = True
            try:
                return int(header["result"]["bytes_written"])
            except (KeyError, TypeError, ValueError):
                raise GuestProtocolError(f"the agent in {self._label} answered a write without a byte count") from None
        finally:
            self._finish(rid, done=done)

    def _raise_early_error(self, request: _Request) -> None:
        """A write that failed mid-stream (disk full) answers at once; stop sending instead of streaming on.

        Nothing but an error may arrive before the host has sent ``end``.
        """
        if not request.queue.empty():
            frame = request.queue.get_nowait()
            if frame is None:
                raise self._lost_error()
            if frame[0].get("ev") == "error":
                raise _agent_error(frame[0])
            raise GuestProtocolError(f"the agent in {self._label} answered a write before it ended")


class GuestTerminal:
    """A command running on a pseudo-terminal in the agent: its output frames, and input and resize calls."""

    def __init__(self, conn: GuestConnection, rid: int, request: _Request) -> None:
        self._conn = conn
        self.target = rid
        self._request = request
        self.finished = False
        self._closed = False

    async def frames(self) -> AsyncGenerator[Frame]:
        """``out`` frames (what the terminal shows) and finally the ``exit`` frame; the command's deadline applies."""
        while not self.finished:
            frame = await self._conn._next(self.target, self._request, None)
            if frame[0].get("ev") == "exit":
                self.finished = True
                self._conn._finish(self.target, done=True)
            yield frame

    async def write(self, data: bytes) -> None:
        """Type ``data`` into the terminal (in chunks the frame limit allows)."""
        for start in range(0, max(len(data), 1), _WRITE_CHUNK):
            await self._conn.call_with("pty_input", data[start : start + _WRITE_CHUNK], target=self.target)

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's size (the command gets SIGWINCH)."""
        await self._conn.call("pty_resize", target=self.target, rows=rows, cols=cols)

    async def kill(self) -> None:
        """Kill the command; :meth:`frames` still yields its exit."""
        if not self.finished:
            await self._conn._kill(self.target)

    async def aclose(self) -> None:
        """Kill the command unless it has ended; its last frames are dropped."""
        if self._closed:
            return
        self._closed = True
        if not self.finished:
            self._conn._finish(self.target, done=False)
            if not self._conn.closed:
                with contextlib.suppress(Exception):
                    await self._conn._kill(self.target)


class GuestTunnel:
    """A TCP connection to a port inside the sandbox, relayed by the agent: read, write, half-close, close.

    Reads take one frame at a time, and the agent gets their bytes back as credit only when the next read comes (the
    consumer has passed them on by then), so what the tunnel holds on the host stays within
    :data:`~corral.guest.agent.TUNNEL_WINDOW`. Writes wait for the agent's credit, so a server that does not read
    slows the writer instead of filling the agent's memory. A tunnel with no byte either way for ``idle_timeout_s``
    is closed; its reads and writes then raise TimeoutError.
    """

    def __init__(self, conn: GuestConnection, rid: int, request: _Request, *, idle_timeout_s: float) -> None:
        self._conn = conn
        self.target = rid
        self._request = request
        self._server_done = False  # the server shut its side (eof), or the tunnel ended
        self._finished = False
        self._closed = False
        self._idle = False  # closed for idleness
        self.on_close: Callable[[], None] | None = None
        """Called once when the tunnel is closed (the provider gives back its slot)."""
        loop = asyncio.get_running_loop()
        self._idle_timeout_s = idle_timeout_s
        self._active_at = loop.time()
        self._timer: asyncio.TimerHandle | None = loop.call_later(idle_timeout_s, self._check_idle)
        self._closing: asyncio.Task[None] | None = None

    def _check_idle(self) -> None:
        """The idle timer: close the tunnel when nothing moved for the whole timeout, or look again when it ends."""
        self._timer = None
        if self._closed:
            return
        loop = asyncio.get_running_loop()
        left = self._active_at + self._idle_timeout_s - loop.time()
        if left > 0:
            self._timer = loop.call_later(left, self._check_idle)
            return
        log.info("tunnel %d idle for %g s; closing it", self.target, self._idle_timeout_s)
        self._idle = True
        request = self._request
        request.send_closed = True
        request.queue.put_nowait(None)  # wake a reader waiting for the server
        if request.credit_ready is not None:
            request.credit_ready.set()  # and a writer waiting for credit
        self._closing = loop.create_task(self.aclose(), name=f"tunnel-idle-{self.target}")

    def _idle_error(self) -> TimeoutError:
        return TimeoutError(f"the connection carried nothing either way for {self._idle_timeout_s:g} s and was closed")

    async def read(self) -> bytes:
        """The server's next bytes; ``b""`` once it has shut its side."""
        if self._idle:
            raise self._idle_error()
        if self._server_done:
            return b""
        request = self._conn._pending.get(self.target)
        if request is self._request:  # the bytes handed out last time are passed on: the agent may send more
            await self._conn._grant(self.target, request)
        try:
            header, payload = await self._conn._next(self.target, self._request, None)  # a server may idle long
        except GuestConnectionLost:
            if self._idle:
                raise self._idle_error() from None
            raise
        event = header.get("ev")
        if event == "data":
            self._active_at = asyncio.get_running_loop().time()
            return payload
        if event not in ("eof", "end"):
            reason = f"the agent sent a tunnel frame {str(event)[:40]!r}"
            self._conn.violation = reason
            if self._conn._on_violation is not None:
                self._conn._on_violation(reason)
            await self._conn.aclose()
            raise GuestProtocolError(reason)
        self._server_done = True
        if event == "end":
            self._finished = True
            self._conn._finish(self.target, done=True)
        return b""

    async def write(self, data: bytes) -> None:
        """Send ``data`` to the server, in pieces as the agent grants credit."""
        request = self._request
        assert request.credit_ready is not None
        assert request.send_credit is not None
        view = memoryview(data)
        while view:
            while request.send_credit <= 0 or self._idle:
                if self._idle:
                    raise self._idle_error()
                if self._conn.closed:
                    raise self._conn._lost_error()
                if self._finished or request.send_closed:  # ended or failed: nothing takes bytes any more
                    raise BrokenPipeError("the connection to the server inside the workspace has ended")
                request.credit_ready.clear()
                await request.credit_ready.wait()
            size = min(len(view), request.send_credit, _WRITE_CHUNK)
            request.send_credit -= size
            self._active_at = asyncio.get_running_loop().time()
            await self._conn._send({"id": self.target, "op": "data"}, bytes(view[:size]))
            view = view[size:]

    async def write_eof(self) -> None:
        """Shut the sending side: the server reads end of stream once it has taken what was sent."""
        if self._idle:
            raise self._idle_error()
        if not self._finished:
            await self._conn._send({"id": self.target, "op": "eof"})

    async def aclose(self) -> None:
        """Close the connection (the agent closes its socket); frames still on their way are dropped."""
        if self._closed:
            return
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()
        if not self._finished:
            self._conn._finish(self.target, done=False)
            if not self._conn.closed:
                with contextlib.suppress(Exception):
                    await self._conn._kill(self.target)


WatchBatch = tuple[list[tuple[str, str]], int]
"""One frame of a watch: its ``(name, type)`` events, and how many events the agent dropped before them."""
_WATCH_TYPES = frozenset({"create", "write", "remove", "rename", "chmod"})
_MAX_WATCH_NAME = 4096


def _watch_batch(payload: bytes) -> WatchBatch:
    """Check a watch frame the agent sent (it is untrusted): a JSON object of events with known types."""
    try:
        raw = json.loads(payload)
        events = [(str(name), str(kind)) for name, kind in raw["events"] if kind in _WATCH_TYPES]
        dropped = raw.get("dropped", 0)
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise GuestProtocolError(f"a watch frame that is not a batch of events: {exc}") from None
    if not isinstance(dropped, int):  # Infinity, NaN, 1e309: numbers int() cannot take, or should not
        raise GuestProtocolError(f"a watch frame whose dropped count is not an integer: {dropped!r}")
    if any(len(name) > _MAX_WATCH_NAME for name, _ in events):
        raise GuestProtocolError(f"a watch event whose name is longer than {_MAX_WATCH_NAME} characters (PATH_MAX)")
    return events, max(0, dropped)


def _agent_error(header: dict[str, Any]) -> Exception:
    kind, message = header.get("kind", "os"), str(header.get("message", "operation failed"))[:2000]
    if kind == "not_found":
        return WorkspaceFileNotFoundError(message)
    if kind in ("invalid", "escape"):
        return InvalidRequestError(message)
    if kind == "refused":
        return ConnectionRefusedError(message)
    if kind == "busy":
        return TooManyRequestsError(message)
    if kind == "no_space":
        return ResourceLimitError(f"workspace disk is full: {message}")
    return FileOperationError(message, details={"kind": str(kind)[:40]})
