"""The Connect RPC protocol (https://connectrpc.com/docs/protocol) as envd's clients speak it: JSON codec only.

Unary calls are a ``POST`` with an ``application/json`` body; the answer is ``200`` with the JSON response, or an
error status with ``{"code": "not_found", "message": ...}``. Server-streaming calls send and receive *envelopes*:
one flags byte, a big-endian u32 length, then the JSON message. The stream ends with an envelope whose flags carry
``0x02`` and whose body is ``{}`` or ``{"error": {"code", "message"}}``; a streaming answer is always HTTP 200.

Messages follow protobuf's JSON mapping: lowerCamelCase field names, ``bytes`` as standard base64, 64-bit integers
as strings, enums by name, default values left out.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import struct
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import JSONResponse

__all__ = [
    "HTTP_STATUS",
    "STREAM_CONTENT_TYPE",
    "UNARY_CONTENT_TYPE",
    "ConnectCode",
    "ConnectError",
    "b64decode",
    "b64encode",
    "end_of_stream",
    "envelope",
    "field",
    "parse_message",
    "read_envelopes",
    "timeout_from_headers",
    "unary_error",
]

STREAM_CONTENT_TYPE = "application/connect+json"
UNARY_CONTENT_TYPE = "application/json"
_PREFIX = struct.Struct(">BI")
_FLAG_COMPRESSED = 0x01
_FLAG_END_STREAM = 0x02
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class ConnectCode(enum.StrEnum):
    """Connect's error codes (the gRPC codes in snake_case)."""

    CANCELED = "canceled"
    UNKNOWN = "unknown"
    INVALID_ARGUMENT = "invalid_argument"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NOT_FOUND = "not_found"
    ALREADY_EXISTS = "already_exists"
    PERMISSION_DENIED = "permission_denied"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    FAILED_PRECONDITION = "failed_precondition"
    ABORTED = "aborted"
    OUT_OF_RANGE = "out_of_range"
    UNIMPLEMENTED = "unimplemented"
    INTERNAL = "internal"
    UNAVAILABLE = "unavailable"
    DATA_LOSS = "data_loss"
    UNAUTHENTICATED = "unauthenticated"


HTTP_STATUS: Mapping[ConnectCode, int] = {
    ConnectCode.CANCELED: 499,
    ConnectCode.UNKNOWN: 500,
    ConnectCode.INVALID_ARGUMENT: 400,
    ConnectCode.DEADLINE_EXCEEDED: 504,
    ConnectCode.NOT_FOUND: 404,
    ConnectCode.ALREADY_EXISTS: 409,
    ConnectCode.PERMISSION_DENIED: 403,
    ConnectCode.RESOURCE_EXHAUSTED: 429,
    ConnectCode.FAILED_PRECONDITION: 400,
    ConnectCode.ABORTED: 409,
    ConnectCode.OUT_OF_RANGE: 400,
    ConnectCode.UNIMPLEMENTED: 501,
    ConnectCode.INTERNAL: 500,
    ConnectCode.UNAVAILABLE: 503,
    ConnectCode.DATA_LOSS: 500,
    ConnectCode.UNAUTHENTICATED: 401,
}
"""The HTTP status of a unary error, as the protocol specifies it."""


class ConnectError(Exception):
    """An RPC failure with its Connect code; becomes an error body or an end-of-stream error."""

    def __init__(self, code: ConnectCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def to_json(self) -> dict[str, str]:
        """The error object of the wire format."""
        return {"code": self.code.value, "message": self.message}


def unary_error(error: ConnectError) -> JSONResponse:
    """The HTTP answer to a unary call that failed."""
    return JSONResponse(error.to_json(), status_code=HTTP_STATUS[error.code])


def envelope(message: Mapping[str, Any]) -> bytes:
    """One enveloped message of a stream."""
    data = json.dumps(message, separators=(",", ":")).encode()
    return _PREFIX.pack(0, len(data)) + data


def end_of_stream(error: ConnectError | None = None) -> bytes:
    """The envelope that ends a stream, carrying the error if the call failed."""
    data = json.dumps({"error": error.to_json()} if error is not None else {}, separators=(",", ":")).encode()
    return _PREFIX.pack(_FLAG_END_STREAM, len(data)) + data


async def read_envelopes(body: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """The JSON messages of an enveloped request body, in order.

    Raises:
        ConnectError: ``invalid_argument`` for a truncated or compressed envelope or a body that is not a JSON object.
    """
    buffer = bytearray()
    async for chunk in body:
        buffer += chunk
        while len(buffer) >= _PREFIX.size:
            flags, length = _PREFIX.unpack_from(buffer)
            if length > MAX_MESSAGE_BYTES:
                raise ConnectError(ConnectCode.RESOURCE_EXHAUSTED, f"message of {length} bytes is too large")
            if len(buffer) < _PREFIX.size + length:
                break
            data = bytes(buffer[_PREFIX.size : _PREFIX.size + length])
            del buffer[: _PREFIX.size + length]
            if flags & _FLAG_COMPRESSED:
                raise ConnectError(ConnectCode.UNIMPLEMENTED, "compressed messages are not supported")
            if flags & _FLAG_END_STREAM:
                return
            yield parse_message(data)
    if buffer:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "request body ended inside an envelope")


def parse_message(data: bytes) -> dict[str, Any]:
    """A JSON message body; an empty body is the empty message."""
    if not data.strip():
        return {}
    try:
        message = json.loads(data)
    except ValueError as exc:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"request is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, "request must be a JSON object")
    return message


def timeout_from_headers(headers: Mapping[str, str]) -> float | None:
    """The call's deadline in seconds from ``Connect-Timeout-Ms``, or None when it has none."""
    raw = headers.get("connect-timeout-ms")
    if raw is None:
        return None
    try:
        millis = int(raw)
    except ValueError:
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"Connect-Timeout-Ms: {raw!r} is not an integer") from None
    return max(millis, 1) / 1000


def b64encode(data: bytes) -> str:
    """``bytes`` in protobuf JSON: standard base64 with padding."""
    return base64.b64encode(data).decode("ascii")


def b64decode(value: object, *, field: str) -> bytes:
    """Decode a protobuf JSON ``bytes`` value (standard or URL-safe base64, padding optional)."""
    if not isinstance(value, str):
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"{field}: expected a base64 string")
    text = value.replace("-", "+").replace("_", "/")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ConnectError(ConnectCode.INVALID_ARGUMENT, f"{field}: not valid base64") from None


def field(message: Mapping[str, Any], camel: str, snake: str | None = None) -> Any:
    """A field by its JSON name, or by its proto name (both are valid protobuf JSON input)."""
    if camel in message:
        return message[camel]
    return message.get(snake) if snake is not None else None
