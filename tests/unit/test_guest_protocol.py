"""The host side of the agent protocol treats every frame as hostile: sizes are checked before anything is read,
garbage ends the connection with the reason, and streamed data is flow-controlled."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

from corral.guest.agent import FRAME_COST, MAX_HEADER, MAX_PAYLOAD, WINDOW, encode_frame
from corral.guest.client import GuestConnection, GuestConnectionLost, GuestProtocolError

pytestmark = [pytest.mark.unit]


class _Sink:
    """A writer that keeps the frames the host sends."""

    def __init__(self) -> None:
        self.frames: list[dict[str, object]] = []

    def write(self, data: bytes) -> None:
        while data:
            head = struct.unpack(">I", data[:4])[0]
            self.frames.append(json.loads(data[4 : 4 + head]))
            size = struct.unpack(">I", data[4 + head : 8 + head])[0]
            data = data[8 + head + size :]

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


class _CountingReader(asyncio.StreamReader):
    """A reader that remembers the largest read it was asked for."""

    largest = 0

    async def readexactly(self, n: int) -> bytes:
        self.largest = max(self.largest, n)
        return await super().readexactly(n)


async def _connection(*frames: bytes) -> tuple[GuestConnection, _CountingReader, _Sink, list[str]]:
    reader = _CountingReader()
    for frame in frames:
        reader.feed_data(frame)
    sink = _Sink()
    violations: list[str] = []
    conn = GuestConnection(reader, sink, label="test", on_violation=violations.append)
    return conn, reader, sink, violations


HELLO = encode_frame({"id": 0, "ev": "hello", "version": 2})


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (struct.pack(">I", 1 << 30), "frame header of 1073741824 bytes"),
        (struct.pack(">I", MAX_HEADER + 1), f"over the {MAX_HEADER}-byte limit"),
        (struct.pack(">I", 5) + b"hello" + struct.pack(">I", 0), "not JSON"),
        (struct.pack(">I", 2) + b"[]" + struct.pack(">I", 0), "not an object"),
        (struct.pack(">I", 9) + b'{"id":"x"}'[:9] + struct.pack(">I", 0), "not JSON"),
        (struct.pack(">I", 2) + b"{}" + struct.pack(">I", MAX_PAYLOAD + 1), "payload of"),
    ],
    ids=["1GiB-header", "header-cap", "garbage", "array", "truncated-json", "payload-cap"],
)
async def test_a_bad_frame_ends_the_connection_with_the_reason(raw: bytes, reason: str) -> None:
    """Oversized or garbage frames close the connection; every request in flight fails with the reason, and the
    host never asked the stream for more than the caps."""
    conn, reader, _, violations = await _connection(HELLO)
    await conn.wait_ready(1)
    call = asyncio.create_task(conn.call("ping"))
    await asyncio.sleep(0)
    reader.feed_data(raw)
    with pytest.raises(GuestProtocolError, match=reason):
        await asyncio.wait_for(call, 2)
    assert conn.closed
    assert violations and reason in violations[0]
    assert reader.largest <= MAX_HEADER
    await conn.aclose()


async def test_data_past_the_window_is_a_violation() -> None:
    """An agent that keeps sending a request's data without credit breaks the protocol; it cannot fill memory."""
    conn, reader, _, violations = await _connection(HELLO)
    await conn.wait_ready(1)
    opening = asyncio.create_task(conn.open_read("/x"))
    await asyncio.sleep(0)  # the request is registered before its frames arrive
    reader.feed_data(encode_frame({"id": 1, "ev": "open", "size": 1 << 40}))
    stream = await opening
    chunk = b"x" * (256 * 1024)
    for _ in range(WINDOW // len(chunk) + 8):
        reader.feed_data(encode_frame({"id": 1, "ev": "data"}, chunk))
    await asyncio.sleep(0.05)
    assert conn.closed and violations and "ignores flow control" in violations[0]
    with pytest.raises(GuestConnectionLost):
        async for _ in stream:
            pass
    await conn.aclose()


async def test_credit_follows_consumption() -> None:
    """The host grants credit only as its consumer takes data: half a window at a time."""
    conn, reader, sink, _ = await _connection(HELLO)
    await conn.wait_ready(1)
    opening = asyncio.create_task(conn.open_read("/x"))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "open", "size": 0}))
    stream = await opening
    chunk = b"y" * (256 * 1024 - FRAME_COST)  # what a well-behaved agent sends: each frame costs its header too
    for _ in range(4):
        reader.feed_data(encode_frame({"id": 1, "ev": "data"}, chunk))
    reader.feed_data(encode_frame({"id": 1, "ev": "end"}))
    got = [len(c) async for c in stream]
    assert sum(got) == 4 * len(chunk)
    credits = [f for f in sink.frames if f.get("op") == "credit"]
    assert [c["bytes"] for c in credits] == [WINDOW // 2, WINDOW // 2]
    await conn.aclose()


async def test_a_write_answer_without_a_count_is_refused() -> None:
    """Values inside frames are checked too: a write answer without a byte count is a protocol error."""
    conn, reader, _, _ = await _connection(HELLO)
    await conn.wait_ready(1)
    writing = asyncio.create_task(conn.write("/x", b"data", mode=None))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "ready"}))
    await asyncio.sleep(0.01)  # the data and the end go out
    reader.feed_data(encode_frame({"id": 1, "ev": "result", "result": {"bytes_written": "lots"}}))
    with pytest.raises(GuestProtocolError, match="without a byte count"):
        await writing
    await conn.aclose()


async def test_frames_for_requests_not_in_flight_are_violations() -> None:
    """A frame for a request the host never made, or one already answered, ends the connection (so unsolicited
    frames cost nothing), while an abandoned request's last frames are tolerated."""
    conn, reader, _, violations = await _connection(HELLO)
    await conn.wait_ready(1)
    calling = asyncio.create_task(conn.call("ping"))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "result", "result": {}}))
    assert await calling == {}
    reader.feed_data(encode_frame({"id": 1, "ev": "result", "result": {}}))  # answered twice
    await asyncio.sleep(0.01)
    assert conn.closed and "not in flight" in violations[0]


async def test_an_abandoned_requests_last_frames_are_tolerated() -> None:
    """Output of a command the host stopped reading may still arrive (up to a window); it is dropped quietly."""
    conn, reader, _, violations = await _connection(HELLO)
    await conn.wait_ready(1)
    frames = conn.exec(["yes"], cwd="/", env={}, timeout_s=None)
    first = asyncio.create_task(anext(frames))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "out", "fd": 1}, b"y\n"))
    await first
    await frames.aclose()  # the host gives up on the command; it sends a kill
    reader.feed_data(encode_frame({"id": 1, "ev": "out", "fd": 1}, b"y\n" * 1000))
    reader.feed_data(encode_frame({"id": 1, "ev": "exit", "code": 137}))
    await asyncio.sleep(0.01)
    assert not conn.closed and not violations
    await conn.aclose()


@pytest.mark.parametrize(
    "frame",
    [
        encode_frame({"id": 1, "ev": "data"}, b""),
        encode_frame({"id": 1, "ev": "data", "pad": "x" * 300}, b"x"),
    ],
    ids=["empty-payload", "fat-header"],
)
async def test_streamed_frames_must_carry_data_and_a_small_header(frame: bytes) -> None:
    """Empty or fat streamed frames would let an agent queue headers for free; both are violations."""
    conn, reader, _, violations = await _connection(HELLO)
    await conn.wait_ready(1)
    opening = asyncio.create_task(conn.open_read("/x"))
    await asyncio.sleep(0)
    reader.feed_data(encode_frame({"id": 1, "ev": "open", "size": 1}))
    stream = await opening
    reader.feed_data(frame)
    await asyncio.sleep(0.01)
    assert conn.closed and "no request of this kind takes" in violations[0]
    await stream.aclose()


async def test_an_agent_that_never_answers_costs_a_bounded_wait() -> None:
    """With no answer by the deadline, the call fails and the connection is closed (a stopped agent)."""
    conn, _, _, _ = await _connection(HELLO)
    conn.answer_timeout_s = 0.05
    await conn.wait_ready(1)
    with pytest.raises(GuestConnectionLost, match=r"did not answer within 0\.05 s"):
        await conn.call("stat", path="/")
    assert conn.closed
