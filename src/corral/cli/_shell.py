"""``corral workspaces shell``: an interactive terminal in a workspace, like ``docker exec -it``, over the PTY
WebSocket (``GET /api/v1/agent/workspaces/{id}/pty``).

The local terminal is put in raw mode, so every key (Ctrl-C, arrows, Escape) goes to the remote program, and is
restored on the way out whatever happens. Window size changes (SIGWINCH) are sent as resize messages. The command's
exit code becomes this process's. With stdin not a terminal (a pipe, a file), its bytes are typed as they come and
its end is typed as Ctrl-D.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import termios
import tty
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

__all__ = ["ShellOutcome", "run_shell"]

READ_CHUNK = 16 * 1024
"""Bytes read from the local terminal at once (below the server's 64 KiB per message)."""
EOF_KEY = b"\x04"  # Ctrl-D: what a terminal sends at the end of input


@dataclass(frozen=True, slots=True)
class ShellOutcome:
    """How a shell session ended: the remote exit code, or an error to print as ``error: code: message``."""

    exit_code: int
    error: tuple[str, str] | None = None


def _size() -> tuple[int, int]:
    for stream in (sys.stdout, sys.stdin, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            size = os.get_terminal_size(stream.fileno())
            if size.lines > 0 and size.columns > 0:
                return size.lines, size.columns
    return 24, 80


def pty_url(base_url: str, workspace_id: str, *, rows: int, cols: int, command: str | None, cwd: str | None) -> str:
    """The WebSocket URL of a workspace's terminal (``ws://`` for ``http://``, ``wss://`` for ``https://``)."""
    parts = urlsplit(base_url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    query = {"rows": str(rows), "cols": str(cols)}
    if command is not None:
        query["command"] = command
    if cwd is not None:
        query["cwd"] = cwd
    path = f"{parts.path.rstrip('/')}/api/v1/agent/workspaces/{workspace_id}/pty"
    return urlunsplit((scheme, parts.netloc, path, urlencode(query), ""))


@contextlib.contextmanager
def _raw_terminal(fd: int) -> Iterator[None]:
    """Raw mode on ``fd`` when it is a terminal, restored on exit (even on errors); nothing otherwise."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run_shell(
    base_url: str, token: str | None, workspace_id: str, *, command: str | None = None, cwd: str | None = None
) -> ShellOutcome:
    """Open a terminal in the workspace and connect it to this process's stdin and stdout until it ends.

    Args:
        base_url: The server (``http://127.0.0.1:8000``).
        token: The API token, sent as ``Authorization: Bearer``.
        workspace_id: The workspace.
        command: A shell command line to run instead of an interactive login shell.
        cwd: Its working directory (default /workspace).

    Returns:
        The remote command's exit code, or the error that ended the session.
    """
    stdin_fd = sys.stdin.fileno()
    rows, cols = _size()
    url = pty_url(base_url, workspace_id, rows=rows, cols=cols, command=command, cwd=cwd)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with _raw_terminal(stdin_fd):
        return asyncio.run(_session(url, headers, stdin_fd, sys.stdout.fileno()))


class _Keyboard:
    """Local input to the socket: bytes typed (or piped) as they come, with backpressure, and resizes."""

    def __init__(self, websocket: ClientConnection, stdin_fd: int) -> None:
        self.websocket = websocket
        self.fd = stdin_fd
        self.loop = asyncio.get_running_loop()
        self.typed: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)  # bounded: a fast pipe waits for the socket
        self.interactive = os.isatty(stdin_fd)
        self.reading = self.at_end = False
        self.resizes: set[asyncio.Task[None]] = set()

    def pause(self, paused: bool) -> None:
        if paused and self.reading:
            self.loop.remove_reader(self.fd)
        elif not paused and not self.reading and not self.at_end:
            self.loop.add_reader(self.fd, self.readable)
        self.reading = not paused and not self.at_end

    def readable(self) -> None:
        data = os.read(self.fd, READ_CHUNK)
        if not data:
            self.pause(True)
            self.at_end = True
            if not self.interactive:
                self.typed.put_nowait(EOF_KEY)
            return
        self.typed.put_nowait(data)
        if self.typed.full():
            self.pause(True)  # resumed once the sender has caught up

    async def send_typed(self) -> None:
        while True:
            data = await self.typed.get()
            self.pause(False)
            await self.websocket.send(data)

    async def send_file(self) -> None:
        # epoll cannot watch a regular file (stdin redirected from one): read it in chunks instead.
        while data := os.read(self.fd, READ_CHUNK):
            await self.websocket.send(data)
        await self.websocket.send(EOF_KEY)

    def resized(self) -> None:
        rows, cols = _size()
        task = self.loop.create_task(self.websocket.send(json.dumps({"type": "resize", "rows": rows, "cols": cols})))
        self.resizes.add(task)
        task.add_done_callback(self.resizes.discard)

    def start(self) -> asyncio.Task[None]:
        """Start forwarding; returns the sending task."""
        with contextlib.suppress(NotImplementedError, ValueError):  # no SIGWINCH off Unix, or off the main thread
            self.loop.add_signal_handler(signal.SIGWINCH, self.resized)
        try:
            self.pause(False)
        except PermissionError:
            return asyncio.create_task(self.send_file())
        return asyncio.create_task(self.send_typed())

    def stop(self) -> None:
        """Stop reading the terminal and watching its size."""
        self.pause(True)
        with contextlib.suppress(NotImplementedError, ValueError):
            self.loop.remove_signal_handler(signal.SIGWINCH)
        for task in self.resizes:
            task.cancel()


async def _session(url: str, headers: dict[str, str], stdin_fd: int, stdout_fd: int) -> ShellOutcome:
    try:
        websocket = await connect(url, additional_headers=headers, max_size=None, open_timeout=60)
    except InvalidStatus as exc:
        return ShellOutcome(1, _refusal(exc))
    except (InvalidHandshake, OSError, TimeoutError) as exc:
        return ShellOutcome(1, ("connection_error", f"could not open the terminal at {url}: {exc}"))
    keyboard = _Keyboard(websocket, stdin_fd)
    sender = keyboard.start()
    try:
        return await _receive(websocket, stdout_fd)
    finally:
        keyboard.stop()
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await sender
        await websocket.close()


async def _receive(websocket: ClientConnection, stdout_fd: int) -> ShellOutcome:
    """Write the terminal's output until the exit or error frame (or the connection ends without one)."""
    try:
        async for message in websocket:
            if isinstance(message, bytes):
                _write_all(stdout_fd, message)
                continue
            frame = json.loads(message)
            if frame.get("type") == "exit":
                return ShellOutcome(int(frame.get("exit_code", 1)))
            if frame.get("type") == "error":
                return ShellOutcome(1, (str(frame.get("code")), str(frame.get("message"))))
    except ConnectionClosed:
        pass
    code = websocket.close_code
    return ShellOutcome(1, ("connection_error", f"the terminal closed without an exit status (close code {code})"))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _refusal(exc: InvalidStatus) -> tuple[str, str]:
    response = exc.response
    try:
        error = json.loads(response.body or b"")["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return "http_error", f"the server refused the terminal: HTTP {response.status_code}"
