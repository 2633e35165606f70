"""The unmodified E2B SDK against a real Corral server (gVisor underneath), as a user would run it.

Every test writes a plain user script that imports ``e2b`` and nothing of Corral, and runs it in a fresh Python
process whose only configuration is the environment DESIGN.md documents: ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and
``E2B_API_KEY``. The script prints one JSON line with what it saw; the test checks it, and checks the server side
(workspace records, Docker objects) where that says more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import TOKEN, Server, docker_inspect, serving_e2b

pytestmark = pytest.mark.e2e

API = "/api/v1/agent/workspaces"


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Corral server on gVisor for the module; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-sdk") as server:
        yield server


def run_user_script(server: Server, tmp_path: Path, source: str) -> dict[str, Any]:
    """Run ``source`` as a user's script with only the E2B_* variables pointing at ``server``; its last line is JSON."""
    script = tmp_path / "user_script.py"
    # Once the script has printed its report, end the process at once: the SDK's process was seen (once in many CI
    # runs) to abort with SIGABRT during interpreter teardown, after finishing its work correctly; teardown of a
    # native extension is not what these tests check.
    epilogue = "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_os._exit(0)\n"
    script.write_text(textwrap.dedent(source) + epilogue)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {
        "E2B_API_URL": f"{server.url}/e2b",
        "E2B_SANDBOX_URL": f"{server.url}/e2b/envd",
        "E2B_API_KEY": TOKEN,
    }
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, f"user script failed:\n{proc.stderr}\n--- server log ---\n{server.log()[-5000:]}"
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def test_create_run_and_kill(e2b_server: Server, tmp_path: Path) -> None:
    """Sandbox.create, commands.run with output callbacks and sandbox envs, CommandExitException on a nonzero exit,
    get_info and list, then kill: the workspace and its container are gone and a second kill says so."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json
        from e2b import CommandExitException, Sandbox

        sandbox = Sandbox.create(metadata={"team": "corral"}, envs={"GREETING": "hello"}, allow_internet_access=False)
        out, err = [], []
        command = 'echo "$GREETING world"; echo oops >&2'
        result = sandbox.commands.run(command, on_stdout=out.append, on_stderr=err.append)
        try:
            sandbox.commands.run("echo partial; exit 3", envs={"UNUSED": "1"})
            failure = None
        except CommandExitException as exc:
            failure = {"exit_code": exc.exit_code, "stdout": exc.stdout, "class": type(exc).__name__}
        info = sandbox.get_info()
        report = {
            "id": sandbox.sandbox_id,
            "stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code,
            "callback_out": out, "callback_err": err,
            "failure": failure,
            "cwd": sandbox.commands.run("pwd").stdout,
            "state": info.state.value, "metadata": info.metadata, "template": info.template_id,
            "listed": [s.sandbox_id for s in Sandbox.list().next_items()],
            "running": sandbox.is_running(),
        }
        report["killed"] = sandbox.kill()
        report["killed_again"] = Sandbox.kill(report["id"])
        report["running_after_kill"] = sandbox.is_running()
        print(json.dumps(report))
        """,
    )
    assert (report["stdout"], report["stderr"], report["exit_code"]) == ("hello world\n", "oops\n", 0)
    assert (report["callback_out"], report["callback_err"]) == (["hello world\n"], ["oops\n"])
    assert report["failure"] == {"exit_code": 3, "stdout": "partial\n", "class": "CommandExitException"}
    assert report["cwd"] == "/workspace\n"
    assert (report["state"], report["metadata"], report["template"]) == ("running", {"team": "corral"}, "base")
    assert report["id"] in report["listed"]
    assert (report["running"], report["killed"], report["killed_again"]) == (True, True, False)
    assert report["running_after_kill"] is False
    workspace = e2b_server.client.get(f"{API}/{report['id']}").json()
    assert (workspace["status"], workspace["provider"], workspace["network"]) == ("destroyed", "gvisor", "isolated")
    assert docker_inspect("container", f"corral-{report['id']}") is None
    assert docker_inspect("volume", f"agent-workspace-{report['id']}") is None


def test_background_commands_stdin_and_kill(e2b_server: Server, tmp_path: Path) -> None:
    """Background commands: wait() on a finished one, commands.list and handle.kill() on a running one (wait then
    raises CommandExitException), reconnecting to a command by pid, and stdin sent then closed."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json
        from e2b import CommandExitException, Sandbox

        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            quick = sandbox.commands.run("echo background-done", background=True)
            quick_result = quick.wait()

            sleeper = sandbox.commands.run("sleep 30", background=True, timeout=0)
            listed = [p.pid for p in sandbox.commands.list()]
            killed = sleeper.kill()
            try:
                sleeper.wait()
                killed_wait = None
            except CommandExitException as exc:
                killed_wait = {"exit_code": exc.exit_code}
            left = [p.pid for p in sandbox.commands.list()]

            slow = sandbox.commands.run("sleep 2; echo later", background=True)
            again = sandbox.commands.connect(slow.pid)
            reconnected = again.wait()

            reader = sandbox.commands.run("cat; echo end-of-input", background=True, stdin=True)
            sandbox.commands.send_stdin(reader.pid, "hello ")
            reader.send_stdin(b"stdin\\n")
            reader.close_stdin()
            read = reader.wait()

            print(json.dumps({
                "quick": [quick_result.stdout, quick_result.exit_code],
                "sleeper_pid": sleeper.pid, "listed": listed, "killed": killed, "killed_wait": killed_wait,
                "left": left, "kill_unknown": sandbox.commands.kill(999999),
                "reconnected": [reconnected.stdout, reconnected.exit_code],
                "stdin": read.stdout,
            }))
        finally:
            sandbox.kill()
        """,
    )
    assert report["quick"] == ["background-done\n", 0]
    assert report["sleeper_pid"] in report["listed"]
    assert report["killed"] is True
    assert report["killed_wait"] == {"exit_code": -1}, "envd reports a killed command as exit code -1"
    assert report["sleeper_pid"] not in report["left"]
    assert report["kill_unknown"] is False
    assert report["reconnected"] == ["later\n", 0]
    assert report["stdin"] == "hello stdin\nend-of-input\n"


def test_files(e2b_server: Server, tmp_path: Path) -> None:
    """files.write/read (text and bytes), write_files, list, exists, make_dir, rename and remove, with the
    SDK's own FileNotFoundException for a missing file, the files shared with commands, and the signed URLs of
    download_url/upload_url fetched without any header."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json
        import urllib.request

        import httpx
        from e2b import FileNotFoundException, Sandbox

        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            written = sandbox.files.write("/workspace/notes/hello.txt", "hi there\\n")
            sandbox.files.write("/workspace/notes/all.bin", bytes(range(256)))
            sandbox.files.write_files([
                {"path": "/workspace/many/a.txt", "data": "a"},
                {"path": "/workspace/many/b.txt", "data": b"b"},
            ])
            text = sandbox.files.read("/workspace/notes/hello.txt")
            binary = sandbox.files.read("/workspace/notes/all.bin", format="bytes")
            listing = sorted((e.name, e.type.value, e.size) for e in sandbox.files.list("/workspace/notes"))
            deep = sorted(e.path for e in sandbox.files.list("/workspace", depth=2))
            made = [sandbox.files.make_dir("/workspace/new/dir"), sandbox.files.make_dir("/workspace/new/dir")]
            renamed = sandbox.files.rename("/workspace/notes/hello.txt", "/workspace/new/dir/moved.txt")
            exists = [sandbox.files.exists(p) for p in ("/workspace/new/dir/moved.txt", "/workspace/notes/hello.txt")]
            seen_by_command = sandbox.commands.run("cat /workspace/new/dir/moved.txt /workspace/many/a.txt").stdout
            sandbox.commands.run("echo from-command > /workspace/cmd.txt")
            from_command = sandbox.files.read("/workspace/cmd.txt")
            signed_url = sandbox.download_url("/workspace/notes/all.bin", use_signature_expiration=120)
            signed_download = urllib.request.urlopen(signed_url).read() == bytes(range(256))
            upload_url = sandbox.upload_url("/workspace/signed/up.txt")
            signed_upload = httpx.post(upload_url, files={"file": ("up.txt", b"via signed url")}).status_code
            signed_uploaded = sandbox.files.read("/workspace/signed/up.txt")
            sandbox.files.remove("/workspace/new")
            try:
                sandbox.files.read("/workspace/new/dir/moved.txt")
                missing = None
            except FileNotFoundException as exc:
                missing = type(exc).__name__
            print(json.dumps({
                "written": [written.name, written.path],
                "text": text, "binary_ok": bytes(binary) == bytes(range(256)), "listing": listing, "deep": deep,
                "made": made, "renamed": [renamed.name, renamed.path, renamed.type.value], "exists": exists,
                "seen_by_command": seen_by_command, "from_command": from_command,
                "gone": sandbox.files.exists("/workspace/new"), "missing": missing,
                "signed": [signed_download, signed_upload, signed_uploaded],
            }))
        finally:
            sandbox.kill()
        """,
    )
    assert report["written"] == ["hello.txt", "/workspace/notes/hello.txt"]
    assert report["text"] == "hi there\n"
    assert report["binary_ok"] is True
    assert report["listing"] == [["all.bin", "file", 256], ["hello.txt", "file", 9]]
    assert {"/workspace/many", "/workspace/many/a.txt", "/workspace/notes/all.bin"} <= set(report["deep"])
    assert report["made"] == [True, False]
    assert report["renamed"] == ["moved.txt", "/workspace/new/dir/moved.txt", "file"]
    assert report["exists"] == [True, False]
    assert report["seen_by_command"] == "hi there\na"
    assert report["from_command"] == "from-command\n"
    assert (report["gone"], report["missing"]) == (False, "FileNotFoundException")
    assert report["signed"] == [True, 200, "via signed url"], "download_url/upload_url work without headers"


def test_pause_and_resume_by_connect(e2b_server: Server, tmp_path: Path) -> None:
    """pause() pauses the workspace (commands then raise SandboxNotRunningException) and Sandbox.connect resumes it
    with its files intact (memory and processes: tests/e2e/test_e2b_stateful.py)."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json
        from e2b import Sandbox, SandboxNotRunningException

        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            sandbox.files.write("/workspace/state.txt", "kept across pause")
            paused = sandbox.pause()
            state_paused = Sandbox.get_info(sandbox.sandbox_id).state.value
            try:
                sandbox.commands.run("true")
                while_paused = None
            except SandboxNotRunningException as exc:
                while_paused = type(exc).__name__
            running_while_paused = sandbox.is_running()
            again = Sandbox.connect(sandbox.sandbox_id)
            print(json.dumps({
                "id": sandbox.sandbox_id, "paused": paused, "state_paused": state_paused,
                "while_paused": while_paused, "running_while_paused": running_while_paused,
                "same_id": again.sandbox_id == sandbox.sandbox_id,
                "state_resumed": again.get_info().state.value,
                "file": again.files.read("/workspace/state.txt"),
                "command": again.commands.run("cat /workspace/state.txt").stdout,
                "old_handle_works": sandbox.commands.run("echo old handle").stdout,
            }))
        finally:
            sandbox.kill()
        """,
    )
    assert (report["paused"], report["state_paused"]) == (True, "paused")
    assert (report["while_paused"], report["running_while_paused"]) == ("SandboxNotRunningException", False)
    assert (report["same_id"], report["state_resumed"]) == (True, "running")
    assert report["file"] == report["command"] == "kept across pause"
    assert report["old_handle_works"] == "old handle\n"


def test_timeout_kills_the_sandbox(e2b_server: Server, tmp_path: Path) -> None:
    """A sandbox past its timeout (set_timeout) is killed by the server: get_info then raises
    SandboxNotFoundException, and the workspace is destroyed."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json, time
        from e2b import Sandbox, SandboxNotFoundException

        sandbox = Sandbox.create(timeout=120, allow_internet_access=False)
        sandbox.set_timeout(2)
        deadline = time.monotonic() + 60
        outcome = None
        while time.monotonic() < deadline:
            try:
                Sandbox.get_info(sandbox.sandbox_id)
            except SandboxNotFoundException as exc:
                outcome = type(exc).__name__
                break
            time.sleep(0.2)
        print(json.dumps({"id": sandbox.sandbox_id, "outcome": outcome}))
        """,
    )
    assert report["outcome"] == "SandboxNotFoundException"
    assert e2b_server.client.get(f"{API}/{report['id']}").json()["status"] == "destroyed"


def test_async_sdk_streams_output_as_produced(e2b_server: Server, tmp_path: Path) -> None:
    """AsyncSandbox: an async on_stdout callback sees each line when the command prints it, well before it exits,
    and files and kill work as with the sync SDK."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import asyncio, json, time
        from e2b import AsyncSandbox

        async def main():
            sandbox = await AsyncSandbox.create(allow_internet_access=False)
            try:
                seen = []
                async def on_stdout(line):
                    seen.append((line, time.monotonic()))
                result = await sandbox.commands.run("echo first; sleep 1; echo second", on_stdout=on_stdout)
                finished = time.monotonic()
                await sandbox.files.write("/workspace/async.txt", "async ok")
                return {
                    "lines": [line for line, _ in seen], "stdout": result.stdout,
                    "first_ahead_s": finished - seen[0][1],
                    "file": await sandbox.files.read("/workspace/async.txt"),
                }
            finally:
                await sandbox.kill()

        print(json.dumps(asyncio.run(main())))
        """,
    )
    assert report["lines"] == ["first\n", "second\n"]
    assert report["stdout"] == "first\nsecond\n"
    assert report["first_ahead_s"] >= 0.5, "the first line was held back until the command ended"
    assert report["file"] == "async ok"
