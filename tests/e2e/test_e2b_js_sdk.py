"""The unmodified E2B JavaScript SDK (npm ``e2b``, pinned in ``tests/e2e/js/package-lock.json``) against a real Corral
server on gVisor, run with the machine's ``node``.

``tests/e2e/js/sdk_script.mjs`` does with the JS SDK what ``test_e2b_sdk.py``, ``test_e2b_pty.py``,
``test_e2b_watch.py``, ``test_e2b_ports.py`` and ``test_e2b_stateful.py`` do with the Python SDK, configured only by
``E2B_API_URL``, ``E2B_SANDBOX_URL`` and ``E2B_API_KEY``; it prints one JSON summary, which this test checks.
``make bootstrap`` installs the SDK (``npm ci``); without ``node`` or the installed SDK the test skips, which
``tests/conftest.py`` turns into a failure under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import TOKEN, Server, docker_inspect, start_server, stop_server

pytestmark = pytest.mark.e2e

JS_DIR = Path(__file__).parent / "js"
DOMAIN = "corral.test"


@pytest.fixture(scope="module", name="node")
def node_fixture() -> str:
    """The ``node`` to run the script with; skips (a failure under CI) when it or the installed SDK is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; run `make bootstrap` (it installs Debian's nodejs and npm)")
    if not (JS_DIR / "node_modules" / "e2b" / "package.json").is_file():
        pytest.skip(f"the E2B JS SDK is not installed in {JS_DIR}/node_modules; run `make bootstrap` (npm ci)")
    return node


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on gVisor with a preview domain; skips (a failure under CI) without Docker or the base image."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    env = {"CORRAL_PROVIDERS": "gvisor", "CORRAL_SANDBOX_DOMAIN": DOMAIN}
    server = start_server(tmp_path_factory.mktemp("corral-e2b-js"), env)
    try:
        yield server
    finally:
        stop_server(server)


def _run_script(server: Server, node: str) -> dict[str, Any]:
    """Run sdk_script.mjs with only the E2B_* variables pointing at ``server``; its last stdout line is the summary."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {
        "E2B_API_URL": f"{server.url}/e2b",
        "E2B_SANDBOX_URL": f"{server.url}/e2b/envd",
        "E2B_API_KEY": TOKEN,
    }
    proc = subprocess.run(
        [node, "sdk_script.mjs"], env=env, cwd=JS_DIR, capture_output=True, text=True, timeout=400, check=False
    )
    assert proc.returncode == 0, f"the JS script failed:\n{proc.stderr}\n--- server log ---\n{server.log()[-5000:]}"
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return summary


def test_the_js_sdk_runs_the_e2b_script(node: str, e2b_server: Server) -> None:
    """The JS SDK's create, commands (output, exit codes, envs, cwd, user, stdin, background, kill), files (~ paths,
    gzip, metadata, symlinks, signed URLs), PTY, watchDir, getHost, getInfo, setTimeout, list, metrics, connect,
    snapshots, fork, pause and kill all behave as the Python SDK's tests expect, and leave nothing behind."""
    summary = _run_script(e2b_server, node)

    commands = summary["commands"]
    assert commands["stdout"] == "hello m-1\n/home/user\nuser\n"  # create's envs, run's envs, E2B's home and user
    assert commands["streamed"] == commands["stdout"]
    assert (commands["stderr"], commands["exitCode"]) == ("oops\n", 0)
    assert commands["cwd"] == "/tmp"
    assert commands["root"] == ["root", "/root"]
    assert commands["failure"] == {"exitCode": 3, "stdout": "partial\n", "class": "CommandExitError"}
    assert commands["background"] == {"listed": True, "killed": True, "exitCode": -1, "killAgain": False}
    assert commands["stdin"] == {"stdout": "typed into stdin\n", "exitCode": 0, "joinedExit": 0}

    files = summary["files"]
    assert files["written"] == {"name": "hello.txt", "path": "/home/user/notes/hello.txt", "type": "file"}
    assert files["text"] == files["bytes"] == files["downloaded"] == "hello from js"
    assert files["info"] == {
        "name": "hello.txt", "type": "file", "path": "/home/user/notes/hello.txt", "size": 13, "owner": "user",
        "group": "user", "permissions": "-rw-r--r--", "modified": True,
    }  # fmt: skip
    assert (files["made"], files["madeAgain"]) == (True, False)
    assert files["listing"] == ["a.txt:file", "b.bin:file", "hello.txt:file", "sub:dir"]
    assert "/home/user/notes/sub/deeper" in files["deep"]
    assert (files["exists"], files["existsAfter"], files["missing"]) == (True, False, "FileNotFoundError")
    assert files["gzip"] == {"written": {"origin": "js"}, "length": 5000, "metadata": {"origin": "js"}}
    assert files["symlink"] == {"type": "file", "target": "/home/user/notes/z.txt"}
    assert (files["renamed"], files["binary"]) == ("/home/user/notes/c.bin", [0, 1, 2, 255])

    pty = summary["pty"]
    assert pty == {"pwd": True, "exitCode": 3, "joinedExit": 3, "kill": True, "killedExit": -1, "killAgain": False}

    seen = [tuple(event) for event in summary["watch"]["seen"]]
    for expected in [("a.txt", "create"), ("a.txt", "write"), ("a.txt", "chmod"), ("a.txt", "rename"),
                     ("b.txt", "create"), ("b.txt", "remove"), ("sub", "create"), ("sub/f.txt", "create")]:  # fmt: skip
        assert expected in seen, f"{expected} missing from {seen}"
    assert summary["watch"]["missing"] == "NotFoundError"

    assert summary["host"] == {"name": f"3000-{summary['sandboxId']}.{DOMAIN}", "body": "hello from port 3000"}

    lifecycle = summary["lifecycle"]
    assert lifecycle["info"] == {
        "sandboxId": summary["sandboxId"], "templateId": "base", "metadata": {"team": "corral"}, "state": "running",
    }  # fmt: skip
    assert (lifecycle["listed"], lifecycle["running"], lifecycle["viaConnect"]) == (True, True, "connected")
    assert lifecycle["timeoutSet"] is True  # setTimeout(600_000) moved getInfo's endAt to about 600 s from now
    metrics = lifecycle["metrics"]
    assert metrics["count"] >= 1 and metrics["cpuCount"] >= 1
    assert (metrics["memTotal"], metrics["diskTotal"], metrics["timestamp"]) == (True, True, True)

    assert summary["snapshot"] == {
        "id": True, "restored": "before the snapshot", "original": "alive", "listed": True, "deleted": True,
        "deletedAgain": False,
    }  # fmt: skip
    assert summary["fork"] == {"count": 2, "errors": [], "read": ["from the parent"] * 2, "distinct": 2}
    # Paused, the JS SDK reports envd's 502 as SandboxNotFoundError ("Sandbox is probably not running anymore").
    assert summary["pause"] == {
        "paused": True, "state": "paused", "whilePaused": "SandboxNotFoundError", "countsOn": True,
        "stateAfter": "running",
    }  # fmt: skip

    assert (summary["kill"], summary["killAgain"], summary["runningAfterKill"]) == (True, False, False)
    assert e2b_server.client.get("/api/v1/agent/workspaces").json()["workspaces"] == []
    assert e2b_server.client.get("/api/v1/agent/snapshots").json().get("snapshots", []) == []
    assert docker_inspect("container", f"corral-{summary['sandboxId']}") is None
