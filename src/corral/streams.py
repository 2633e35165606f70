"""Byte streams that can be closed early, at the bottom of the import graph: :data:`ByteStream`, the type of what a
provider's ``read_file`` returns, and :func:`relay`, which hands a stream on and always closes it.

Closing a stream before its end releases what feeds it: the agent stops reading the file, a remote provider closes
its connection. Code that stops early must therefore close the stream, not just drop it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import TypeAlias

__all__ = ["ByteStream", "relay"]

ByteStream: TypeAlias = AsyncGenerator[bytes, None]
"""Chunks of a file as a provider streams them; ``aclose()`` ends the read early."""


async def relay(stream: ByteStream) -> ByteStream:
    """Yield every chunk of ``stream``, closing it however the consumer stops (at the end, on an error, or when it
    closes this generator, as a streaming HTTP response does when its client goes away)."""
    async with contextlib.aclosing(stream):
        async for chunk in stream:
            yield chunk
