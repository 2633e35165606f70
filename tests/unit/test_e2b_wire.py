"""The wire helpers of the E2B API: Connect envelopes, the streaming multipart reader and gzip at awkward chunk sizes,
and the formats envd writes (Go's permission strings, protobuf timestamps, metadata headers)."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest

from corral.api.e2b._connect import ConnectError, b64decode, end_of_stream, envelope, read_envelopes
from corral.api.e2b._encoding import gunzip, gzip_stream, request_encoding, response_encoding
from corral.api.e2b._entries import go_permissions, proto_timestamp
from corral.api.e2b._metadata import metadata_from_headers, mirror_file
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


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, "identity"),
        ("gzip", "gzip"),
        ("GZIP;q=0.8", "gzip"),
        ("gzip, deflate", "gzip"),
        ("identity, gzip", "identity"),
        ("gzip;q=0.5, identity", "identity"),
        ("br", "identity"),
        ("gzip;q=0", "identity"),
        ("*", "identity"),
        ("*, identity;q=0", "gzip"),
        ("gzip;q=abc", "gzip"),
    ],
)
def test_accept_encoding_is_negotiated_as_envd_does(accept: str | None, chosen: str) -> None:
    """Highest q-value first, ties in the order given; identity unless refused; ``*`` means gzip only when identity
    is refused; an unparsable q-value counts as 1."""
    assert response_encoding(accept) == chosen


def test_unacceptable_and_unknown_encodings_are_invalid() -> None:
    """Refusing identity without naming gzip, and uploading in an encoding other than gzip, are invalid requests."""
    with pytest.raises(InvalidRequestError, match="no acceptable encoding"):
        response_encoding("br, identity;q=0")
    assert (request_encoding(None), request_encoding("Identity"), request_encoding("gzip")) == ("identity",) * 2 + (
        "gzip",
    )
    with pytest.raises(InvalidRequestError, match="unsupported Content-Encoding: deflate"):
        request_encoding("deflate")


@pytest.mark.parametrize("size", [1, 9, 4096])
async def test_gzip_roundtrips_at_any_chunking(size: int) -> None:
    """gzip_stream's output inflates back; gunzip reads concatenated members as one stream at any chunk size."""
    data = bytes(range(256)) * 300
    zipped = b"".join([c async for c in gzip_stream(_chunks(data, 70_000))])
    assert gzip.decompress(zipped) == data
    two_members = zipped + gzip.compress(b"tail")
    assert b"".join([c async for c in gunzip(_chunks(two_members, size))]) == data + b"tail"


@pytest.mark.parametrize(
    "body", [b"", b"not gzip at all", gzip.compress(b"x" * 1000)[:-6], gzip.compress(b"a") + b"junk"]
)
async def test_gunzip_refuses_broken_bodies(body: bytes) -> None:
    """An empty body, one that is not gzip, one cut short and one with garbage after a member are invalid."""
    with pytest.raises(InvalidRequestError, match="error decompressing request body"):
        _ = [c async for c in gunzip(_chunks(body, 5))]


async def test_gunzip_inflates_a_bomb_in_bounded_pieces() -> None:
    """A highly compressed body comes out in pieces of at most 1 MiB, never as one allocation."""
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = bomb.compress(bytes(8 * 1024 * 1024)) + bomb.flush()
    sizes = [len(c) async for c in gunzip(_chunks(body, len(body)))]
    assert sum(sizes) == 8 * 1024 * 1024
    assert max(sizes) <= 1024 * 1024


@pytest.mark.parametrize(
    ("kind", "mode", "text"),
    [
        ("file", 0o644, "-rw-r--r--"),
        ("dir", 0o755, "drwxr-xr-x"),
        ("symlink", 0o777, "Lrwxrwxrwx"),
        ("file", 0o4755, "urwxr-xr-x"),
        ("file", 0o2750, "grwxr-x---"),
        ("dir", 0o1777, "dtrwxrwxrwx"),
        ("dir", 0o3775, "dgtrwxrwxr-x"),
        ("other", 0o600, "?rw-------"),
        ("file", 0, "----------"),
    ],
)
def test_permissions_are_gos_file_mode_strings(kind: str, mode: int, text: str) -> None:
    """envd's permissions field is Go's FileMode.String(): type and special bits as leading letters in Go's order."""
    assert go_permissions(kind, mode) == text


def test_timestamps_are_protojson() -> None:
    """Times are RFC 3339 UTC with 0, 3 or 6 fractional digits, as protojson trims them."""
    assert proto_timestamp(0) == "1970-01-01T00:00:00Z"
    assert proto_timestamp(1700000000.5) == "2023-11-14T22:13:20.500Z"
    assert proto_timestamp(1700000000.123456) == "2023-11-14T22:13:20.123456Z"


def test_metadata_headers() -> None:
    """X-Metadata-* headers become lowercased keys, the first of a repeated header wins, an empty key is ignored,
    and each key gets its own record path (long names hashed to fit NAME_MAX)."""
    headers = [
        (b"x-metadata-author", b"mish"),
        (b"x-metadata-author", b"later"),
        (b"x-metadata-", b"x"),
        (b"x-other", b"y"),
    ]
    assert metadata_from_headers(headers) == {"author": "mish"}
    with pytest.raises(InvalidRequestError, match="printable ASCII"):
        metadata_from_headers([(b"x-metadata-k", "é".encode("latin-1"))])
    assert mirror_file("/home/user/a.txt") == "/var/lib/corral/e2b-metadata/d_home/d_user/f_a.txt"
    assert len(mirror_file("/" + "n" * 255).rpartition("/")[2]) <= 255
