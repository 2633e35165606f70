"""Content encodings of envd's ``/files``: gzip uploads and gzip downloads, negotiated as envd negotiates them.

* Uploads: ``Content-Encoding: gzip`` (any case) inflates the body, octet-stream or multipart alike; ``identity``
  or no header leaves it as it is; anything else is refused (400).
* Downloads: ``Accept-Encoding`` is read with its q-values, highest first (ties in the order given): the first of
  ``gzip`` and ``identity`` not refused with ``q=0`` wins, ``*`` means identity unless identity is refused, and
  identity is acceptable when not named. A request that refuses both is answered 400, as envd does. The SDK sends
  ``gzip`` for ``files.read(..., gzip=True)``; httpx, under the SDK, otherwise sends ``gzip, deflate``, so reads
  come gzipped from envd either way.

Compression runs at zlib's fastest level, on a worker thread for large chunks: every Python SDK read asks for gzip,
so its cost falls on every download, and the event loop must not stall on it. (envd uses Go's default level; the
bytes differ, the content does not.)
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import zlib
from collections.abc import AsyncIterator

from corral.errors import InvalidRequestError

__all__ = ["content_type", "gunzip", "gzip_stream", "request_encoding", "response_encoding"]

GZIP = "gzip"
IDENTITY = "identity"
_SUPPORTED = (GZIP,)
_PIECE = 1024 * 1024
_THREAD_FROM = 64 * 1024  # chunks smaller than this compress faster than a thread hop takes
_GO_TYPES = {
    ".avif": "image/avif",
    ".css": "text/css; charset=utf-8",
    ".gif": "image/gif",
    ".htm": "text/html; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".jpeg": "image/jpeg",
    ".jpg": "image/jpeg",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".mjs": "text/javascript; charset=utf-8",
    ".pdf": "application/pdf",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".wasm": "application/wasm",
    ".webp": "image/webp",
    ".xml": "text/xml; charset=utf-8",
}
"""Go's built-in ``mime.TypeByExtension`` table, which envd's download answers with; other files are octet-stream."""


def _coding(value: str) -> tuple[str, float]:
    """One element of an encoding header: its name (lowercased) and q-value (1 unless a valid ``q=`` says else)."""
    name, _, params = value.strip().partition(";")
    quality = 1.0
    for raw in params.split(";"):
        param = raw.strip()
        if param.lower().startswith("q="):
            with contextlib.suppress(ValueError):  # as envd: an unparsable q-value leaves the default
                quality = float(param[2:])
    return name.strip().lower(), quality


def request_encoding(header: str | None) -> str:
    """The encoding of an upload's body from its ``Content-Encoding``: ``gzip`` or ``identity``.

    Raises:
        InvalidRequestError: an encoding other than those two.
    """
    if not header:
        return IDENTITY
    name, _ = _coding(header)
    if name in (IDENTITY, *_SUPPORTED):
        return name
    raise InvalidRequestError(
        f"error decompressing request body: unsupported Content-Encoding: {header}, supported: [{' '.join(_SUPPORTED)}]"
    )


def response_encoding(header: str | None) -> str:
    """The encoding a download is sent with, chosen from its ``Accept-Encoding`` as envd chooses.

    Raises:
        InvalidRequestError: the header refuses identity and names no encoding envd supports.
    """
    if not header:
        return IDENTITY
    codings = sorted((_coding(value) for value in header.split(",")), key=lambda coding: -coding[1])
    identity_refused = (IDENTITY, 0.0) in codings
    for name, quality in codings:
        if quality == 0:
            continue
        if name == IDENTITY:
            return IDENTITY
        if name == "*":
            return _SUPPORTED[0] if identity_refused else IDENTITY
        if name in _SUPPORTED:
            return name
    if not identity_refused:
        return IDENTITY
    raise InvalidRequestError(
        f"error parsing Accept-Encoding: no acceptable encoding found, supported: [{' '.join(_SUPPORTED)}]"
    )


def content_type(path: str) -> str:
    """The ``Content-Type`` of a downloaded file: by its extension in Go's table, else ``application/octet-stream``."""
    return _GO_TYPES.get(posixpath.splitext(path)[1].lower(), "application/octet-stream")


async def gunzip(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Inflate a gzip body in pieces of at most 1 MiB: a small bomb never becomes one large allocation.

    Concatenated gzip members make one stream, as Go's ``gzip.Reader`` reads them.

    Raises:
        InvalidRequestError: the body is not gzip, or is cut short.
    """
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    fed = False
    async for chunk in chunks:
        data = chunk
        while data:
            if decompressor.eof:  # another member follows
                decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
            fed = True
            try:
                out = decompressor.decompress(data, _PIECE)
            except zlib.error as exc:
                raise InvalidRequestError(f"error decompressing request body: {exc}") from None
            if out:
                yield out
            data = decompressor.unused_data if decompressor.eof else decompressor.unconsumed_tail
    if not fed:
        raise InvalidRequestError("error decompressing request body: the body is empty, not gzip (EOF)")
    if not decompressor.eof:
        tail = decompressor.flush()
        if not _ended(decompressor):
            raise InvalidRequestError("error decompressing request body: the gzip stream ends early (unexpected EOF)")
        if tail:
            yield tail


def _ended(decompressor: zlib._Decompress) -> bool:
    # A call, not an attribute test: a type checker would take ``eof`` as unchanged by ``flush()``.
    return decompressor.eof


async def gzip_stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Compress a byte stream into one gzip member, chunk by chunk (nothing is buffered beyond zlib's window)."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    async for chunk in chunks:
        if len(chunk) >= _THREAD_FROM:
            out = await asyncio.to_thread(compressor.compress, chunk)  # zlib releases the GIL on large buffers
        else:
            out = compressor.compress(chunk)
        if out:
            yield out
    yield compressor.flush()
