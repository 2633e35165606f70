"""The agent's ``shell`` operation, with the agent run on the host (as its own child, or through the spawner) and the
bash tool's real driver script: one shell serves many calls, state lives on in it and on disk, completion is
signalled on its control socket, and exits, deadlines, kills and a command that forges its answer are all survived.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

import corral.guest.agent as agent_module
from corral.errors import TooManyRequestsError
from corral.guest.client import GuestConnection
from corral.tools.shell import PERSISTENT_SCRIPT

pytestmark = [pytest.mark.unit]

ARGV = ["/bin/bash", "-c", PERSISTENT_SCRIPT, "bash"]


def _seed(state: Path, cwd: Path) -> None:
    """A state directory whose saved working directory is ``cwd`` (this host has no /workspace)."""
    state.mkdir(mode=0o700)
    (state / "state.1").write_text(f"if (( 1 > __corral_gen )); then\n__corral_gen=1\n__corral_cwd={cwd}\nfi\n")


async def _run(
    conn: GuestConnection, state: Path, command: str, *, key: str = "s1", timeout_s: float | None = 30
) -> tuple[int, str, str, bool]:
    """One call: ``(exit code, stdout, stderr, timed_out)``."""
    out, err = bytearray(), bytearray()
    frames = conn.exec(
        [*ARGV, str(state)], cwd="/", env={}, timeout_s=timeout_s, op="shell", key=key, dir=str(state), command=command
    )
    async for header, payload in frames:
        if header["ev"] == "out":
            (out if header["fd"] == 1 else err).extend(payload)
        elif header["ev"] == "exit":
            return header["code"], out.decode(), err.decode(), header["timed_out"]
    raise AssertionError("no exit frame")


async def _shell_pid(conn: GuestConnection, state: Path, key: str = "s1") -> int:
    code, out, _, _ = await _run(conn, state, "echo $$", key=key)
    assert code == 0
    return int(out)


async def test_one_shell_serves_many_calls_and_keeps_its_state(conn: GuestConnection, tmp_path: Path) -> None:
    """Variables (exported or not), functions, the directory and output of both streams carry over in one shell
    process; the state is also on disk for a shell that starts later."""
    state = tmp_path / "state"
    _seed(state, tmp_path)
    (tmp_path / "sub").mkdir()
    pid = await _shell_pid(conn, state)
    assert await _run(conn, state, "export A=1; B=2; f() { echo f$1; }; cd sub") == (0, "", "", False)
    assert await _run(conn, state, 'echo "$A$B" $(f x) "$PWD"; echo oops >&2; false') == (
        1,
        f"12 fx {tmp_path}/sub\n",
        "oops\n",
        False,
    )
    assert await _shell_pid(conn, state) == pid
    saved = "".join(p.read_text() for p in state.glob("state.*"))
    assert 'declare -x A="1"' in saved and f"__corral_cwd={tmp_path}/sub" in saved
    assert (state / "command").stat().st_mode & 0o777 == 0o600


async def test_exit_and_set_e_end_the_shell_with_their_status_and_the_next_call_restores(
    conn: GuestConnection, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    _seed(state, tmp_path)
    pid = await _shell_pid(conn, state)
    assert await _run(conn, state, "export KEEP=yes; echo before; exit 3") == (3, "before\n", "", False)
    after = await _shell_pid(conn, state)
    assert after != pid
    assert await _run(conn, state, "echo $KEEP") == (0, "yes\n", "", False)
    assert await _run(conn, state, "set -e; export SEEN=1; false; echo never") == (1, "", "", False)
    assert await _run(conn, state, "echo $SEEN; false; echo set-e-was-only-for-that-call") == (
        0,
        "1\nset-e-was-only-for-that-call\n",
        "",
        False,
    )


async def test_a_deadline_kills_the_shell_and_its_jobs_and_keeps_the_state_of_the_call_before(
    conn: GuestConnection, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    _seed(state, tmp_path)
    assert (await _run(conn, state, "export V=old; sleep 300 & echo $! > job"))[0] == 0
    job = int((tmp_path / "job").read_text())
    os.kill(job, 0)  # a background job outlives its call while the shell lives
    started = time.monotonic()
    code, out, _, timed_out = await _run(conn, state, "export V=new; echo partial; sleep 300", timeout_s=0.5)
    assert (code, out, timed_out) == (137, "partial\n", True)
    assert time.monotonic() - started < 10
    assert await _gone(job)
    assert await _run(conn, state, "echo $V") == (0, "old\n", "", False)


async def _gone(pid: int, deadline_s: float = 5) -> bool:
    """Whether the process ``pid`` ends (or is a zombie) within ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not; one reaped between the two checks neither)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


async def test_stdin_is_not_the_control_socket_and_redirections_do_not_stick(
    conn: GuestConnection, tmp_path: Path
) -> None:
    """A command reading stdin gets end of file (not the driver's socket); ``exec >file`` lasts one call."""
    state = tmp_path / "state"
    _seed(state, tmp_path)
    assert await _run(conn, state, "cat; echo read-nothing") == (0, "read-nothing\n", "", False)
    assert await _run(conn, state, f"exec >{tmp_path}/captured; echo into-file") == (0, "", "", False)
    assert (tmp_path / "captured").read_text() == "into-file\n"
    assert await _run(conn, state, "echo back") == (0, "back\n", "", False)


async def test_a_forged_answer_and_junk_on_the_socket_change_nothing_for_later_calls(
    conn: GuestConnection, tmp_path: Path
) -> None:
    """A command writing to the shell's control socket (through /proc) ends at worst its own call early: the next
    calls are answered by their own serials, and a flood without a newline gets the shell replaced."""
    state = tmp_path / "state"
    _seed(state, tmp_path)
    await _shell_pid(conn, state)
    await _run(conn, state, "printf '999 0\\n1 7\\n' >/proc/$$/fd/0 2>/dev/null || printf '999 0\\n' >&0")
    assert await _run(conn, state, "echo next; (exit 4)") == (4, "next\n", "", False)
    flood = "head -c 20000 /dev/zero | tr '\\0' x >/proc/$$/fd/0"
    _, _, _, timed_out = await _run(conn, state, flood)
    assert not timed_out
    assert await _run(conn, state, "echo still-served") == (0, "still-served\n", "", False)


async def test_shells_of_different_keys_are_separate_and_calls_of_one_key_take_turns(
    conn: GuestConnection, tmp_path: Path
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _seed(one, tmp_path)
    _seed(two, tmp_path)
    assert await _shell_pid(conn, one, "a") != await _shell_pid(conn, two, "b")
    results = await asyncio.gather(*(_run(conn, one, f"X=${{X}}{i}; sleep 0.05; echo $X", key="a") for i in range(4)))
    assert sorted(len(r[1].strip()) for r in results) == [1, 2, 3, 4]  # one after the other, each saw the one before


async def test_a_host_kill_ends_the_shell(conn: GuestConnection, tmp_path: Path) -> None:
    """Closing the call early (the host gave up) kills the shell; the next call starts a fresh one."""
    state = tmp_path / "state"
    _seed(state, tmp_path)
    pid = await _shell_pid(conn, state)
    frames = conn.exec(
        [*ARGV, str(state)], cwd="/", env={}, timeout_s=None, op="shell", key="s1", dir=str(state),
        command="echo started; sleep 300",
    )  # fmt: skip
    header, payload = await anext(frames)
    assert (header["ev"], payload) == ("out", b"started\n")
    await frames.aclose()
    assert await _gone(pid)
    assert await _shell_pid(conn, state) != pid


async def test_bad_requests_are_refused_by_name(conn: GuestConnection, tmp_path: Path) -> None:
    for field, value, message in [
        ("key", "", "key: must be a string of 1-128 characters"),
        ("dir", "relative", "dir: must be an absolute path"),
        ("command", "a\0b", "command: must be text without a NUL character"),
    ]:
        args = {"key": "k", "dir": str(tmp_path / "s"), "command": "true"} | {field: value}
        with pytest.raises(Exception, match=message):
            async for _ in conn.exec([*ARGV, str(tmp_path)], cwd="/", env={}, timeout_s=5, op="shell", **args):
                pass


async def test_what_the_workspace_plants_at_the_command_file_is_replaced_not_used(
    conn: GuestConnection, tmp_path: Path
) -> None:
    """A FIFO (which would block the agent's open) or a hard link to another file where the command goes is unlinked
    and a fresh file written; the linked file is untouched. A symlinked state directory is refused, not followed."""
    state = tmp_path / "state"
    _seed(state, tmp_path)
    os.mkfifo(state / "command")
    assert await _run(conn, state, "echo past-the-fifo", timeout_s=10) == (0, "past-the-fifo\n", "", False)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (state / "command").unlink()
    os.link(victim, state / "command")
    assert await _run(conn, state, "echo past-the-link") == (0, "past-the-link\n", "", False)
    assert victim.read_text() == "precious\n"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    with pytest.raises(Exception, match="linked: Not a directory"):
        await _run(conn, linked, "echo through-a-link", key="other")
    assert not (elsewhere / "command").exists()
    assert await _run(conn, state, "echo still-fine") == (0, "still-fine\n", "", False)


async def test_a_call_waiting_for_its_shell_keeps_its_own_deadline(conn: GuestConnection, tmp_path: Path) -> None:
    state = tmp_path / "state"
    _seed(state, tmp_path)
    slow = asyncio.create_task(_run(conn, state, "sleep 3; echo slow", timeout_s=20))
    await asyncio.sleep(0.5)
    started = time.monotonic()
    code, _, _, timed_out = await _run(conn, state, "echo never", timeout_s=0.5)
    assert (code, timed_out) == (137, True)
    assert time.monotonic() - started < 2.5  # it did not wait for the slow call
    assert await slow == (0, "slow\n", "", False)


async def test_past_the_shell_limit_a_call_is_refused_as_busy_and_idle_shells_make_room(
    conn: GuestConnection, tmp_path: Path
) -> None:
    """With every kept shell running a command, a new key is answered ``busy`` (the host then runs the command in a
    shell of its own); an idle shell is closed to make room for a new key."""
    states = []
    for i in range(agent_module.MAX_SHELLS):
        state = tmp_path / f"s{i}"
        _seed(state, tmp_path)
        states.append(state)
    running = [asyncio.create_task(_run(conn, s, "sleep 2", key=f"k{i}")) for i, s in enumerate(states)]
    await asyncio.sleep(1)
    extra = tmp_path / "extra"
    _seed(extra, tmp_path)
    with pytest.raises(TooManyRequestsError, match="shells are running commands already"):
        await _run(conn, extra, "echo no-room", key="extra")
    assert [(await r)[0] for r in running] == [0] * agent_module.MAX_SHELLS
    assert await _run(conn, extra, "echo room", key="extra") == (0, "room\n", "", False)


async def test_a_write_refuses_a_fifo_and_a_planted_hard_link(conn: GuestConnection, tmp_path: Path) -> None:
    """The agent's ``write`` op (files API, E2B) opens without blocking and checks what it opened: a FIFO is refused
    at once instead of hanging the agent, and a hard link of another owner's file is not handed to the user."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(Exception, match="fifo"):
        await asyncio.wait_for(conn.write(str(fifo), b"x", mode=None), 10)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # with a reader the open succeeds; the check still refuses
    try:
        with pytest.raises(Exception, match="not a regular file"):
            await asyncio.wait_for(conn.write(str(fifo), b"x", mode=None), 10)
    finally:
        os.close(reader)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chown(victim, 0, 0)
    os.link(victim, tmp_path / "planted")
    with pytest.raises(Exception, match="has other hard links"):
        await conn.write(str(tmp_path / "planted"), b"mine", mode=None, owner="nobody")
    assert victim.read_text() == "precious\n"
    assert await conn.write(str(tmp_path / "fresh"), b"ok", mode=None) == 2
    assert (tmp_path / "fresh").read_bytes() == b"ok"
