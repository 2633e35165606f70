"""The wire helpers of the E2B API: Connect envelopes and the streaming multipart reader, at awkward chunk sizes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from corral.api.e2b._connect import ConnectError, b64decode, end_of_stream, envelope, read_envelopes
from corral.api.e2b._multipart import boundary_of, read_parts
from corral.errors import InvalidRequestError

pytestmark = pytest.mark.unit


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
async def test_envelopes_survive_any_chunking(size: int) -> None:
    """Messages split across chunks at any byte are read back in order, and reading stops at end-of-stream."""
    body = envelope({"a": 1}) + envelope({}) + envelope({"b": "x" * 50}) + end_of_stream() + envelope({"late": 1})
    assert [m async for m in read_envelopes(_chunks(body, size))] == [{"a": 1}, {}, {"b": "x" * 50}]


async def test_compressed_and_truncated_envelopes_are_refused() -> None:
    """A compressed message and a body that stops inside an envelope are protocol errors with Connect codes."""
    with pytest.raises(ConnectError) as compressed:
        _ = [m async for m in read_envelopes(_chunks(b"\x01\x00\x00\x00\x02{}", 4))]
    assert compressed.value.code == "unimplemented"
    with pytest.raises(ConnectError) as truncated:
        _ = [m async for m in read_envelopes(_chunks(envelope({"a": 1})[:-1], 4))]
    assert truncated.value.code == "invalid_argument"


def test_base64_accepts_both_alphabets_and_missing_padding() -> None:
    """bytes fields decode from standard or URL-safe base64, padded or not; anything else is invalid_argument."""
    assert b64decode("+/8=", field="f") == b"\xfb\xff"
    assert b64decode("-_8", field="f") == b"\xfb\xff"
    with pytest.raises(ConnectError):
        b64decode("not base64!", field="f")


def _multipart(files: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x", files=[("file", (name, data)) for name, data in files])
    return request.read(), request.headers["content-type"]


@pytest.mark.parametrize("size", [1, 5, 64, 100_000])
async def test_multipart_parts_stream_intact(size: int) -> None:
    """Parts as httpx encodes them (quotes, unicode, CRLF and boundary-like text in the data) come back byte for
    byte whatever the chunking."""
    files = [
        ('/workspace/dir/quote "x" é.txt', b"first\r\n--almost a boundary\r\n"),
        ("relative/empty.bin", b""),
        ("/big.bin", bytes(range(256)) * 40),
    ]
    body, content_type = _multipart(files)
    seen = []
    async for part in read_parts(_chunks(body, size), boundary_of(content_type)):
        seen.append((part.filename, b"".join([c async for c in part.body])))
    assert seen == files


async def test_multipart_parts_left_unread_are_skipped() -> None:
    """A consumer may ignore a part's body; the next part is still found."""
    body, content_type = _multipart([("a", b"x" * 1000), ("b", b"y")])
    names = [part.filename async for part in read_parts(_chunks(body, 10), boundary_of(content_type))]
    assert names == ["a", "b"]


async def test_multipart_errors() -> None:
    """A content type without boundary and a body without its closing boundary are invalid requests."""
    with pytest.raises(InvalidRequestError):
        boundary_of("multipart/form-data")
    body, content_type = _multipart([("a", b"data")])

    async def read_all() -> None:
        async for part in read_parts(_chunks(body[:-10], 7), boundary_of(content_type)):
            _ = [c async for c in part.body]

    with pytest.raises(InvalidRequestError):
        await read_all()
