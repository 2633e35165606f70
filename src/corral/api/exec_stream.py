"""Streamed exec (``POST .../exec`` with ``stream: true``): the command's output as NDJSON lines while it runs.

Each line is one JSON object: ``{"stream": "stdout"|"stderr", "data": text}`` for every chunk as the provider
forwards it, then ``{"exit_code", "timed_out", "duration_ms"}`` last. An error after the answer began cannot change
its status any more, so it is a last line ``{"error": {"code", "message", "details"}}`` instead of the exit.

The answer is produced chunk by chunk with the client's pace (Starlette awaits each send), so the server holds at
most one chunk of a command's output per stream. When the client goes away the response generator is closed, which
closes the provider's stream and so kills the command.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi.responses import StreamingResponse

from corral.errors import CorralError, ExecTimeoutError, ProviderUnavailableError
from corral.providers.base import ExecExit, ExecStream

__all__ = ["KILLED_EXIT_CODE", "NDJSON_CONTENT", "NdjsonResponse", "ndjson_events"]

log = logging.getLogger(__name__)

KILLED_EXIT_CODE = 137  # killed by SIGKILL at the deadline, as a shell would report it

NDJSON_CONTENT = {
    "application/x-ndjson": {
        "schema": {
            "type": "string",
            "description": 'with "stream": true, one JSON object per line: {"stream": "stdout"|"stderr", "data": '
            'text} as produced, then {"exit_code", "timed_out", "duration_ms"} (or {"error": {...}}) last',
        }
    }
}
"""The OpenAPI content entry of the streamed answer."""


class NdjsonResponse(StreamingResponse):
    """Newline-delimited JSON, one object per line, sent as each line is made."""

    media_type = "application/x-ndjson"


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


async def ndjson_events(events: ExecStream, cleanup: contextlib.AsyncExitStack) -> AsyncIterator[bytes]:
    """The NDJSON lines of an exec stream (see the module docstring); ``cleanup`` is closed at the end, whatever
    happens (it holds the command's input file).

    Text is decoded as UTF-8 per stream with an incremental decoder, so a character split across two chunks is not
    mangled; bytes that are not UTF-8 become U+FFFD.
    """
    decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
    started = time.monotonic()

    def flushed() -> list[bytes]:
        rest = ((name, decoder.decode(b"", final=True)) for name, decoder in decoders.items())
        return [_line({"stream": name, "data": text}) for name, text in rest if text]

    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if isinstance(event, ExecExit):
                    for line in flushed():
                        yield line
                    yield _line({"exit_code": event.exit_code, "timed_out": False, "duration_ms": event.duration_ms})
                    return
                stream: Literal["stdout", "stderr"] = event.stream
                text = decoders[stream].decode(event.data)
                if text:
                    yield _line({"stream": stream, "data": text})
        yield _line(ProviderUnavailableError("exec", "the command ended without an exit status").to_json())
    except ExecTimeoutError as exc:
        for line in flushed():
            yield line
        duration_ms = exc.duration_ms or (time.monotonic() - started) * 1000
        yield _line({"exit_code": KILLED_EXIT_CODE, "timed_out": True, "duration_ms": duration_ms})
    except CorralError as exc:
        yield _line(exc.to_json())
    except Exception as exc:
        log.exception("streamed exec failed")
        message = f"internal error ({type(exc).__name__}); see the server log"
        yield _line({"error": {"code": "internal_error", "message": message, "details": {}}})
    finally:
        await cleanup.aclose()
