"""The agent's ``pty`` operation, with the agent run on the host: a command gets a real pseudo-terminal (as its own
child, or through the spawner), input reaches it, resize changes its size, and kill and exit end it with a code."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from corral.errors import InvalidRequestError
from corral.guest.client import GuestConnection, GuestTerminal

pytestmark = [pytest.mark.unit]

DEADLINE_S = 10.0


class Screen:
    """What a terminal showed, read by a background task, and its exit frame."""

    def __init__(self, terminal: GuestTerminal) -> None:
        self.output = bytearray()
        self.exit: dict[str, object] | None = None
        self.changed = asyncio.Event()
        self.task = asyncio.create_task(self._read(terminal))

    async def _read(self, terminal: GuestTerminal) -> None:
        async for header, payload in terminal.frames():
            if header["ev"] == "exit":
                self.exit = header
            else:
                self.output += payload
            self.changed.set()

    async def wait_for(self, text: bytes) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while text not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} never appeared; the terminal showed {bytes(self.output)!r}"
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    async def wait_exit(self) -> dict[str, object]:
        await asyncio.wait_for(self.task, DEADLINE_S)
        assert self.exit is not None
        return self.exit


async def _shell(conn: GuestConnection, tmp_path: Path, *, rows: int = 30, cols: int = 100) -> GuestTerminal:
    return await conn.open_pty(["/bin/sh"], cwd=str(tmp_path), env={"PS1": "$ "}, rows=rows, cols=cols, timeout_s=None)


async def test_a_shell_on_a_pty_echoes_input_and_sees_its_terminal(conn: GuestConnection, tmp_path: Path) -> None:
    """Typed input reaches the shell, which runs on a pts of the size asked for, in its cwd, with TERM set."""
    terminal = await _shell(conn, tmp_path)
    screen = Screen(terminal)
    await terminal.write(b"echo hi-$((40+2)); stty size; tty; pwd; echo $TERM\n")
    await screen.wait_for(b"hi-42")
    await screen.wait_for(b"30 100")
    await screen.wait_for(b"xterm-256color")
    assert b"/dev/pts/" in screen.output
    assert str(tmp_path).encode() in screen.output
    await terminal.write(b"exit 3\n")
    assert (await screen.wait_exit())["code"] == 3


async def test_resize_changes_what_the_command_sees(conn: GuestConnection, tmp_path: Path) -> None:
    """After a resize, ``stty size`` in the running shell reports the new rows and columns."""
    terminal = await _shell(conn, tmp_path)
    screen = Screen(terminal)
    await terminal.resize(51, 133)
    await terminal.write(b"stty size\n")
    await screen.wait_for(b"51 133")
    await terminal.kill()
    await screen.wait_exit()


async def test_kill_ends_the_command_and_its_terminal(conn: GuestConnection, tmp_path: Path) -> None:
    """A kill ends a command that would run forever, reporting death by SIGKILL (137)."""
    terminal = await conn.open_pty(["sleep", "1000"], cwd=str(tmp_path), env={}, rows=24, cols=80, timeout_s=None)
    screen = Screen(terminal)
    await terminal.kill()
    assert (await screen.wait_exit())["code"] == 137


async def test_a_deadline_kills_a_terminal_command(conn: GuestConnection, tmp_path: Path) -> None:
    """A terminal command past its deadline is killed and its exit says it timed out."""
    terminal = await conn.open_pty(["sleep", "1000"], cwd=str(tmp_path), env={}, rows=24, cols=80, timeout_s=0.3)
    exit_frame = await Screen(terminal).wait_exit()
    assert exit_frame["timed_out"] is True


async def test_input_for_a_terminal_that_ended_is_refused(conn: GuestConnection, tmp_path: Path) -> None:
    """Input or a resize for a terminal whose command has ended fails with a clear error, not silently."""
    terminal = await conn.open_pty(["true"], cwd=str(tmp_path), env={}, rows=24, cols=80, timeout_s=None)
    assert (await Screen(terminal).wait_exit())["code"] == 0
    with pytest.raises(InvalidRequestError, match="no terminal"):
        await terminal.write(b"x")
    with pytest.raises(InvalidRequestError, match="no terminal"):
        await terminal.resize(10, 10)


async def test_a_missing_program_exits_127(conn: GuestConnection, tmp_path: Path) -> None:
    """A program that does not exist ends at once with 127 and says so on the terminal, as a shell would."""
    terminal = await conn.open_pty(["/no/such/program"], cwd=str(tmp_path), env={}, rows=24, cols=80, timeout_s=None)
    screen = Screen(terminal)
    assert (await screen.wait_exit())["code"] == 127
    assert b"not found" in screen.output


async def test_a_bad_size_is_refused(conn: GuestConnection, tmp_path: Path) -> None:
    """A size outside a terminal's 16-bit fields is refused by name."""
    terminal = await conn.open_pty(["/bin/sh"], cwd=str(tmp_path), env={}, rows=0, cols=80, timeout_s=None)
    with pytest.raises(InvalidRequestError, match="rows must be between 1 and 65535"):
        async for _ in terminal.frames():
            pass
