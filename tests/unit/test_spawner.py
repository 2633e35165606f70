"""The workspace spawner (src/corral/guest/spawner.c), compiled as the agent runtime compiles it and run on the host
with its own socket: the agent's client (``corral.guest.agent.Spawned``) starts commands through it, and hostile
connections (anyone root in a workspace can reach its socket) cost it nothing and never stop it."""

from __future__ import annotations

import errno
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.guest.agent import Spawned
from corral.providers.agent_runtime import spawner_source


@pytest.fixture(scope="module")
def spawner_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("spawner")
    (folder / "spawner.c").write_bytes(spawner_source())
    binary = folder / "spawner"
    subprocess.run(["gcc", "-static", "-Os", "-s", "-Wall", "-Werror", "-o", binary, folder / "spawner.c"], check=True)
    return binary


@pytest.fixture
def spawner_process(spawner_binary: Path, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The socket path and pid of a running spawner."""
    path = str(tmp_path / "spawner.sock")
    proc = subprocess.Popen([spawner_binary, path])
    deadline = time.monotonic() + 10
    while not os.path.exists(path):
        assert proc.poll() is None, "the spawner exited at start"
        assert time.monotonic() < deadline, "the spawner never listened"
        time.sleep(0.01)
    try:
        yield path, proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def spawner(spawner_process: tuple[str, int]) -> str:
    return spawner_process[0]


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return sock


def _run(path: str, argv: list[str], cwd: str = "/", env: dict[str, str] | None = None) -> tuple[int, bytes, bytes]:
    proc = Spawned.start(_connect(path), argv, cwd, env if env is not None else {"PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    code = proc.wait(10)
    proc.close()
    return code, out, err


def test_a_command_runs_with_its_argv_cwd_and_environment_only(spawner: str, tmp_path: Path) -> None:
    """argv (empty and spaced arguments intact), the working directory and exactly the given environment reach the
    command; its output comes back through the pipes and its exit status at the end."""
    code, out, _ = _run(
        spawner,
        ["sh", "-c", 'printf "%s|" "$1" "$2" "$(pwd)" "$ONLY"; env | wc -l; exit 3', "sh", "", "a b"],
        cwd=str(tmp_path),
        env={"PATH": "/usr/bin:/bin", "ONLY": "yes"},
    )
    assert code == 3
    assert out.decode().split("|")[:4] == ["", "a b", str(tmp_path), "yes"]
    assert int(out.decode().split("|")[4]) <= 4  # PATH, ONLY and what sh itself sets (PWD, SHLVL); nothing of ours


def test_commands_run_in_their_own_session_and_report_the_signal_that_killed_them(spawner: str) -> None:
    """Each command leads its own session (the agent kills its process group), and a command killed by a signal
    exits with minus that signal, as Popen reports it."""
    proc = Spawned.start(_connect(spawner), ["sh", "-c", "ps -o sid= -p $$; sleep 30"], "/", {"PATH": "/usr/bin:/bin"})
    assert proc.stdout is not None
    sid = int(proc.stdout.readline())
    assert sid == proc.pid
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    proc.close()


@pytest.mark.parametrize(
    ("argv", "cwd", "error", "filename"),
    [
        (["/no/such/program"], "/", FileNotFoundError, "/no/such/program"),
        (["no-such-program-anywhere"], "/", FileNotFoundError, "no-such-program-anywhere"),
        (["true"], "/no/such/dir", FileNotFoundError, "/no/such/dir"),
        (["/etc/passwd"], "/", PermissionError, "/etc/passwd"),
    ],
)
def test_a_command_that_cannot_start_raises_what_popen_raises(
    spawner: str, argv: list[str], cwd: str, error: type[OSError], filename: str
) -> None:
    """A missing program or directory and a file that is not executable raise the error Popen would, naming it."""
    with pytest.raises(error) as raised:
        Spawned.start(_connect(spawner), argv, cwd, {"PATH": "/usr/bin:/bin"})
    assert raised.value.filename == filename
    assert raised.value.errno in (errno.ENOENT, errno.EACCES)


def test_hostile_connections_never_stop_the_spawner(spawner: str) -> None:
    """Garbage, a huge declared length, no descriptors, a half-sent request held open, malformed counts and a request
    whose strings run past its end are each dropped; the spawner still starts the next command."""
    held = _connect(spawner)
    held.sendall(b"\x00\x00")  # half a header, held open: only its own handler waits on it
    attacks: list[bytes] = [
        b"garbage without descriptors",
        struct.pack(">I", 0xFFFFFFFF),
        struct.pack(">I", 0),
    ]
    for payload in attacks:
        with _connect(spawner) as sock:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
            assert _dropped(sock)
    bodies = [b"x\x00y\x00/\x00", b"1\x000\x00/\x00", b"99\x000\x00/\x00sh\x00", b"1\x00-1\x00/\x00true\x00", b"1\x000"]
    for body in bodies:
        with _connect(spawner) as sock, open(os.devnull, "rb") as null:
            fd = null.fileno()
            socket.send_fds(sock, [struct.pack(">I", len(body))], [fd, fd, fd])
            sock.sendall(body)
            sock.shutdown(socket.SHUT_WR)
            assert _dropped(sock), body
    assert _run(spawner, ["sh", "-c", "echo still here"])[:2] == (0, b"still here\n")
    held.close()


def _dropped(sock: socket.socket) -> bool:
    """Whether the spawner ended the connection without a word (a reset when it left our bytes unread)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def _children(pid: int) -> list[str]:
    """The states (R, S, Z...) of ``pid``'s children."""
    ps = subprocess.run(["ps", "-eo", "ppid=,stat="], capture_output=True, text=True, check=True).stdout
    return [line.split()[1] for line in ps.splitlines() if int(line.split()[0]) == pid]


def test_finished_commands_leave_no_zombies_behind(spawner_process: tuple[str, int]) -> None:
    """Handlers and commands are reaped: after many commands the spawner's only child is its idle handler (forked
    ahead of the next request), nothing defunct."""
    path, pid = spawner_process
    for _ in range(20):
        assert _run(path, ["true"])[0] == 0
    deadline = time.monotonic() + 5
    while (children := _children(pid)) != ["S"]:  # a handler may still be on its way out
        assert time.monotonic() < deadline, f"children under the spawner: {children}"
        time.sleep(0.05)


def test_an_idle_handler_killed_is_replaced_and_dies_with_the_spawner(spawner_binary: Path, tmp_path: Path) -> None:
    """Anyone in the workspace may kill the idle handler: the next command still starts. And once the spawner is
    gone, no idle handler is left waiting on its socket."""
    path = str(tmp_path / "spawner.sock")
    proc = subprocess.Popen([spawner_binary, path])
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(path) or not _pids_under(proc.pid):
            assert time.monotonic() < deadline, "the spawner never forked its idle handler"
            time.sleep(0.01)
        killed = _pids_under(proc.pid)
        for idle in killed:
            os.kill(idle, signal.SIGKILL)
        while not (_pids_under(proc.pid) and set(_pids_under(proc.pid)).isdisjoint(killed)):
            assert time.monotonic() < deadline, "the killed handler was not replaced"
            time.sleep(0.01)
        assert _run(path, ["sh", "-c", "echo again"])[:2] == (0, b"again\n")
        survivors = _pids_under(proc.pid)
        assert survivors
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 5
    while any(os.path.exists(f"/proc/{pid}") and _state(pid) != "Z" for pid in survivors):
        assert time.monotonic() < deadline, "an idle handler outlived the spawner"
        time.sleep(0.05)


def _pids_under(pid: int) -> list[int]:
    ps = subprocess.run(["ps", "-eo", "ppid=,pid="], capture_output=True, text=True, check=True).stdout
    return [int(line.split()[1]) for line in ps.splitlines() if int(line.split()[0]) == pid]


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "Z"


def test_a_command_runs_as_the_user_and_group_asked_for(spawner: str) -> None:
    """uid and gid (and only that group) apply before exec; -1 keeps root."""
    proc = Spawned.start(_connect(spawner), ["id"], "/", {"PATH": "/usr/bin:/bin"}, uid=1234, gid=2345)
    assert proc.stdout is not None
    out = proc.stdout.read().decode()
    assert proc.wait(10) == 0
    proc.close()
    assert out.split() == ["uid=1234", "gid=2345", "groups=2345"]
    assert _run(spawner, ["id", "-u"])[1] == b"0\n"


def test_a_terminal_command_gets_its_pty_as_controlling_terminal(spawner: str) -> None:
    """With a terminal, the pty slave is the command's stdin, stdout, stderr and controlling terminal (what a shell
    needs for job control and Ctrl-C): its output arrives on the master, and ^C typed there interrupts it."""
    master, slave = os.openpty()
    try:
        proc = Spawned.start(
            _connect(spawner),
            ["sh", "-c", "test -t 0 && ps -o tty= -p $$ && echo ready && exec sleep 30"],
            "/",
            {"PATH": "/usr/bin:/bin"},
            terminal=slave,
        )
        os.close(slave)
        slave = -1
        assert proc.stdout is None
        seen = b""
        deadline = time.monotonic() + 10
        while b"ready" not in seen:
            assert time.monotonic() < deadline, f"no output on the master: {seen!r}"
            seen += os.read(master, 1024)
        assert b"pts/" in seen, seen  # ps names the controlling terminal
        os.write(master, b"\x03")  # ^C: the terminal's line discipline signals the foreground group
        assert proc.wait(10) == -signal.SIGINT
        proc.close()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
