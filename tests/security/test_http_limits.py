"""What a client sends costs the server nothing before it is authenticated, and a bounded amount after
(finding 3 of the security review: a 1 GiB anonymous body, and a slow reader of a 3 GiB file)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.e2e.conftest import TOKEN, Server
from tests.security.conftest import MiB, rss_bytes

pytestmark = [pytest.mark.e2e]

GiB = 1024 * MiB


def _connect(server: Server) -> socket.socket:
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return sock


def _send_huge_body(server: Server, head: str, *, chunked: bool, limit: int = 256 * MiB) -> tuple[int, float]:
    """Send ``head``, then zeros until the server answers and hangs up (at most ``limit``); returns the status and
    how many seconds the answer took."""
    started = time.monotonic()
    sock = _connect(server)
    with sock:
        sock.sendall(head.encode())
        block = b"0" * (256 * 1024)
        frame = f"{len(block):x}\r\n".encode() + block + b"\r\n" if chunked else block
        sent = 0
        sock.settimeout(0.001)
        answer = b""
        while sent < limit:
            try:
                answer += sock.recv(65536)
                if answer:
                    break
            except (BlockingIOError, TimeoutError):
                pass
            try:
                sock.settimeout(5)
                sock.sendall(frame)
                sock.settimeout(0.001)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(block)
        sock.settimeout(10)
        while b"\r\n" not in answer:
            more = sock.recv(65536)
            if not more:
                break
            answer += more
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, time.monotonic() - started


def _head(server: Server, *, token: str | None, length: int | None) -> str:
    lines = [
        "POST /api/v1/agent/workspaces HTTP/1.1",
        f"Host: {urlsplit(server.url).netloc}",
        "Content-Type: application/json",
    ]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    return "\r\n".join(lines) + "\r\n\r\n"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_anonymous_gigabyte_is_refused_before_it_is_read(gvisor_server: Server, chunked: bool) -> None:
    """Without a token, a 1 GiB JSON body answers 401 at once and the server's memory does not move."""
    before = rss_bytes(gvisor_server.process.pid)
    status, seconds = _send_huge_body(
        gvisor_server, _head(gvisor_server, token=None, length=None if chunked else GiB), chunked=chunked
    )
    after = rss_bytes(gvisor_server.process.pid)
    assert status == 401
    assert seconds < 5
    assert after < 300 * MiB and after - before < 20 * MiB, (before, after)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_json_body_past_the_cap_is_refused(gvisor_server: Server, chunked: bool) -> None:
    """With a token, a JSON body larger than 1 MiB answers 413 (a declared one before it is read, a chunked one once
    past the cap), and the server's memory does not move."""
    before = rss_bytes(gvisor_server.process.pid)
    status, _ = _send_huge_body(
        gvisor_server, _head(gvisor_server, token=TOKEN, length=None if chunked else GiB), chunked=chunked
    )
    after = rss_bytes(gvisor_server.process.pid)
    assert status == 413
    assert after < 300 * MiB and after - before < 20 * MiB, (before, after)


def test_the_413_says_what_the_cap_is(gvisor_server: Server) -> None:
    """The refusal is Corral's JSON error with a code and the limit."""
    answer = gvisor_server.client.post(
        "/api/v1/agent/workspaces", content=b"[" + b"0," * (600 * 1024) + b"0]", headers={"content-type": "x"}
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "payload_too_large"
    assert str(1024 * 1024) in answer.json()["error"]["message"]


@pytest.fixture
def big_file(gvisor_server: Server, workspace: str) -> str:
    """A 512 MiB file in the workspace."""
    made = gvisor_server.client.post(
        f"/api/v1/agent/workspaces/{workspace}/exec", json={"command": "head -c 512M /dev/zero > big", "timeout_s": 120}
    )
    assert made.json()["exit_code"] == 0, made.text
    return "big"


def test_a_slow_reader_does_not_make_the_server_queue_the_file(
    gvisor_server: Server, workspace: str, big_file: str
) -> None:
    """A client that reads a 512 MiB download slowly holds the server's memory flat: the workspace sends only what
    the client takes (before the fix, the server queued the whole file)."""
    before = rss_bytes(gvisor_server.process.pid)
    sock = _connect(gvisor_server)
    with sock:
        sock.sendall(
            (
                f"GET /api/v1/agent/workspaces/{workspace}/files?path={big_file} HTTP/1.1\r\n"
                f"Host: {urlsplit(gvisor_server.url).netloc}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
            ).encode()
        )
        received, peak = 0, before
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:  # about 2.5 MB/s
            received += len(sock.recv(64 * 1024))
            peak = max(peak, rss_bytes(gvisor_server.process.pid))
            time.sleep(0.025)
    assert received > 1 * MiB
    assert peak < 300 * MiB and peak - before < 40 * MiB, (before, peak, received)


def test_uploads_stream_through(gvisor_server: Server, workspace: str) -> None:
    """A 256 MiB upload streams into the workspace (no body cap on file routes) without the server holding it."""
    before = rss_bytes(gvisor_server.process.pid)

    def body() -> Iterator[bytes]:
        block = b"x" * MiB
        for _ in range(256):
            yield block

    answer = gvisor_server.client.put(f"/api/v1/agent/workspaces/{workspace}/files?path=up.bin", content=body())
    assert answer.status_code == 200, answer.text
    assert answer.json()["bytes_written"] == 256 * MiB
    after = rss_bytes(gvisor_server.process.pid)
    assert after - before < 60 * MiB, (before, after)


def test_an_endless_request_head_is_cut_off(gvisor_server: Server) -> None:
    """A client that sends a header without end (before any authentication) is cut off after 64 KiB, and the
    server's memory does not move (with httptools, a 200 MB header was held whole)."""
    before = rss_bytes(gvisor_server.process.pid)
    sock = _connect(gvisor_server)
    sent = 0
    with sock:
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {urlsplit(gvisor_server.url).netloc}\r\nX-Junk: ".encode())
        try:
            while sent < 64 * MiB:
                sock.sendall(b"a" * (256 * 1024))
                sent += 256 * 1024
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        with contextlib.suppress(OSError):
            answer = sock.recv(65536)
    after = rss_bytes(gvisor_server.process.pid)
    assert sent < 64 * MiB, "the server must stop reading an endless header"
    assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), answer[:100]
    assert after - before < 20 * MiB, (before, after)
