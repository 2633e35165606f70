"""Host side of Firecracker's hybrid vsock: reach a port inside the guest through the VM's Unix socket.

Firecracker listens on the ``uds_path`` given in ``PUT /vsock``. A host process connects to it, sends
``CONNECT <port>\\n`` and reads ``OK <host_port>\\n``; from then on the Unix stream is the guest connection. While
the guest boots (or when nothing listens on the port yet) Firecracker closes the connection instead of answering,
so :func:`connect` retries until a deadline. The result is a pair of asyncio streams that
:class:`corral.guest.client.GuestConnection` speaks the agent protocol over, exactly as it does over a
``docker exec`` stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from corral.errors import CorralError

__all__ = ["AGENT_PORT", "VsockConnectError", "connect"]

AGENT_PORT = 1024
"""The guest port ``/sbin/corral-init`` serves the agent on."""
HANDSHAKE_TIMEOUT_S = 2.0
"""How long one attempt waits for ``OK``: as long as Firecracker keeps an unanswered request (2000 ms)."""


class VsockConnectError(CorralError):
    """No ``OK`` from the guest port before the deadline; the message says what the last attempt saw."""

    code = "vsock_connect_failed"
    http_status = 504


async def connect(
    uds_path: str,
    port: int = AGENT_PORT,
    *,
    timeout_s: float = 30.0,
    retry_interval_s: float = 0.02,
    limit: int = 2**20,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open a stream to guest ``port``, retrying until ``timeout_s`` while the VM boots.

    Raises:
        VsockConnectError: the deadline passed; carries the last failure (socket missing, refused, closed...).
    """
    deadline = time.monotonic() + timeout_s
    attempts = 0
    last = "no attempt was made"
    while True:
        attempts += 1
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_unix_connection(uds_path, limit=limit)
            writer.write(f"CONNECT {port}\n".encode())
            await writer.drain()
            remaining = max(deadline - time.monotonic(), 0.05)
            line = await asyncio.wait_for(reader.readline(), min(HANDSHAKE_TIMEOUT_S, remaining))
            if line.startswith(b"OK ") and line.endswith(b"\n"):
                return reader, writer
            last = f"the VMM answered {line!r} instead of OK" if line else "the VMM closed the connection"
        except FileNotFoundError:
            last = f"{uds_path} does not exist"
        except ConnectionRefusedError:
            last = f"{uds_path} refused the connection"
        except TimeoutError:
            last = f"no answer to CONNECT {port} within {HANDSHAKE_TIMEOUT_S:g} s"
        except (ConnectionError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        if time.monotonic() + retry_interval_s > deadline:
            raise VsockConnectError(
                f"vsock port {port} behind {uds_path} did not accept within {timeout_s:g} s "
                f"({attempts} attempts; last: {last})",
                details={"uds_path": uds_path, "port": port, "attempts": attempts, "last_error": last},
            )
        await asyncio.sleep(retry_interval_s)
