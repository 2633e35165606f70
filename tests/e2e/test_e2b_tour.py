"""The issue's "done when" for E2B parity: one unmodified E2B program (examples/e2b/tour.py, the same program with the
async client in tour_async.py and with the JavaScript SDK in tour.mjs) runs to the end against a real Corral server
with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set (and the server's preview domain): a sandbox, a PTY typed
into, a directory watch, HTTP on port 3000 through get_host, one address denied and another allowed, a template built
from the local base, a snapshot, a fork and metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import TOKEN, Server, serving_e2b

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "tour.corral.test"
JS_MODULES = Path(__file__).parent / "js" / "node_modules"


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on gVisor with a preview domain; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-tour", {"CORRAL_SANDBOX_DOMAIN": DOMAIN}) as server:
        yield server


def _run(command: list[str], server: Server, tmp_path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "CORRAL_"))}
    env |= {"E2B_API_URL": f"{server.url}/e2b", "E2B_SANDBOX_URL": f"{server.url}/e2b/envd", "E2B_API_KEY": TOKEN}
    proc = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"{command} failed:\n{proc.stderr}\n--- server log ---\n{server.log()[-5000:]}"
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def _check(report: dict[str, Any], server: Server) -> None:
    assert str(report["network"]["denied"]).startswith("failed"), report
    assert report["network"]["allowed"] == "server-1", report
    assert report["pty"] is True, report
    assert ["note.txt", "write"] in report["watch"], report
    assert report["preview"] == "hello from port 3000", report
    assert report["template"] == "built-by-tour", report
    assert report["snapshot"] == "before the snapshot", report
    assert report["fork"] == ["changed in the fork", "before the snapshot"], report
    assert report["metrics"]["samples"] >= 1 and report["metrics"]["memory_total"] is True, report
    listed = server.client.get("/api/v1/agent/workspaces").json()["workspaces"]
    assert listed == [], f"the tour left workspaces behind: {listed}"


def test_the_python_tour_runs_to_the_end(e2b_server: Server, tmp_path: Path) -> None:
    """examples/e2b/tour.py (the sync client) runs to the end and sees every feature work."""
    _check(_run([sys.executable, str(ROOT / "examples/e2b/tour.py")], e2b_server, tmp_path), e2b_server)


def test_the_async_python_tour_runs_to_the_end(e2b_server: Server, tmp_path: Path) -> None:
    """examples/e2b/tour_async.py (AsyncSandbox, AsyncTemplate) runs to the end and sees every feature work."""
    _check(_run([sys.executable, str(ROOT / "examples/e2b/tour_async.py")], e2b_server, tmp_path), e2b_server)


def test_the_js_tour_runs_to_the_end(e2b_server: Server, tmp_path: Path) -> None:
    """examples/e2b/tour.mjs (the JS SDK, copied next to an installed node_modules) runs to the end and sees every
    feature work; without node or the SDK it skips, which is a failure under CI."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; run `make bootstrap` (it installs Debian's nodejs and npm)")
    if not (JS_MODULES / "e2b" / "package.json").is_file():
        pytest.skip(f"the E2B JS SDK is not installed in {JS_MODULES}; run `make bootstrap` (npm ci)")
    # ES modules resolve 'e2b' next to the file (NODE_PATH does not apply): run a copy beside the installed SDK.
    shutil.copy(ROOT / "examples/e2b/tour.mjs", tmp_path / "tour.mjs")
    (tmp_path / "node_modules").symlink_to(JS_MODULES, target_is_directory=True)
    _check(_run([node, "tour.mjs"], e2b_server, tmp_path), e2b_server)
