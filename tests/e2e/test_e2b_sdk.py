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
import time
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
    assert report["cwd"] == "/home/user\n"
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
            written = sandbox.files.write("/home/user/notes/hello.txt", "hi there\\n")
            sandbox.files.write("/home/user/notes/all.bin", bytes(range(256)))
            sandbox.files.write_files([
                {"path": "/home/user/many/a.txt", "data": "a"},
                {"path": "/home/user/many/b.txt", "data": b"b"},
            ])
            text = sandbox.files.read("/home/user/notes/hello.txt")
            binary = sandbox.files.read("/home/user/notes/all.bin", format="bytes")
            listing = sorted((e.name, e.type.value, e.size) for e in sandbox.files.list("/home/user/notes"))
            deep = sorted(e.path for e in sandbox.files.list("/home/user", depth=2))
            made = [sandbox.files.make_dir("/home/user/new/dir"), sandbox.files.make_dir("/home/user/new/dir")]
            renamed = sandbox.files.rename("/home/user/notes/hello.txt", "/home/user/new/dir/moved.txt")
            exists = [sandbox.files.exists(p) for p in ("/home/user/new/dir/moved.txt", "/home/user/notes/hello.txt")]
            seen_by_command = sandbox.commands.run("cat /home/user/new/dir/moved.txt /home/user/many/a.txt").stdout
            sandbox.commands.run("echo from-command > /home/user/cmd.txt")
            from_command = sandbox.files.read("/home/user/cmd.txt")
            signed_url = sandbox.download_url("/home/user/notes/all.bin", use_signature_expiration=120)
            signed_download = urllib.request.urlopen(signed_url).read() == bytes(range(256))
            upload_url = sandbox.upload_url("/home/user/signed/up.txt")
            signed_upload = httpx.post(upload_url, files={"file": ("up.txt", b"via signed url")}).status_code
            signed_uploaded = sandbox.files.read("/home/user/signed/up.txt")
            sandbox.files.remove("/home/user/new")
            try:
                sandbox.files.read("/home/user/new/dir/moved.txt")
                missing = None
            except FileNotFoundException as exc:
                missing = type(exc).__name__
            print(json.dumps({
                "written": [written.name, written.path],
                "text": text, "binary_ok": bytes(binary) == bytes(range(256)), "listing": listing, "deep": deep,
                "made": made, "renamed": [renamed.name, renamed.path, renamed.type.value], "exists": exists,
                "seen_by_command": seen_by_command, "from_command": from_command,
                "gone": sandbox.files.exists("/home/user/new"), "missing": missing,
                "signed": [signed_download, signed_upload, signed_uploaded],
            }))
        finally:
            sandbox.kill()
        """,
    )
    assert report["written"] == ["hello.txt", "/home/user/notes/hello.txt"]
    assert report["text"] == "hi there\n"
    assert report["binary_ok"] is True
    assert report["listing"] == [["all.bin", "file", 256], ["hello.txt", "file", 9]]
    assert {"/home/user/many", "/home/user/many/a.txt", "/home/user/notes/all.bin"} <= set(report["deep"])
    assert report["made"] == [True, False]
    assert report["renamed"] == ["moved.txt", "/home/user/new/dir/moved.txt", "file"]
    assert report["exists"] == [True, False]
    assert report["seen_by_command"] == "hi there\na"
    assert report["from_command"] == "from-command\n"
    assert (report["gone"], report["missing"]) == (False, "FileNotFoundException")
    assert report["signed"] == [True, 200, "via signed url"], "download_url/upload_url work without headers"


def test_entry_info_owner_symlinks_and_metadata(e2b_server: Server, tmp_path: Path) -> None:
    """get_info and list on a real gVisor workspace give what envd gives: owner and group names, permission string
    and bits, modification time, a symlink as its target's type with symlink_target resolved; write with metadata
    is reported by write, get_info, list and rename (envd 0.6.4 lets the SDK send it), and an overwrite clears it."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json
        from e2b import Sandbox

        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            def entry(info):
                return {
                    "name": info.name, "type": info.type.value if info.type else None, "path": info.path,
                    "size": info.size, "mode": info.mode, "permissions": info.permissions, "owner": info.owner,
                    "group": info.group, "mtime": int(info.modified_time.timestamp()),
                    "symlink_target": info.symlink_target, "metadata": info.metadata,
                }

            written = sandbox.files.write("/home/user/e/notes.txt", "twelve bytes", metadata={"Author": "mish"})
            sandbox.commands.run(
                "cd /home/user/e && mkdir sub && ln -s notes.txt link && ln -s sub dirlink && ln -s gone dead"
                " && chmod 640 notes.txt && chown nobody:nogroup sub",
                user="root",
            )
            seen = sandbox.commands.run(
                "cd /home/user/e && stat -c '%n %U %G %a %A %Y' notes.txt sub"
            ).stdout.splitlines()
            report = {
                "envd_version": sandbox.get_info().envd_version,
                "written": [written.path, written.metadata],
                "file": entry(sandbox.files.get_info("/home/user/e/notes.txt")),
                "dir": entry(sandbox.files.get_info("/home/user/e/sub")),
                "link": entry(sandbox.files.get_info("/home/user/e/link")),
                "dirlink": entry(sandbox.files.get_info("/home/user/e/dirlink")),
                "dead": entry(sandbox.files.get_info("/home/user/e/dead")),
                "listed": [entry(e) for e in sandbox.files.list("/home/user/e")],
                "stat": seen,
            }
            renamed = sandbox.files.rename("/home/user/e/notes.txt", "/home/user/e/renamed.txt")
            report["renamed"] = [renamed.path, renamed.metadata]
            report["overwritten"] = sandbox.files.write("/home/user/e/renamed.txt", "again").metadata
            report["after_overwrite"] = sandbox.files.get_info("/home/user/e/renamed.txt").metadata
            print(json.dumps(report))
        finally:
            sandbox.kill()
        """,
    )
    assert report["envd_version"] == "0.6.4"
    assert report["written"] == ["/home/user/e/notes.txt", {"author": "mish"}], "keys are lowercased, as envd does"
    file_stat, dir_stat = (line.split() for line in report["stat"][:2])
    assert file_stat[:5] == ["notes.txt", "user", "user", "640", "-rw-r-----"]
    assert dir_stat[:4] == ["sub", "nobody", "nogroup", "755"]
    assert report["file"] == {
        "name": "notes.txt", "type": "file", "path": "/home/user/e/notes.txt", "size": 12, "mode": 0o640,
        "permissions": "-rw-r-----", "owner": "user", "group": "user", "mtime": int(file_stat[5]),
        "symlink_target": None, "metadata": {"author": "mish"},
    }  # fmt: skip
    assert (report["dir"]["type"], report["dir"]["permissions"], report["dir"]["mode"]) == ("dir", "drwxr-xr-x", 0o755)
    assert (report["dir"]["owner"], report["dir"]["group"], report["dir"]["metadata"]) == ("nobody", "nogroup", None)
    link = report["link"]
    assert (link["type"], link["symlink_target"], link["mode"]) == ("file", "/home/user/e/notes.txt", 0o640)
    assert (link["permissions"], link["owner"], link["metadata"]) == ("Lrwxrwxrwx", "root", {"author": "mish"})
    assert (link["path"], link["size"]) == ("/home/user/e/link", len("notes.txt"))
    assert (report["dirlink"]["type"], report["dirlink"]["symlink_target"]) == ("dir", "/home/user/e/sub")
    assert (report["dead"]["type"], report["dead"]["symlink_target"]) == (None, "/home/user/e/dead")
    listed = {e["name"]: e for e in report["listed"]}
    assert sorted(listed) == ["dirlink", "link", "notes.txt", "sub"], "the SDK skips the dangling link (no type)"
    assert listed["notes.txt"] == report["file"]
    assert (listed["sub"]["owner"], listed["link"]["type"], listed["link"]["metadata"]) == (
        "nobody",
        "file",
        {"author": "mish"},
    )
    assert report["renamed"] == ["/home/user/e/renamed.txt", {"author": "mish"}]
    assert (report["overwritten"], report["after_overwrite"]) == (None, None)


def test_gzip_upload_and_download(e2b_server: Server, tmp_path: Path) -> None:
    """files.write and write_files with gzip=True, files.read with gzip=True in text, bytes and stream formats,
    sync and async: the bytes arrive intact on a real gVisor workspace."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import asyncio, hashlib, json, os
        from e2b import AsyncSandbox, Sandbox

        blob = os.urandom(300_000) + b"z" * 700_000
        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            sandbox.files.write("/home/user/g/blob.bin", blob, gzip=True)
            sandbox.files.write_files(
                [{"path": "/home/user/g/a.txt", "data": "alpha"}, {"path": "/home/user/g/b.txt", "data": b"beta"}],
                gzip=True,
            )
            streamed = b"".join(sandbox.files.read("/home/user/g/blob.bin", format="stream", gzip=True))
            report = {
                "sha_in_sandbox": sandbox.commands.run("sha256sum /home/user/g/blob.bin").stdout.split()[0],
                "sha": hashlib.sha256(blob).hexdigest(),
                "bytes": bytes(sandbox.files.read("/home/user/g/blob.bin", format="bytes", gzip=True)) == blob,
                "stream": streamed == blob,
                "text": [sandbox.files.read("/home/user/g/a.txt", gzip=True), sandbox.files.read("/home/user/g/b.txt")],
            }

            async def use_async():
                other = await AsyncSandbox.connect(sandbox.sandbox_id)
                await other.files.write("/home/user/g/async.txt", "async gzip", gzip=True)
                return await other.files.read("/home/user/g/async.txt", gzip=True)

            report["async"] = asyncio.run(use_async())
            print(json.dumps(report))
        finally:
            sandbox.kill()
        """,
    )
    assert report["sha_in_sandbox"] == report["sha"]
    assert (report["bytes"], report["stream"]) == (True, True)
    assert report["text"] == ["alpha", "beta"]
    assert report["async"] == "async gzip"


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
            sandbox.files.write("/home/user/state.txt", "kept across pause")
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
                "file": again.files.read("/home/user/state.txt"),
                "command": again.commands.run("cat /home/user/state.txt").stdout,
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
    SandboxNotFoundException (from the deadline on, while the kill may still run), and the workspace is destroyed."""
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
    deadline = time.monotonic() + 60
    while e2b_server.client.get(f"{API}/{report['id']}").json()["status"] != "destroyed":
        assert time.monotonic() < deadline, "the timed-out sandbox's workspace was never destroyed"
        time.sleep(0.1)


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
                await sandbox.files.write("/home/user/async.txt", "async ok")
                return {
                    "lines": [line for line, _ in seen], "stdout": result.stdout,
                    "first_ahead_s": finished - seen[0][1],
                    "file": await sandbox.files.read("/home/user/async.txt"),
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


def test_list_newest_first_with_filters_and_pages(e2b_server: Server, tmp_path: Path) -> None:
    """Sandbox.list and AsyncSandbox.list: newest first (order="asc" reverses), each SandboxQuery filter (metadata,
    state, started_after, template) narrows it, and the paginator walks every page through its next token."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import asyncio, json
        from e2b import AsyncSandbox, Sandbox, SandboxQuery, SandboxState

        def ids(paginator):
            found = []
            while paginator.has_next:
                found += [s.sandbox_id for s in paginator.next_items()]
            return found

        run = {"run": "list-" + __import__("uuid").uuid4().hex}
        made = [Sandbox.create(metadata={**run, "n": str(i)}, allow_internet_access=False) for i in range(3)]
        try:
            mine = SandboxQuery(metadata=run)
            info = [s.get_info() for s in made]
            made[1].pause()
            pages = Sandbox.list(query=mine, limit=1)
            first_page = [s.sandbox_id for s in pages.next_items()]

            async def async_ids():
                paginator = AsyncSandbox.list(query=mine, limit=2)
                found = []
                while paginator.has_next:
                    found += [s.sandbox_id for s in await paginator.next_items()]
                return found

            print(json.dumps({
                "made": [s.sandbox_id for s in made],
                "default": ids(Sandbox.list(query=mine)),
                "asc": ids(Sandbox.list(query=mine, order="asc")),
                "first_page": first_page, "next_token": bool(pages.next_token),
                "paged": first_page + ids(pages),
                "async_paged": asyncio.run(async_ids()),
                "one": ids(Sandbox.list(query=SandboxQuery(metadata={**run, "n": "2"}))),
                "paused": ids(Sandbox.list(query=SandboxQuery(metadata=run, state=[SandboxState.PAUSED]))),
                "running": ids(Sandbox.list(query=SandboxQuery(metadata=run, state=[SandboxState.RUNNING]))),
                "after": ids(Sandbox.list(query=SandboxQuery(metadata=run, started_after=info[1].started_at))),
                "base": ids(Sandbox.list(query=SandboxQuery(metadata=run, template="base"))),
                "other": ids(Sandbox.list(query=SandboxQuery(metadata=run, template="no-such-template"))),
            }))
        finally:
            for sandbox in made:
                sandbox.kill()
        """,
    )
    made = report["made"]
    newest_first = made[::-1]
    assert report["default"] == newest_first
    assert report["asc"] == made
    assert (report["first_page"], report["next_token"]) == ([made[2]], True)
    assert report["paged"] == report["async_paged"] == newest_first
    assert report["one"] == [made[2]]
    assert (report["paused"], report["running"]) == ([made[1]], [made[2], made[0]])
    assert report["after"] == [made[2], made[1]], "started_after includes a sandbox started at that moment"
    assert (report["base"], report["other"]) == (newest_first, [])


def test_kill_ends_commands_with_sandbox_not_running(e2b_server: Server, tmp_path: Path) -> None:
    """Killing a sandbox (from another handle) while a command runs: the command's wait() raises
    SandboxNotRunningException, because the SDK's health probe already finds the sandbox gone, and is_running() is
    False."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json, threading
        from e2b import Sandbox, SandboxNotRunningException

        sandbox = Sandbox.create(allow_internet_access=False)
        command = sandbox.commands.run("sleep 60", background=True, timeout=0)
        outcome = {}

        def wait():
            try:
                command.wait()
                outcome["wait"] = "finished"
            except Exception as exc:
                outcome["wait"] = type(exc).__name__
                outcome["message"] = str(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        killed = Sandbox.kill(sandbox.sandbox_id)
        waiter.join(60)
        try:
            sandbox.commands.run("true")
            after = "ran"
        except SandboxNotRunningException as exc:
            after = type(exc).__name__
        print(json.dumps({**outcome, "killed": killed, "running": sandbox.is_running(), "after": after}))
        """,
    )
    assert report["killed"] is True
    assert report["wait"] == "SandboxNotRunningException", report.get("message")
    assert (report["running"], report["after"]) == (False, "SandboxNotRunningException")


def test_timeout_is_enforced_on_time_and_set_timeout_extends(e2b_server: Server, tmp_path: Path) -> None:
    """set_timeout extends a sandbox past its first deadline, then shortens it: is_running() is True up to the new
    endAt and False from shortly after it (well under a second), and commands then raise SandboxNotRunningException
    and get_info SandboxNotFoundException."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json, time
        from datetime import datetime, timezone
        from e2b import Sandbox, SandboxNotFoundException, SandboxNotRunningException

        sandbox = Sandbox.create(timeout=4, allow_internet_access=False)
        try:
            first_end = sandbox.get_info().end_at.timestamp()
            sandbox.set_timeout(60)
            while time.time() < first_end + 1:
                time.sleep(0.1)
            extended = sandbox.is_running()
            sandbox.set_timeout(2)
            end_at = sandbox.get_info().end_at.timestamp()
            running_late, first_refused = [], None
            while time.time() < end_at + 20:
                asked = time.time()
                running = sandbox.is_running()
                if running:
                    running_late.append(asked - end_at)
                else:
                    first_refused = asked - end_at
                    break
                time.sleep(0.05)
            try:
                sandbox.commands.run("true")
                command = "ran"
            except SandboxNotRunningException as exc:
                command = type(exc).__name__
            try:
                Sandbox.get_info(sandbox.sandbox_id)
                info = "found"
            except SandboxNotFoundException as exc:
                info = type(exc).__name__
            print(json.dumps({
                "extended": extended, "latest_running": max(running_late, default=None),
                "first_refused": first_refused, "command": command, "info": info,
            }))
        finally:
            sandbox.kill()
        """,
    )
    assert report["extended"] is True, "set_timeout(60) kept it past its first deadline"
    assert report["latest_running"] is None or report["latest_running"] < 0.05, "it answered after its deadline"
    assert report["first_refused"] is not None, "it was never refused"
    assert report["first_refused"] < 1.0, "refused late: the deadline is enforced on time"
    assert (report["command"], report["info"]) == ("SandboxNotRunningException", "SandboxNotFoundException")


def test_on_timeout_pause_and_auto_resume(e2b_server: Server, tmp_path: Path) -> None:
    """lifecycle on_timeout="pause": at its timeout the sandbox pauses (state paused) instead of dying; with
    auto_resume a command then resumes it where it left off, without it a command raises SandboxNotRunningException
    until Sandbox.connect resumes it. get_info reports the lifecycle."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json, time
        from e2b import Sandbox, SandboxNotRunningException

        def paused(sandbox):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if Sandbox.get_info(sandbox.sandbox_id).state.value == "paused":
                    return True
                time.sleep(0.1)
            return False

        waking = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True},
                                allow_internet_access=False)
        sleeping = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"}, allow_internet_access=False)
        try:
            waking.files.write("/home/user/kept.txt", "kept")
            lifecycle = waking.get_info().lifecycle
            report = {"lifecycle": lifecycle, "paused": [paused(waking), paused(sleeping)]}
            report["woken"] = waking.commands.run("cat /home/user/kept.txt").stdout
            report["state_after"] = waking.get_info().state.value
            try:
                sleeping.commands.run("true")
                report["sleeping"] = "ran"
            except SandboxNotRunningException as exc:
                report["sleeping"] = type(exc).__name__
            report["connected"] = Sandbox.connect(sleeping.sandbox_id).commands.run("echo back").stdout
            print(json.dumps(report))
        finally:
            waking.kill()
            sleeping.kill()
        """,
    )
    assert report["lifecycle"] == {"on_timeout": "pause", "auto_resume": True}
    assert report["paused"] == [True, True]
    assert (report["woken"], report["state_after"]) == ("kept", "running")
    assert report["sleeping"] == "SandboxNotRunningException"
    assert report["connected"] == "back\n"


def test_sdk_raises_its_own_exceptions(e2b_server: Server, tmp_path: Path) -> None:
    """Errors reach the SDK in E2B's shape, so it raises its own exceptions (never KeyError): unknown sandboxes,
    a bad API key, a bad next token, a timeout over 24 h and the MCP gateway."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json
        from e2b import AsyncSandbox, AuthenticationException, Sandbox, SandboxException, SandboxNotFoundException

        def outcome(call):
            try:
                return ["ok", call()]
            except Exception as exc:
                return [type(exc).__name__, str(exc), isinstance(exc, SandboxException)]

        import asyncio
        print(json.dumps({
            "get_info": outcome(lambda: Sandbox.get_info("nosuchsandbox")),
            "connect": outcome(lambda: Sandbox.connect("nosuchsandbox")),
            "set_timeout": outcome(lambda: Sandbox.set_timeout("nosuchsandbox", 30)),
            "kill": outcome(lambda: Sandbox.kill("nosuchsandbox")),
            "async_info": outcome(lambda: asyncio.run(AsyncSandbox.get_info("nosuchsandbox"))),
            "bad_key": outcome(lambda: Sandbox.list(api_key="wrong-key").next_items()),
            "bad_token": outcome(lambda: Sandbox.list(next_token="not-a-token").next_items()),
            "too_long": outcome(lambda: Sandbox.create(timeout=25 * 3600)),
            "mcp": outcome(lambda: Sandbox.create(mcp={"exa": {"apiKey": "k"}})),
        }))
        """,
    )
    for call in ("get_info", "connect", "set_timeout", "async_info"):
        assert report[call][0] == "SandboxNotFoundException", report[call]
    assert report["kill"] == ["ok", False]
    assert report["bad_key"][0] == "AuthenticationException"
    assert report["bad_token"][0] == "SandboxException" and "Invalid next token" in report["bad_token"][1]
    assert report["too_long"][0] == "SandboxException" and "cannot be greater than 24 hours" in report["too_long"][1]
    # The MCP gateway pulls server images from registries: refused, saying why and what to do instead.
    assert report["mcp"][0] == "SandboxException" and "never pulls from registries" in report["mcp"][1]
