"""A streaming ``multipart/form-data`` reader for envd's upload endpoint (no extra dependency, nothing buffered).

Each part's body is handed on chunk by chunk as it arrives, so a large upload goes straight to the workspace. Only
what envd's clients send is needed: parts with a ``Content-Disposition`` header naming a ``filename``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from corral.errors import InvalidRequestError

__all__ = ["Part", "boundary_of", "read_parts"]

_MAX_HEADER_BYTES = 16 * 1024
_BOUNDARY_RE = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_PARAM_RE = re.compile(r';\s*([\w*-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')
_PERCENT_RE = re.compile(r"%([0-9A-Fa-f]{2})")


@dataclass(frozen=True, slots=True)
class Part:
    """One part: its form field name, its file name (if any) and its body, which must be consumed in order."""

    name: str | None
    filename: str | None
    body: AsyncIterator[bytes]


def boundary_of(content_type: str) -> bytes:
    """The boundary of a ``multipart/form-data`` content type.

    Raises:
        InvalidRequestError: the content type has no boundary.
    """
    match = _BOUNDARY_RE.search(content_type)
    if match is None:
        raise InvalidRequestError("Content-Type: multipart/form-data without a boundary")
    return (match.group(1) or match.group(2)).encode("latin-1")


def _unescape(value: str) -> str:
    # httpx (like browsers, after the HTML5 rule) escapes '"' as %22 and control characters as %XX in form
    # parameters, and '\\' as '\\\\'. A literal "%22" in a file name is therefore ambiguous; we read it as HTML5 does.
    def percent(match: re.Match[str]) -> str:
        code = int(match.group(1), 16)
        return chr(code) if code < 0x20 or code == 0x22 else match.group(0)

    return _PERCENT_RE.sub(percent, re.sub(r"\\(.)", r"\1", value))


def _disposition(headers: dict[str, str]) -> tuple[str | None, str | None]:
    raw = headers.get("content-disposition", "")
    params: dict[str, str] = {}
    for match in _PARAM_RE.finditer(raw):
        key = match.group(1).lower()
        value = match.group(2) if match.group(2) is not None else match.group(3)
        params[key] = _unescape(value) if match.group(2) is not None else value
    return params.get("name"), params.get("filename")


class _Reader:
    def __init__(self, chunks: AsyncIterator[bytes], boundary: bytes) -> None:
        self._chunks = chunks
        # Seeding the buffer with CRLF lets the first boundary (which has none before it) match the delimiter.
        self._buf = bytearray(b"\r\n")
        self._delimiter = b"\r\n--" + boundary
        self._eof = False

    async def _fill(self) -> None:
        chunk = None if self._eof else await anext(self._chunks, None)
        if chunk is None:
            self._eof = True
            raise InvalidRequestError("multipart body ended before its closing boundary")
        self._buf += chunk

    async def body(self) -> AsyncIterator[bytes]:
        keep = len(self._delimiter) - 1
        while True:
            index = self._buf.find(self._delimiter)
            if index >= 0:
                if index:
                    yield bytes(self._buf[:index])
                    del self._buf[:index]
                return
            if len(self._buf) > keep:
                out = bytes(self._buf[:-keep])
                del self._buf[:-keep]
                yield out
            await self._fill()

    async def parts(self) -> AsyncIterator[Part]:
        keep = len(self._delimiter) - 1
        while (index := self._buf.find(self._delimiter)) < 0:  # skip the preamble
            if len(self._buf) > keep:
                del self._buf[:-keep]
            await self._fill()
        while True:
            del self._buf[: index + len(self._delimiter)]
            while len(self._buf) < 2:
                await self._fill()
            if self._buf.startswith(b"--"):
                return
            while (end := self._buf.find(b"\r\n\r\n")) < 0:
                if len(self._buf) > _MAX_HEADER_BYTES:
                    raise InvalidRequestError("multipart part headers are too long")
                await self._fill()
            block = self._buf[:end].decode("utf-8", errors="replace")
            del self._buf[: end + 4]
            headers: dict[str, str] = {}
            for line in block.split("\r\n")[1:]:  # the first line is what followed the boundary
                key, sep, value = line.partition(":")
                if sep:
                    headers[key.strip().lower()] = value.strip()
            name, filename = _disposition(headers)
            body = self.body()
            yield Part(name, filename, body)
            async for _ in body:  # whatever the consumer left unread
                pass
            index = 0


def read_parts(chunks: AsyncIterator[bytes], boundary: bytes) -> AsyncIterator[Part]:
    """The parts of a multipart body, streamed; consume (or abandon) each part's body before the next.

    Raises:
        InvalidRequestError: a malformed body.
    """
    return _Reader(chunks, boundary).parts()
