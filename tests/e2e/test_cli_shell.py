"""``corral workspaces shell`` in a real terminal: the CLI runs inside a detached tmux session (a real pty, resizable)
against a real server and a gVisor workspace, driven with send-keys and read with capture-pane.

Full-screen programs run as in ``docker exec -it``: ``vi`` (the base image's vim-tiny) edits and saves a file,
``less`` and ``top`` switch to the alternate screen, read single raw keys and leave on ``q``.
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, gvisor_workspace
from tests.e2e.test_cli import CORRAL, _env

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"


@dataclass
class Tmux:
    """One detached tmux server (its own socket) and its session ``main``."""

    socket: str

    def __call__(self, *args: str) -> str:
        """Run a tmux command on this server and return its output."""
        proc = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True)
        return proc.stdout

    def keys(self, *keys: str) -> None:
        """Type ``keys`` (tmux key names, or literal text with ``-l``) into the session."""
        self("send-keys", "-t", "main", *keys)

    def screen(self) -> str:
        """What the session's pane shows now."""
        return self("capture-pane", "-p", "-t", "main")

    def wait_for(self, check: Callable[[str], bool], what: str, deadline_s: float = 60) -> str:
        """Poll the screen until ``check`` holds, with a deadline."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            screen = self.screen()
            if check(screen):
                return screen
            time.sleep(0.1)
        pytest.fail(f"{what} did not happen within {deadline_s} s; the screen shows:\n{self.screen()}")


@pytest.fixture
def workspace(server: Server) -> Iterator[str]:
    """A gVisor workspace, destroyed at the end."""
    with gvisor_workspace(server) as workspace_id:
        yield workspace_id


@pytest.fixture
def shell_in_tmux(server: Server, workspace: str, tmp_path: Path) -> Iterator[tuple[Tmux, Path]]:
    """``corral workspaces shell`` running in a 100x30 tmux session; the file that receives, once it ends, its exit
    code and whether the local terminal's settings were restored."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    tmux = Tmux(f"corral-test-{secrets.token_hex(4)}")
    status = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in _env(server).items() if k.startswith("CORRAL_") or k == "PATH")
    shell = shlex.join([*CORRAL, "workspaces", "shell", workspace])
    script = (
        f'before=$(stty -g); env {env} {shell}; code=$?; after=$(stty -g); echo "$code" > {status}; '
        f'[ "$before" = "$after" ] && echo restored >> {status}; sleep 60'
    )
    tmux("new-session", "-d", "-s", "main", "-x", "100", "-y", "30", "bash", "--norc", "--noprofile", "-c", script)
    try:
        yield tmux, status
    finally:
        subprocess.run(["tmux", "-L", tmux.socket, "kill-server"], capture_output=True, check=False)


def _back_at_prompt(tmux: Tmux, after: str) -> None:
    """Wait for bash's prompt on the last line once a full-screen program quit. Readline sets the terminal up before
    it shows the prompt and discards what was typed meanwhile, so typing before the prompt is back loses the keys
    (under load this happened after vi: `echo saved3` vanished)."""
    tmux.wait_for(lambda s: s.rstrip().endswith(":/workspace#"), f"the prompt after {after}")


def _prompt_after(tmux: Tmux, marker: str) -> str:
    """Type ``echo <marker>`` and wait for its output line (the shell is ready and echoes)."""
    tmux.keys("-l", f"echo {marker[:3]}''{marker[3:]}")
    tmux.keys("Enter")
    return tmux.wait_for(lambda s: marker in s.replace(f"{marker[:3]}''{marker[3:]}", ""), f"echo {marker}")


def test_shell_runs_full_screen_programs_resizes_and_exits_with_the_remote_code(
    server: Server, workspace: str, shell_in_tmux: tuple[Tmux, Path]
) -> None:
    """In a real terminal the shell takes typing, Ctrl-C goes to the remote command (raw mode), the window size
    follows tmux (also after a resize), less and top run full screen and quit on ``q``, vi edits and saves a file,
    and ``exit 5`` makes the CLI exit 5 with the local terminal restored."""
    tmux, status = shell_in_tmux
    # Type only once bash shows its prompt: readline discards what was typed while it set the terminal up.
    tmux.wait_for(lambda s: s.rstrip().endswith(":/workspace#"), "the login shell's prompt")
    _prompt_after(tmux, "ready1")
    tmux.keys("-l", "stty size")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "30 100" in s, "stty size showing 30 100")

    tmux("resize-window", "-t", "main", "-x", "120", "-y", "40")
    tmux.keys("-l", "clear; stty size")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "40 120" in s, "stty size showing 40 120 after the window grew")

    tmux.keys("-l", "sleep 300")
    tmux.keys("Enter")
    # Ctrl-C once sleep runs, as a person would: pressed while bash is still starting it, the terminal's SIGINT goes
    # to bash's own process group and sleep keeps running (bash's race, as in any terminal).
    _wait_for_process(server, workspace, "sleep", running=True)
    tmux.keys("C-c")
    _prompt_after(tmux, "alive2")  # the shell survived Ctrl-C: it went to the remote sleep, not the CLI
    _wait_for_process(server, workspace, "sleep", running=False)

    tmux.keys("-l", "printf 'line %s\\n' $(seq 1 200) > /workspace/long.txt; less /workspace/long.txt")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "line 1\n" in s and "line 39" in s and "line 41" not in s, "less showing one page")
    tmux.keys("G")  # to the end: a raw single key, no Enter
    tmux.wait_for(lambda s: "line 200" in s and "(END)" in s, "less at the end of the file")
    tmux.keys("q")
    tmux.wait_for(lambda s: "line 200" not in s, "less gone (the alternate screen left)")
    _back_at_prompt(tmux, "less")

    tmux.keys("-l", "top -d 1")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "load average" in s and "PID" in s, "top's full screen")
    tmux.keys("q")
    tmux.wait_for(lambda s: "load average" not in s, "top gone")
    _back_at_prompt(tmux, "top")

    tmux.keys("-l", "vi /workspace/notes.txt")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: '"/workspace/notes.txt"' in s and "~" in s, "vi's empty buffer")
    tmux.keys("i")  # insert mode, then text, Escape, and :wq: raw keys all the way to vi
    tmux.keys("-l", "typed in vi")
    tmux.keys("Escape")
    tmux.keys("-l", ":wq")
    tmux.keys("Enter")
    _back_at_prompt(tmux, "vi")
    _prompt_after(tmux, "saved3")
    saved = server.client.get(f"{API}/{workspace}/files", params={"path": "/workspace/notes.txt"})
    assert (saved.status_code, saved.text) == (200, "typed in vi\n")

    tmux.keys("-l", "exit 5")
    tmux.keys("Enter")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_lines(status)) < 2:
        time.sleep(0.1)
    assert _lines(status) == ["5", "restored"], tmux.screen()


def _wait_for_process(server: Server, workspace: str, name: str, *, running: bool, deadline_s: float = 60) -> None:
    """Wait until a process called ``name`` runs in the workspace (or, ``running`` False, none does)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = server.client.post(f"{API}/{workspace}/exec", json={"command": f"pgrep -x {shlex.quote(name)}"})
        assert found.status_code == 200, found.text
        if (found.json()["exit_code"] == 0) == running:
            return
        time.sleep(0.05)
    pytest.fail(f"{name} {'never ran' if running else 'still runs'} after {deadline_s} s")


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_shell_command_option_and_errors(server: Server, workspace: str) -> None:
    """``--command`` runs one command and exits with its code; an unknown workspace is a one-line error (exit 1)."""
    proc = subprocess.run([*CORRAL, "workspaces", "shell", workspace, "--command", "echo hi; exit 6"],
                          env=_env(server), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          check=False)  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "hi" in proc.stdout
    missing = subprocess.run([*CORRAL, "workspaces", "shell", "nope"], env=_env(server), capture_output=True,
                             text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.startswith("error: workspace_not_found: ") and missing.stderr.count("\n") == 1
