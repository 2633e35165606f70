"""PTYs through the unmodified E2B SDK on a real gVisor workspace: ``sandbox.pty`` create, send_stdin, resize,
connect and kill, served by Corral's envd over the guest agent's ``pty`` operation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, serving_e2b
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Corral server on gVisor for the module; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-pty") as server:
        yield server


def test_a_pty_types_resizes_reconnects_and_exits(e2b_server: Server, tmp_path: Path) -> None:
    """pty.create with size, cwd and envs; typed input shows up in on_pty; resize changes ``stty size``; a second
    listener from pty.connect sees later output; ``exit 3`` ends both with 3; pty.kill ends another PTY."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json, threading, time
        from e2b import CommandExitException, Sandbox
        from e2b.sandbox.commands.command_handle import PtySize

        results = {}

        def pump(name, handle, sink):
            try:
                results[name] = handle.wait(on_pty=sink.extend).exit_code
            except CommandExitException as exc:
                results[name] = exc.exit_code
            except Exception as exc:
                results[name] = repr(exc)

        def until(sink, text, timeout=60):
            deadline = time.monotonic() + timeout
            while text not in sink:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{text!r} never appeared in {bytes(sink)!r}")
                time.sleep(0.02)

        sandbox = Sandbox.create(allow_internet_access=False)
        report = {}
        try:
            first = bytearray()
            handle = sandbox.pty.create(PtySize(rows=30, cols=100), cwd="/tmp", envs={"MARK": "m-1"}, timeout=0)
            reader = threading.Thread(target=pump, args=("first", handle, first))
            reader.start()
            sandbox.pty.send_stdin(handle.pid, b"echo hi-$((40+2)) $MARK $TERM; pwd; stty size; tty\\n")
            until(first, b"hi-42 m-1 xterm-256color")
            until(first, b"30 100")
            until(first, b"/dev/pts/")  # tty names the terminal: the shell's stdin is a pty
            report["pwd"] = b"\\n/tmp\\r" in first
            sandbox.pty.resize(handle.pid, PtySize(rows=51, cols=133))
            sandbox.pty.send_stdin(handle.pid, b"stty size\\n")
            until(first, b"51 133")
            report["listed"] = handle.pid in [p.pid for p in sandbox.commands.list()]

            second = bytearray()
            joined = sandbox.pty.connect(handle.pid, timeout=0)
            listener = threading.Thread(target=pump, args=("second", joined, second))
            listener.start()
            sandbox.pty.send_stdin(handle.pid, b"echo again-$((1+1))\\n")
            until(second, b"again-2")
            until(first, b"again-2")
            sandbox.pty.send_stdin(handle.pid, b"exit 3\\n")
            reader.join(60)
            listener.join(60)

            doomed = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=0)
            killed = threading.Thread(target=pump, args=("killed", doomed, bytearray()))
            killed.start()
            report["kill"] = sandbox.pty.kill(doomed.pid)
            killed.join(60)
            report["kill_again"] = sandbox.pty.kill(doomed.pid)
            report["results"] = results
        finally:
            sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert (report["pwd"], report["listed"]) == (True, True)
    assert report["results"]["first"] == 3
    assert report["results"]["second"] == 3
    assert (report["kill"], report["kill_again"]) == (True, False)
    assert report["results"]["killed"] == -1  # envd's exit code for a process ended by a signal
